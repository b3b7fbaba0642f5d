"""The ``symphony`` SDK against a real worker process over its real session socket (no sandbox:
the SDK is plain Python, so the host can import it and exercise the protocol quickly)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path

import pytest
import torch

import symphony as sy
from gpu_worker import protocol
from symphony import aio

pytestmark = [pytest.mark.integration, pytest.mark.vllm, pytest.mark.timeout(180)]

PROMPT = "The capital of France is a city where"


@pytest.fixture(scope="module")
def hf_model(tiny_model_dir: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32).eval()


def hf_greedy(model, ids: list[int], n: int) -> tuple[list[int], list[float]]:
    """Greedy decoding with full-sequence forwards; also the top-2 logit margin per step."""
    toks, out, margins = list(ids), [], []
    with torch.no_grad():
        for _ in range(n):
            logits = model(torch.tensor([toks])).logits[0, -1]
            top = torch.topk(logits, 2).values
            margins.append(float(top[0] - top[1]))
            nxt = int(logits.argmax())
            out.append(nxt)
            toks.append(nxt)
    return out, margins


def test_hello_reports_session_and_model(session, gpu_worker_process) -> None:
    info = session.info
    assert info.session_id.startswith("s-")
    assert info.vocab_size == 49152
    vocab = session.vocab_info()
    assert vocab.vocab_size == info.vocab_size and vocab.eos_token_ids == info.eos_token_ids


def test_greedy_generation_matches_transformers(session, hf_model) -> None:
    ids = session.tokenize(PROMPT)
    kv = session.kv_create()
    got = session.generate(kv, ids, max_tokens=12, stop=[])
    want, margins = hf_greedy(hf_model, ids, 12)
    # Where transformers' top-2 logits are closer than float noise, either choice is greedy.
    first_diff = next((i for i, (a, b) in enumerate(zip(got, want, strict=True)) if a != b), None)
    assert first_diff is None or margins[first_diff] < 1e-4, (got, want, margins)
    assert len(kv) == len(ids) + 12
    assert session.kv_tokens(kv) == ids + got


def test_dist_operations_agree_with_each_other(session) -> None:
    kv = session.kv_create()
    ids = session.tokenize(PROMPT)
    d0, d1 = session.pred(kv, ids, positions=[0, -1])
    top = d1.topk(5)
    assert len(top.ids) == 5 and list(top.logprobs) == sorted(top.logprobs, reverse=True)
    assert d1.argmax() == top.ids[0]
    assert d1.sample(temperature=0) == top.ids[0]
    assert d1.logprob([top.ids[0]])[0] == pytest.approx(top.logprobs[0], abs=1e-5)
    full = d1.full()
    assert len(full) == session.info.vocab_size
    assert full[top.ids[0]] == pytest.approx(top.logprobs[0], abs=1e-2)
    # A mask restricts the choice; a bias moves it.
    assert d1.argmax(mask=[top.ids[3], top.ids[4]]) == top.ids[3]
    assert d1.argmax(bias={top.ids[2]: 100.0}) == top.ids[2]
    # Seeded sampling is reproducible.
    assert d1.sample(temperature=1.0, seed=7) == d1.sample(temperature=1.0, seed=7)
    d0.release()
    with pytest.raises(sy.SymphonyError):
        d0.argmax()  # released


def test_fused_choice_agrees_with_the_dist_path_and_a_failed_choice_is_metered(gpu_worker_process) -> None:
    """``pred_token`` picks on the worker's engine thread; a Dist op picks on its event loop.
    Both must give the same token, and a choice that cannot be made (a finished grammar state)
    fails that call alone while its forward still counts."""
    info = gpu_worker_process.create_session()
    s = sy.connect(info.socket_path, info.token)
    try:
        ids = s.tokenize(PROMPT)
        ref, fused = s.kv_create(), s.kv_create()
        (dist,) = s.pred(ref, ids)
        top = dist.topk(3)
        assert s.pred_token(fused, ids) == top.ids[0]
        fused.truncate(len(ids) - 1)
        assert s.pred_token(fused, ids[-1:], temperature=1.0, seed=11) == dist.sample(temperature=1.0, seed=11)
        fused.truncate(len(ids) - 1)
        assert s.pred_token(fused, ids[-1:], mask=[top.ids[2]]) == top.ids[2]
        fused.truncate(len(ids) - 1)
        done = s.grammar(regex="a").state()
        assert done.advance(s.tokenize("a")[0]) and done.advance(s.info.eos_token_ids[0]) and done.finished
        with pytest.raises(sy.InvalidArgument, match="grammar state is finished"):
            s.pred_token(fused, ids[-1:], temperature=1.0, mask=done)
        assert len(fused) == len(ids), "the forward ran; only the choice failed"
        assert s.pred_token(fused, [top.ids[0]]) >= 0, "the session goes on after a failed choice"
    finally:
        s.close()
        usage = gpu_worker_process.end_session(info.session_id).usage
    assert usage["pred_calls"] == 6


def test_threads_keep_many_calls_in_flight_on_one_connection(session, gpu_worker_process) -> None:
    """Eight threads decode forks of one prefix at once; each gets its own correct answer."""
    ids = session.tokenize(PROMPT)
    root = session.kv_create()
    session.pred(root, ids[:-1])[0].release()
    suffixes = [session.tokenize(f" number {i}") for i in range(8)]
    results: dict[int, list[int]] = {}
    errors: list[BaseException] = []
    before = gpu_worker_process.admin.stats()["scheduler"]["multi_session_forwards"]

    def branch(i: int) -> None:
        try:
            kv = session.kv_fork(root)
            results[i] = session.generate(kv, ids[-1:] + suffixes[i], max_tokens=6, stop=[])
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=branch, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    stats = gpu_worker_process.admin.stats()["scheduler"]
    assert stats["multi_session_forwards"] >= before  # counter sanity
    # Same answers as decoding each branch alone from scratch.
    for i in range(8):
        kv = session.kv_create()
        assert session.generate(kv, ids + suffixes[i], max_tokens=6, stop=[]) == results[i]


def test_pred_token_many_steps_files_in_lock_step_like_one_by_one(session, gpu_worker_process) -> None:
    """Four prompts decoded together, one write per step, give what each gives alone, and the
    calls of a step are batched into shared forwards."""
    prompts = [session.tokenize(f"{PROMPT} {word}") for word in ("Paris", "and", "the river", "1")]
    kvs = [session.kv_create() for _ in prompts]
    # A tenant served in the last second (the previous test's) still counts as contending, and
    # the scheduler then caps this one's seats per forward (SchedulerConfig.contended_seats_per_tenant).
    time.sleep(1.1)
    before = gpu_worker_process.admin.stats()["scheduler"]
    toks = session.pred_token_many(list(zip(kvs, prompts, strict=True)))
    out = [[t] for t in toks]
    for _ in range(5):
        toks = session.pred_token_many([(kv, [t]) for kv, t in zip(kvs, toks, strict=True)])
        for o, t in zip(out, toks, strict=True):
            o.append(t)
    after = gpu_worker_process.admin.stats()["scheduler"]
    assert after["forwards"] - before["forwards"] < 6 * len(prompts)  # not one forward per call
    for ids, got, kv in zip(prompts, out, kvs, strict=True):
        assert session.kv_tokens(kv) == ids + got[:-1]
        assert session.generate(session.kv_create(), ids, max_tokens=6, stop=[]) == got


def test_pred_token_many_raises_a_failed_call_after_the_others_landed(session) -> None:
    ids = session.tokenize(PROMPT)
    good, gone = session.kv_create(), session.kv_create()
    session.kv_close(gone)
    with pytest.raises(sy.KVNotFound):
        session.pred_token_many([(good, ids), (gone, ids)])
    assert session.kv_tokens(good) == ids  # the good file's step was not lost


def test_many_in_flight_calls_resolve_to_their_own_replies(session) -> None:
    """Replies are routed by id: 64 concurrent tokenize calls each get their own text back."""
    texts = [f"item {i} " * (i % 5 + 1) for i in range(64)]
    futures = [session.conn.submit("tokenize", {"text": t}) for t in texts]
    for t, f in zip(texts, futures, strict=True):
        assert session.detokenize(f.result(30)) == t


def test_kv_edit_operations(session) -> None:
    ids = session.tokenize("one two three four five six seven eight")
    kv = session.kv_create()
    session.release(session.pred(kv, ids))
    assert len(kv) == len(ids)
    part = kv.extract(0, 4)
    assert session.kv_tokens(part) == ids[:4]
    fork = kv.fork()
    fork.truncate(3)
    assert len(fork) == 3 and len(kv) == len(ids)
    merged = session.kv_merge(part, fork)
    assert session.kv_tokens(merged) == ids[:4] + ids[:3]
    for h in (part, fork, merged, kv):
        h.close()
    with pytest.raises(sy.KVNotFound):
        session.kv_len(kv)


def test_named_files_persist_and_errors_map_to_exceptions(session, gpu_worker_process) -> None:
    name = f"sdk-{time.monotonic_ns()}"
    kv = session.kv_create(name)
    session.release(session.pred(kv, session.tokenize("persistent prefix")))
    with pytest.raises(sy.KVExists):
        session.kv_create(name)
    kv.close()
    session.kv_pin(name)
    reader = session.kv_open(name, "r")
    assert len(reader) == len(session.tokenize("persistent prefix"))
    reader.close()
    listed = {f["name"]: f for f in gpu_worker_process.admin.kv_list()}
    assert listed[name]["pinned"] is True
    session.kv_remove(name)
    with pytest.raises(sy.KVNotFound):
        session.kv_open(name)
    with pytest.raises(sy.InvalidArgument):
        session.kv_create("../escape")
    with pytest.raises(sy.KVNotFound):
        session.kv_fork(123456789)  # a forged handle looks like a missing one
    with pytest.raises(sy.PermissionDenied):
        session.http_fetch("http://127.0.0.1:9/")  # not on this run's allowlist
    with pytest.raises(sy.InvalidArgument):
        session.pred(session.kv_create(), [session.info.vocab_size + 5])
    with pytest.raises(sy.KVNotFound):
        session.pred(123456789, [1, 2])  # checked by the scheduler when it plans the call


def test_a_pred_past_max_model_len_is_refused_whole(session) -> None:
    """The worker runs with --max-model-len 2048: a prompt that would overflow the file fails
    with NoSpace and leaves the file as it was (the scheduler checks the whole call)."""
    kv = session.kv_create()
    session.release(session.pred(kv, [5] * 100))
    with pytest.raises(sy.NoSpace, match="2050 tokens > 2048"):
        session.pred(kv, [6] * 1950)
    assert len(kv) == 100
    session.release(session.pred(kv, [7] * 1948))
    assert len(kv) == 2048


def test_quota_exceeded_is_its_own_exception(gpu_worker_process) -> None:
    with gpu_worker_process.session(max_tokens=8) as info:
        s = sy.connect(info.socket_path, info.token)
        kv = s.kv_create()
        with pytest.raises(sy.QuotaExceeded):
            s.pred(kv, list(range(100, 120)))
        s.close()


def test_wrong_token_is_refused(gpu_worker_process) -> None:
    with gpu_worker_process.session() as info:
        with pytest.raises(sy.NotAuthenticated):
            sy.connect(info.socket_path, "not-the-token")


def test_grammar_constrains_output_to_the_schema(session) -> None:
    schema = {
        "type": "object",
        "properties": {"ok": {"type": "boolean"}, "n": {"type": "string", "enum": ["a", "b"]}},
        "required": ["ok", "n"],
        "additionalProperties": False,
    }
    g = session.grammar(schema)
    for seed in range(3):
        kv = session.kv_create()
        out = session.generate(kv, session.tokenize("JSON:"), 64, grammar=g, temperature=1.0, seed=seed)
        value = json.loads(session.detokenize(out))
        assert set(value) == {"ok", "n"} and isinstance(value["ok"], bool) and value["n"] in ("a", "b")
    with pytest.raises(sy.InvalidArgument):
        session.grammar(regex="(unclosed")


def test_generate_with_a_grammar_ends_at_its_eos_even_when_eos_is_not_a_stop(session) -> None:
    """With ``stop=[]`` the grammar's EOS is part of the output and still ends it: generate
    knows the state is finished without asking (the worker advanced it)."""
    g = session.grammar(regex="(yes|no)")
    out = session.generate(session.kv_create(), session.tokenize("Answer yes or no:"), 16, grammar=g, stop=[])
    assert out[-1] in session.info.eos_token_ids and session.detokenize(out[:-1]) in ("yes", "no"), out


def test_an_advancing_grammar_state_is_advanced_by_the_worker(session) -> None:
    """``mask=state.advancing()`` picks the same tokens as advancing by hand, in one round trip
    a token: the worker feeds each chosen token to the matcher, so once EOS is chosen the state
    is finished and refuses another choice."""
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    g = session.grammar(schema)
    eos = set(session.info.eos_token_ids)
    prompt = session.tokenize("JSON:")

    def decode(fused: bool) -> tuple[list[int], sy.GrammarState, sy.KV]:
        kv, state, pending, out = session.kv_create(), g.state(), prompt, []
        for _ in range(48):
            tok = session.pred_token(kv, pending, mask=state.advancing() if fused else state)
            out.append(tok)
            if not fused:
                state.advance(tok)
            if tok in eos:
                return out, state, kv
            pending = [tok]
        raise AssertionError(f"no EOS in 48 tokens: {session.detokenize(out)!r}")

    by_hand, _, _ = decode(fused=False)
    fused, state, kv = decode(fused=True)
    assert fused == by_hand
    assert isinstance(json.loads(session.detokenize(fused[:-1]))["ok"], bool)
    with pytest.raises(sy.InvalidArgument, match="finished"):
        session.pred_token(kv, [fused[-1]], mask=state.advancing())
    with pytest.raises(sy.InvalidArgument, match="advance needs a grammar state"):
        session.conn.call("pred", {"kv": kv.id, "tokens": [5], "then": {"argmax": {"mask": [5], "advance": True}}})


def test_send_to_user_and_sleep(session) -> None:
    session.send_to_user("hello")
    session.send_to_user({"step": 1, "items": [1, 2]})
    # Readers of the stream parse JSON (browsers, OpenAI clients): no NaN, infinities or bytes.
    for not_json in ({"score": float("nan")}, [float("inf")], {"raw": b"\x00"}):
        with pytest.raises(sy.InvalidArgument, match="must be JSON"):
            session.send_to_user(not_json)
    t0 = time.monotonic()
    session.sleep(0.2)
    assert time.monotonic() - t0 >= 0.19


def test_connection_lost_fails_waiting_calls(gpu_worker_process) -> None:
    info = gpu_worker_process.create_session()
    s = sy.connect(info.socket_path, info.token)
    fut = s.conn.submit("sleep", {"seconds": 30})
    gpu_worker_process.end_session(info.session_id)
    with pytest.raises(sy.ConnectionLost):
        fut.result(10)
    with pytest.raises(sy.ConnectionLost):
        s.tokenize("after the end")


def test_asyncio_flavour_gathers_concurrent_calls(gpu_worker_process) -> None:
    info = gpu_worker_process.create_session()

    async def run() -> tuple[list[list[int]], list[int], list[int], int]:
        s = await aio.connect(info.socket_path, info.token)
        ids = await s.tokenize(PROMPT)
        root = await s.kv_create()
        await s.release(await s.pred(root, ids[:-1]))
        forks = [await root.fork() for _ in range(4)]
        outs = await asyncio.gather(*(s.generate(k, ids[-1:], 5, stop=[]) for k in forks))
        ref = await s.generate(await s.kv_create(), ids, 5, stop=[])
        firsts = await s.pred_token_many([(await s.kv_create(), ids) for _ in range(3)])
        fused = await s.pred_token(await s.kv_create(), ids)
        s.close()
        return list(outs), ref, firsts, fused

    try:
        outs, ref, firsts, fused = asyncio.run(run())
    finally:
        gpu_worker_process.end_session(info.session_id)
    assert all(o == ref for o in outs)
    assert firsts == [ref[0]] * 3
    assert fused == ref[0]


def test_the_worker_tick_meters_page_seconds_of_every_live_session(gpu_worker_process) -> None:
    """The tick reads every live session's pages in one KVFS call: two sessions holding
    different amounts of KV for over a second are both metered, each for its own pages."""
    infos = [gpu_worker_process.create_session() for _ in range(2)]
    sessions = [sy.connect(i.socket_path, i.token) for i in infos]
    try:
        for n, s in zip((1, 3), sessions, strict=True):
            s.release(s.pred(s.kv_create(), [5] * (n * s.info.block_size)))
        time.sleep(1.6)  # three ticks at the default 0.5 s
    finally:
        for s in sessions:
            s.close()
        small, big = (gpu_worker_process.end_session(i.session_id).usage["page_seconds"] for i in infos)
    assert 0 < small < big, (small, big)


def test_generate_continues_a_prefilled_fork_from_an_empty_prompt(session) -> None:
    """The common case of a shared prefix: prefill once, fork, generate with no new tokens."""
    ids = session.tokenize(PROMPT)
    root = session.kv_create()
    session.pred(root, ids)[0].release()
    fork = session.kv_fork(root)
    got = session.generate(fork, [], max_tokens=6, stop=[])
    want = session.generate(session.kv_create(), ids, max_tokens=6, stop=[])
    assert got == want
    assert session.kv_tokens(fork) == ids + got
    with pytest.raises(sy.InvalidArgument, match="needs a prompt or a file that already holds tokens"):
        session.generate(session.kv_create(), [], max_tokens=3)


def test_generate_takes_a_grammar_state_as_well_as_a_grammar(session) -> None:
    g = session.grammar(regex="(yes|no)")
    ids = session.apply_chat_template([{"role": "user", "content": "Answer yes or no: is water wet?"}])
    by_state = session.detokenize(session.generate(session.kv_create(), ids, max_tokens=4, grammar=g.state()))
    by_grammar = session.detokenize(session.generate(session.kv_create(), ids, max_tokens=4, grammar=g))
    assert by_state == by_grammar and by_state in ("yes", "no")
    with pytest.raises(sy.InvalidArgument, match="grammar= takes a Grammar or a GrammarState"):
        session.generate(session.kv_create(), ids, max_tokens=4, grammar="(yes|no)")


def test_asyncio_generate_takes_a_grammar_like_the_threaded_one(session, gpu_worker_process) -> None:
    """Both faces drive the one ``generate`` flow: the asyncio one takes ``grammar=`` (a grammar
    or a state, whose ``finished`` it sets) and gives the threaded one's tokens."""
    ids = session.apply_chat_template([{"role": "user", "content": "Answer yes or no: is water wet?"}])
    want = session.generate(session.kv_create(), ids, max_tokens=4, grammar=session.grammar(regex="(yes|no)"))

    async def go() -> tuple[list[int], list[int], bool, bool]:
        info = gpu_worker_process.create_session()
        s = await aio.connect(info.socket_path, info.token)
        try:
            g = await s.grammar(regex="(yes|no)")
            by_grammar = await s.generate(await s.kv_create(), ids, max_tokens=4, grammar=g)
            state = await g.state()
            by_state = await s.generate(await s.kv_create(), ids, max_tokens=4, grammar=state, top_k=1)
            manual = await g.state()
            accepted = await manual.advance(by_state[0])
            with pytest.raises(sy.InvalidArgument, match="grammar= takes a Grammar or a GrammarState"):
                await s.generate(await s.kv_create(), ids, max_tokens=4, grammar="(yes|no)")
            return by_grammar, by_state, state.finished, accepted
        finally:
            s.close()
            gpu_worker_process.end_session(info.session_id)

    by_grammar, by_state, finished, accepted = asyncio.run(go())
    assert by_grammar == by_state == want and session.detokenize(want) in ("yes", "no")
    assert finished and accepted


