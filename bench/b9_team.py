"""B9's LIP: one SWARM team as a run tree (uploaded as a program by ``bench/b9_swarm.py``).

The shape of ``examples/swarm.py`` with every length fixed, so both sides of the benchmark
compute the same tokens whatever the model says: token ids in, greedy replies of exactly
``reply_tokens`` tokens (EOS ignored), no tokenizer on the path.

* ``main`` (the coordinator) prefills the shared context once into the named KV file
  ``args["file"]`` and pins it (an idle unpinned file is what the worker spills first under
  page pressure, and every agent would then load a copy back), spawns one child run per agent,
  then for each round sends every agent its message on the agent's own channel
  (``to-<agent>``) and collects one reply per agent on ``replies``; the round's replies are in
  before the next round's messages go out (the coordinator's barrier, as a client loop has
  one). It removes the file at the end: each team of a repetition has fresh tokens and a file
  of its own.
* ``agent`` opens the file read-only and forks it (a private copy-on-write handle: the context
  is never computed again), then per round appends its message and decodes its reply on that
  fork, so its history (context, its messages, its replies) stays in KV between rounds.

args (coordinator): ``{"file": str, "context": [ids], "messages": [[[ids] per agent] per round],
"reply_tokens": int}``; result: ``{"replies": [[[ids] per agent] per round], "agents": [...]}``.
"""

import symphony as sy

#: Seconds an agent waits for its next message, and the coordinator for a child's end (the
#: run's own deadline bounds them too).
WAIT_S = 600


def main(args):
    name, rounds = args["file"], args["messages"]
    agents = len(rounds[0])
    kv = sy.kv_create(name)
    sy.release(sy.pred(kv, args["context"]))
    sy.kv_pin(name)
    kv.close()  # a named file outlives its handle
    brief = {"file": name, "rounds": len(rounds), "reply_tokens": int(args["reply_tokens"])}
    children = [sy.spawn("self:agent", {**brief, "agent": a}) for a in range(agents)]
    inbox = [sy.channel(f"to-{a}") for a in range(agents)]
    replies = sy.channel("replies")
    log = []
    for r, messages in enumerate(rounds):
        for a, message in enumerate(messages):
            inbox[a].send({"round": r, "tokens": message})
        got = collect(replies, children, agents)
        by_agent = {m["agent"]: m["tokens"] for m in got if m["round"] == r}
        if len(by_agent) != agents:
            raise RuntimeError(f"round {r}: replies from agents {sorted(by_agent)} of {agents}")
        log.append([by_agent[a] for a in range(agents)])
    done = [c.wait(timeout=WAIT_S) for c in children]
    sy.kv_remove(name)
    return {"replies": log, "agents": done}


def collect(replies, children, n):
    """``n`` replies; between them, a child that failed fails the team at once (ChildFailed)
    instead of leaving the coordinator waiting for a reply that will never come."""
    got = []
    while len(got) < n:
        try:
            got.append(replies.recv(timeout=5))
        except sy.ChannelTimeout:
            for child in children:
                try:
                    child.wait(timeout=0)
                except sy.DeadlineExceeded:
                    pass  # still running
    return got


def agent(args):
    a, reply_tokens = args["agent"], args["reply_tokens"]
    shared = sy.kv_open(args["file"], "r")
    mine = shared.fork()
    context_tokens = len(shared)
    shared.close()
    inbox, replies = sy.channel(f"to-{a}"), sy.channel("replies")
    for _ in range(args["rounds"]):
        message = inbox.recv(timeout=WAIT_S)
        reply = sy.generate(mine, message["tokens"], max_tokens=reply_tokens, stop=[])
        replies.send({"round": message["round"], "agent": a, "tokens": reply})
    history = len(mine)
    mine.close()
    return {"agent": a, "context_tokens": context_tokens, "history_tokens": history}
