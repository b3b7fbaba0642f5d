"""A SWARM-style team: a coordinator spawns agents that share one context and hand off work.

The coordinator prefills the team's context once into the run-scoped KV file
``run/team-<name>`` and pins it (memory pressure never evicts it, unless the plan's pinned share
is used up). A ``run/`` file belongs to this run tree: every run of the tree opens it by that
name, and the worker removes it when the tree ends, however it ends (finished, failed, cancelled,
past its deadline), so no ``finally: kv_remove`` is needed and none could be skipped. Each agent
is a child run (``spawn``) that opens that file read-only (a private copy-on-write fork: the
context is never computed again) and prefills only its own turn. The team talks through the
run tree's channels: the coordinator queues one task per round on ``tasks`` (whichever agent is
free takes it: the hand-off), the agent answers on ``answers`` and broadcasts on ``handoff``
that it took the round, which every agent hears through its subscription. When the rounds are
done the coordinator closes ``tasks``; agents see ``ChannelClosed`` and return. No wait names
a number of seconds: each is bounded by the run's deadline (the plan's default, or
``limits.deadline_s``), and a coordinator whose agents all ended gets ``SendersGone`` from
``recv`` at once instead of waiting for it.

The plan bounds the team: agents are runs of the tenant (its concurrent runs, children per run),
so the coordinator starts as many as it may and says so when that is fewer than asked.

Example args: {"team": "demo", "context": "Our product is a tea kettle that whistles.", "agents": 3, "rounds": 3}

args: ``{"team": str, "context": str, "agents": int = 3, "rounds": int = 2, "max_tokens": int = 16}``
result: ``{"rounds": [{"round", "agent", "answer"}], "agents": [{"id", "role", "served", "heard",
"context_tokens"}]}``
"""

import symphony as sy

ROLES = ("researcher", "critic", "writer", "planner", "tester", "editor")


def shared_context(team, text):
    """The team's pinned context file (built here once; agents open it read-only; removed
    with the run tree)."""
    name = f"run/team-{team}"
    kv = sy.kv_create(name)
    sy.release(sy.pred(kv, sy.tokenize(f"Team briefing: {text}\n")))
    try:
        sy.kv_pin(name)
    except sy.QuotaExceeded:  # no pinned share left: keep it unpinned (it may spill, never wrong)
        pass
    kv.close()  # a named file outlives its handle (a run/ one until the tree ends)
    return name


def main(args):
    agents, rounds = int(args.get("agents", 3)), int(args.get("rounds", 2))
    context = shared_context(args["team"], args["context"])
    brief = {"context": context, "max_tokens": int(args.get("max_tokens", 16))}
    children = []
    for i in range(agents):
        try:
            children.append(sy.spawn("self:agent", {**brief, "role": ROLES[i % len(ROLES)]}))
        except sy.QuotaExceeded as exc:  # the plan's concurrent runs or children per run
            if not children:
                raise
            sy.send_to_user(f"[coordinator] {len(children)} of {agents} agents: {exc}\n")
            break
    tasks, answers = sy.channel("tasks"), sy.channel("answers")
    log = []
    for r in range(rounds):
        tasks.send({"round": r, "ask": f"Round {r + 1}: what should the team do next?"})
        # No timeout: the run's deadline (the plan's, or limits.deadline_s) bounds the wait, and
        # SendersGone ends it at once, naming their errors, if every agent ended first.
        reply = answers.recv()
        log.append({"round": r, "agent": reply["role"], "answer": reply["answer"]})
        sy.send_to_user(f"[{reply['role']}] {reply['answer']}\n")
    tasks.close()  # agents waiting on it get ChannelClosed and return
    return {"rounds": log, "agents": [c.wait() for c in children]}


def agent(args):
    """One agent: takes tasks until the coordinator closes the queue, answers from the shared
    context plus its own turn, and tells the others who spoke (the ``handoff`` broadcast)."""
    role = args["role"]
    context = sy.kv_open(args["context"], "r")
    handoffs = sy.channel("handoff").subscribe()
    served = []
    while True:
        try:
            task = sy.channel("tasks").recv()  # until a task comes, the queue closes or the deadline
        except sy.ChannelClosed:
            break
        kv = context.fork()
        prompt = sy.tokenize(f"As the {role}: {task['ask']}\nAnswer:")
        answer = sy.detokenize(sy.generate(kv, prompt, max_tokens=args["max_tokens"])).strip()
        kv.close()
        sy.channel("handoff").publish({"round": task["round"], "by": role})
        sy.channel("answers").send({"round": task["round"], "role": role, "answer": answer})
        served.append(task["round"])
    heard = []
    while True:  # what the others said they did (published while this agent listened)
        try:
            heard.append(handoffs.recv(timeout=0)["by"])
        except (sy.ChannelTimeout, sy.ChannelClosed):
            break
    handoffs.close()
    me = sy.session().info.run_id
    return {"id": me, "role": role, "served": served, "heard": heard, "context_tokens": len(context)}