def test_common_slips_get_errors_that_say_what_to_do(session) -> None:
    kv = session.kv_create()
    ids = session.tokenize(PROMPT)
    g = session.grammar(regex="[0-9]+")
    (dist,) = session.pred(kv, ids)
    with pytest.raises(sy.InvalidArgument, match=r"not the compiled grammar: pass grammar.state\(\)"):
        dist.sample(mask=g)
    with pytest.raises(sy.InvalidArgument, match=r"not the compiled grammar"):
        session.pred_token(kv, [ids[-1]], mask=g)
    assert session.detokenize([dist.sample(mask=g.state(), temperature=0)]).strip().isdigit()
    with pytest.raises(sy.InvalidArgument, match=r"not str: tokenize text first"):
        session.generate(kv, "some text", max_tokens=2)
    with pytest.raises(sy.InvalidArgument, match=r"not str: tokenize text first"):
        session.pred(kv, "text")
    with pytest.raises(sy.InvalidArgument, match=r"must be ints"):
        session.pred(kv, [1, "2"])
    with pytest.raises(sy.InvalidArgument, match=r"takes a file name, not an open handle .*use kv_close for handles"):
        session.kv_remove(kv)
    with pytest.raises(sy.InvalidArgument, match=r"kv_open takes a file name"):
        session.kv_open(kv)
    assert len(kv) == len(ids)  # none of the refused calls reached the worker


def test_asyncio_flavour_refuses_the_same_slips_and_continues_a_fork(gpu_worker_process) -> None:
    async def go() -> None:
        info = gpu_worker_process.create_session()
        s = await aio.connect(info.socket_path, info.token)
        try:
            ids = await s.tokenize(PROMPT)
            root = await s.kv_create()
            await s.release(await s.pred(root, ids))
            got = await s.generate(await s.kv_fork(root), [], max_tokens=4, stop=[])
            assert got == await s.generate(await s.kv_create(), ids, max_tokens=4, stop=[])
            with pytest.raises(sy.InvalidArgument, match="tokenize text first"):
                await s.generate(root, "text", max_tokens=2)
            with pytest.raises(sy.InvalidArgument, match="use kv_close for handles"):
                await s.kv_remove(root)
        finally:
            s.close()
            gpu_worker_process.end_session(info.session_id)

    asyncio.run(go())


def test_bias_vectors_steer_choices_combine_with_a_mask_and_are_capped(session) -> None:
    """A worker-side bias over half the vocabulary (far past the 4,096 entries of a sparse map)
    set up once and named by handle: it moves argmax, sampling and ``pred_token`` into its token
    set, a mask still decides what is allowed, and the session's caps answer NoSpace."""
    vocab = session.info.vocab_size
    prompt = session.tokenize(PROMPT)
    d = session.pred(session.kv_create(), prompt)[0]
    base = d.argmax()
    odd = base % 2 == 1
    half = [t for t in range(vocab) if (t % 2 == 1) != odd]  # the parity the argmax lacks
    assert len(half) > protocol.MAX_MAP_ENTRIES
    # As a sparse map it is too large for one frame: the error names the call that fits.
    with pytest.raises(sy.InvalidArgument, match=r"at most 4096 entries.*sy\.bias_set"):
        d.argmax(bias=dict.fromkeys(half, 50.0))
    with session.bias_set(half, 50.0) as green:
        assert d.argmax(bias=green) % 2 != base % 2
        assert all(d.sample(temperature=1.0, seed=s, bias=green) % 2 != base % 2 for s in range(5))
        assert session.pred_token(session.kv_create(), prompt, bias=green) % 2 != base % 2
        # The mask decides what may be chosen; the bias ranks what it allows.
        other = next(t for t in d.topk(50).ids if t % 2 != base % 2)
        assert d.argmax(mask=[base, other], bias=green) == other
        assert d.argmax(mask=[base, base + 2], bias=green) == base
    with pytest.raises(sy.KVNotFound):  # released: the handle is gone
        d.argmax(bias=green)
    values = [0.0] * vocab
    values[other] = 1000.0
    dense = session.bias_vector(values)
    assert d.argmax(bias=dense) == other and d.argmax() == base  # the row itself is untouched
    dense.release()
    with pytest.raises(sy.InvalidArgument):
        session.bias_vector([0.0] * (vocab - 1))
    with pytest.raises(sy.InvalidArgument):  # the worker's own check, past the SDK's
        session.conn.call("bias_create", {"values": [float("nan")] * vocab})
    with pytest.raises(sy.InvalidArgument):
        session.conn.call("bias_create", {"ids": [vocab], "value": 1.0})
    held = [session.bias_set([1], 1.0) for _ in range(protocol.MAX_BIAS_HANDLES)]
    with pytest.raises(sy.NoSpace):
        session.bias_set([1], 1.0)
    for b in held:
        b.release()
    session.bias_set([1], 1.0).release()  # room again
    d.release()


def test_asyncio_flavour_biases_choices_with_a_bias_vector(gpu_worker_process) -> None:
    async def go() -> None:
        info = gpu_worker_process.create_session()
        s = await aio.connect(info.socket_path, info.token)
        try:
            ids = await s.tokenize(PROMPT)
            base = await s.pred_token(await s.kv_create(), ids)
            values = [0.0] * s.info.vocab_size
            values[base + 1] = 1000.0
            async with await s.bias_vector(values) as bias:
                assert await s.pred_token(await s.kv_create(), ids, bias=bias) == base + 1
                (dist,) = await s.pred(await s.kv_create(), ids)
                assert await dist.argmax(bias=bias) == base + 1
                assert await dist.sample(temperature=0.0, bias=bias, mask=[base, base + 2]) == base
            with pytest.raises(sy.KVNotFound):
                await dist.argmax(bias=bias)
            with pytest.raises(sy.InvalidArgument, match="bias= takes"):
                await dist.argmax(bias=[1.0, 2.0])
        finally:
            s.close()
            gpu_worker_process.end_session(info.session_id)

    asyncio.run(go())


def test_a_bias_vector_ranks_what_a_grammar_state_allows(session) -> None:
    """``mask=`` a grammar state and ``bias=`` a bias vector in one choice: the bias picks
    between the grammar's alternatives and cannot pick outside them."""
    g = session.grammar(regex="(yes|no)")
    (yes,), (no,) = session.tokenize("yes"), session.tokenize("no")
    d = session.pred(session.kv_create(), session.tokenize("Answer yes or no:"))[0]

    def allowed(t: int) -> bool:
        text = session.detokenize([t])
        return bool(text) and ("yes".startswith(text) or "no".startswith(text))

    outside = next(t for t in d.topk(20).ids if not allowed(t))
    for wanted in (yes, no):
        with session.bias_set([wanted], 100.0) as bias:
            assert d.argmax(mask=g.state(), bias=bias) == wanted
            assert d.sample(temperature=1.0, seed=1, mask=g.state(), bias=bias) == wanted
    with session.bias_set([outside], 1000.0) as bias:
        assert d.argmax(bias=bias) == outside
        chosen = d.argmax(mask=g.state(), bias=bias)
        assert chosen != outside and allowed(chosen), session.detokenize([chosen])
    d.release()
