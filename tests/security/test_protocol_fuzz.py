"""Hypothesis fuzzing of the worker's session socket (docs/ARCHITECTURE.md §4, §9).

A LIP is hostile code and its session socket is the only thing it can reach, so this drives the
real worker (tests/plugins/worker.py, tiny model) with raw frames instead of the SDK: random
msgpack envelopes, every LIP op of :data:`gpu_worker.protocol.LIP_OPS` with wrongly typed and
out-of-range arguments (huge and negative ints, NaN, deep nesting, bytes where text is due),
hand-made byte streams (bad length prefixes, truncated and undecodable frames), and calls made
before ``hello``.

Properties checked after every example or batch:

* the worker never crashes: the process is alive and admin ``health`` says ok;
* every reply to a well-framed request carries that request's id and is either ``ok`` or an
  ``err`` whose code is one of :class:`protocol.ErrorCode` (an unknown code means a handler let an
  exception escape its contract; ``EINTERNAL`` is counted and must stay zero);
* a bystander session of another tenant keeps working throughout, its KV file keeps its tokens,
  and nothing the fuzzer receives equals the bystander's tokens or logits, although the fuzzer is
  handed the bystander's real handle ids as arguments.

Bounded: a few hundred examples in total, about a minute on 2 cores.
"""

from __future__ import annotations

import math
import socket
import struct
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import symphony as sy
from gpu_worker import protocol
from gpu_worker.protocol import ErrorCode

pytestmark = [pytest.mark.integration, pytest.mark.vllm, pytest.mark.timeout(300)]

KNOWN_CODES = {v for k, v in vars(ErrorCode).items() if k.isupper()}
FUZZ_OPS = sorted(set(protocol.LIP_OPS) - {"hello"})
#: Argument names the ops declare (their classes in protocol.py, the choice fields of ``then``
#: included): fuzzed maps mostly use these keys so that the values reach the checks instead of
#: being ignored as unknown keys.
ARG_NAMES = sorted({f.name for cls in (*protocol.LIP_OPS.values(), protocol.Sample) for f in cls.FIELDS})
SETTINGS = settings(
    deadline=None,
    database=None,
    derandomize=False,
    suppress_health_check=list(HealthCheck),
)
REPLY_TIMEOUT_S = 60.0


class Raw:
    """A bare connection to a session socket: frames in, frames out, no SDK in between."""

    def __init__(self, path: str, timeout: float = REPLY_TIMEOUT_S) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        self.sock.connect(path)

    def send_bytes(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send(self, obj: Any) -> None:
        self.sock.sendall(protocol.pack(obj))

    def recv(self) -> Any | None:
        """The next reply, or None when the worker closed the connection."""
        header = self._exact(protocol.HEADER_BYTES)
        if header is None:
            return None
        body = self._exact(protocol.frame_length(header))
        assert body is not None, "worker closed the connection in the middle of a reply frame"
        return protocol.unpack_body(body)

    def _exact(self, n: int) -> bytes | None:
        buf = bytearray()
        while len(buf) < n:
            try:
                chunk = self.sock.recv(n - len(buf))
            except ConnectionResetError:
                chunk = b""
            if not chunk:
                return None
            buf.extend(chunk)
        return bytes(buf)

    def call(self, req_id: int, op: str, args: Any) -> Any:
        self.send({"id": req_id, "op": op, "args": args})
        return self.recv()

    def close(self) -> None:
        self.sock.close()


@dataclass
class Bystander:
    """Another tenant's live session whose data must stay private and intact."""

    sdk: Any
    kv: Any
    tokens: list[int]
    full: bytes
    handle_ids: list[int]
    token: str


@dataclass
class Fuzzer:
    path: str
    token: str
    conn: Raw | None = None
    next_id: int = 1
    stats: dict[str, int] = field(default_factory=dict)

    def connection(self) -> Raw:
        """The authenticated raw connection, reopened if a previous example got it closed."""
        if self.conn is None:
            self.conn = Raw(self.path)
            reply = self.conn.call(0, "hello", {"token": self.token})
            assert reply and "ok" in reply, reply
        return self.conn

    def drop(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None

    def count(self, key: str) -> None:
        self.stats[key] = self.stats.get(key, 0) + 1


@pytest.fixture(scope="module")
def bystander(gpu_worker_process) -> Iterator[Bystander]:
    with gpu_worker_process.session(f"victim-{uuid.uuid4().hex[:6]}") as info:
        sdk = sy.connect(info.socket_path, info.token)
        kv = sdk.kv_create("private-notes")
        prompt = sdk.tokenize("the bystander's private prompt: account 4417 1234 5678 9113")
        (dist,) = sdk.pred(kv, prompt)
        full = sdk.conn.call("dist_full", {"dist": dist.id})
        # Two more handles of other kinds: a fork and a live Dist.
        fork = sdk.kv_fork(kv)
        (live,) = sdk.pred(fork, prompt[:3])
        yield Bystander(sdk, kv, sdk.kv_tokens(kv), full, [kv.id, fork.id, dist.id, live.id], info.token)
        sdk.close()


@pytest.fixture(scope="module")
def fuzzer(gpu_worker_process) -> Iterator[Fuzzer]:
    with gpu_worker_process.session(f"fuzz-{uuid.uuid4().hex[:6]}", deadline_s=3600) as info:
        fz = Fuzzer(info.socket_path, info.token)
        yield fz
        fz.drop()


def assert_unharmed(worker, by: Bystander, fz: Fuzzer | None = None) -> None:
    """Worker alive and healthy; the bystander's file and session work as before."""
    if fz is not None:
        print(f"replies so far: {dict(sorted(fz.stats.items()))}")
    worker.assert_alive()
    assert by.sdk.kv_tokens(by.kv) == by.tokens
    assert by.sdk.detokenize(by.sdk.tokenize("still here")) == "still here"
    names = {f["name"] for f in worker.admin.kv_list(by.sdk.info.tenant)}
    assert "private-notes" in names, names


def _choice_params(op: str, args: dict[str, Any]) -> dict[str, Any]:
    """The sampling/argmax parameters a call hands to gpu_worker.dists (args or ``then``)."""
    if op in ("dist_sample", "dist_argmax"):
        return args
    then = args.get("then")
    if op == "pred" and isinstance(then, dict) and len(then) == 1:
        inner = next(iter(then.values()))
        return inner if isinstance(inner, dict) else {}
    return {}


def check_reply(
    reply: Any, req_id: int, by: Bystander, fz: Fuzzer, op: str = "", args: dict[str, Any] | None = None
) -> None:
    assert isinstance(reply, dict), reply
    assert reply.get("id") == req_id, (req_id, reply)
    if "err" in reply:
        err = reply["err"]
        assert isinstance(err, dict) and err.get("code") in KNOWN_CODES, reply
        assert isinstance(err.get("message"), str), reply
        assert err["code"] != ErrorCode.INTERNAL, f"handler failed internally: {reply} for {op} {args!r}"
        fz.count(err["code"])
        return
    assert "ok" in reply, reply
    fz.count("ok")
    value = reply["ok"]
    # Nothing of the bystander's may come back, whatever handle ids were sent.
    assert value != by.tokens and value != by.full, "fuzzer received the bystander's data"
    if isinstance(value, bytes):
        assert by.full not in value
    if isinstance(value, str):
        assert by.sdk.info.tenant not in value


# --------------------------------------------------------------------------- strategies
def _ints() -> st.SearchStrategy[int]:
    """Every msgpack int width, with the boundaries the validators compare against."""
    edges = [-(2**63), -(2**31), -1, 0, 1, 2**31 - 1, 2**32, 2**62, 2**63 - 1, 2**63, 2**64 - 1]
    return st.one_of(st.integers(-(2**63), 2**64 - 1), st.sampled_from(edges), st.integers(-3, 70_000))


SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    _ints(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=40),
    st.binary(max_size=40),
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=6),
        st.dictionaries(st.one_of(st.sampled_from(ARG_NAMES), st.text(max_size=8)), inner, max_size=5),
    ),
    max_leaves=20,
)


def _args(handles: list[int]) -> st.SearchStrategy[dict[str, Any]]:
    value = st.one_of(VALUES, st.sampled_from(handles), st.lists(st.sampled_from(handles), min_size=1, max_size=3))
    key = st.one_of(st.sampled_from(ARG_NAMES), st.text(max_size=12))
    return st.dictionaries(key, value, max_size=6)


#: Ops that wait for a message: a missing or long timeout would legitimately block.
WAITING_OPS = {"channel_recv", "channel_next"}


def _safe(op: str, args: dict[str, Any]) -> dict[str, Any]:
    """Keep the ops that would legitimately block (sleep, channel reads) within a fraction of a
    second."""
    if op in WAITING_OPS:
        timeout = args.get("timeout")
        if timeout is None:
            args = {**args, "timeout": 0.01}
        elif isinstance(timeout, int | float) and not isinstance(timeout, bool) and 0 <= timeout <= 3600:
            args = {**args, "timeout": min(timeout, 0.01)}  # out-of-range values stay refused
    if op == "sleep" and isinstance(args.get("seconds"), int | float) and not isinstance(args["seconds"], bool):
        seconds = args["seconds"]
        if not math.isnan(seconds) and 0 < seconds <= 3600:
            args = {**args, "seconds": min(seconds, 0.01)}
    return args


# -------------------------------------------------------------------------------- tests
def test_every_op_with_hostile_arguments(gpu_worker_process, bystander, fuzzer) -> None:
    """All LIP ops x random argument maps, including the bystander's real handle ids."""
    started = time.monotonic()

    @settings(SETTINGS, max_examples=250)
    @given(data=st.data())
    def run(data) -> None:
        op = data.draw(st.sampled_from(FUZZ_OPS), label="op")
        args = _safe(op, data.draw(_args(bystander.handle_ids), label="args"))
        req_id = fuzzer.next_id
        fuzzer.next_id += 1
        conn = fuzzer.connection()
        try:
            reply = conn.call(req_id, op, args)
        except protocol.ProtocolError as exc:  # our own pack() refusing an oversized frame
            assert exc.code == ErrorCode.BAD_FRAME
            return
        assert reply is not None, f"worker closed a well-framed connection on {op} {args!r}"
        check_reply(reply, req_id, bystander, fuzzer, op, args)

    run()
    assert_unharmed(gpu_worker_process, bystander, fuzzer)
    # The fuzz reached the handlers (not only the envelope check) and some calls succeeded.
    assert fuzzer.stats.get(ErrorCode.BAD_ARGS, 0) > 20, fuzzer.stats
    assert fuzzer.stats.get("ok", 0) > 5, fuzzer.stats
    assert time.monotonic() - started < 240


def test_own_handles_with_hostile_parameters(gpu_worker_process, bystander, fuzzer) -> None:
    """Valid handles of the fuzzer's own session with hostile numbers: the random-map test rarely
    gets past handle lookup, this one reaches sampling, top-k, log-probs, bias, masks, truncation
    and extraction with NaN/inf/huge/negative values."""
    conn = fuzzer.connection()

    def ok(op: str, args: dict[str, Any]) -> Any:
        reply = conn.call(fuzzer.next_id, op, args)
        fuzzer.next_id += 1
        assert reply is not None and "ok" in reply, (op, reply)
        return reply["ok"]

    kv = ok("kv_create", {})["kv"]
    dists = ok("pred", {"kv": kv, "tokens": [5, 6, 7, 8], "positions": [0, 1, 2, 3]})["dists"]
    number = st.one_of(
        st.floats(allow_nan=True, allow_infinity=True), _ints(), st.sampled_from([0, 0.0, 1e-45, 1e308, -0.0])
    )
    token_ids = st.lists(st.one_of(st.integers(-2, 50_000), _ints()), max_size=6)
    params = st.fixed_dictionaries(
        {},
        optional={
            "temperature": number,
            "top_p": number,
            "top_k": number,
            "seed": number,
            "k": number,
            "n": number,
            "start": number,
            "end": number,
            "token_ids": st.one_of(token_ids, VALUES),
            "mask": st.one_of(token_ids, number, VALUES),
            "bias": st.one_of(st.dictionaries(st.integers(-2, 50_000).map(str), number, max_size=4), VALUES),
            "tokens": st.one_of(st.lists(st.integers(0, 200), min_size=1, max_size=4), token_ids),
            "positions": st.one_of(st.lists(st.integers(-6, 6), max_size=4), VALUES),
            "then": st.one_of(
                st.just("argmax"),
                st.builds(lambda p: {"sample": p}, st.dictionaries(st.sampled_from(ARG_NAMES), number, max_size=4)),
                VALUES,
            ),
            "token": number,
        },
    )
    ops = ["dist_sample", "dist_argmax", "dist_topk", "dist_logprob", "dist_full", "kv_len", "kv_tokens"]
    ops += ["kv_truncate", "kv_extract", "kv_merge", "pred", "mask_advance"]

    @settings(SETTINGS, max_examples=200)
    @given(op=st.sampled_from(ops), args=params, which=st.integers(0, len(dists) - 1))
    def run(op, args, which) -> None:
        args = {**args, "kv": kv, "a": kv, "b": kv, "dist": dists[which]}
        req_id = fuzzer.next_id
        fuzzer.next_id += 1
        reply = conn.call(req_id, op, args)
        assert reply is not None, f"worker closed the connection on {op} {args!r}"
        check_reply(reply, req_id, bystander, fuzzer, op, args)
        if op in ("kv_extract", "kv_merge") and "ok" in reply:
            ok("kv_close", {"kv": reply["ok"]["kv"]})  # keep the session's page use bounded
        if op == "pred" and "ok" in reply and "dists" in reply["ok"]:
            ok("dist_release", {"dists": reply["ok"]["dists"]})

    run()
    assert_unharmed(gpu_worker_process, bystander, fuzzer)
    ok("kv_close", {"kv": kv})


def test_bystander_handles_never_resolve_for_the_fuzzer(gpu_worker_process, bystander, fuzzer) -> None:
    """Directed, not random: each of the bystander's handles on every handle-taking op."""
    conn = fuzzer.connection()
    kv_ops = ["kv_len", "kv_tokens", "kv_fork", "kv_close", "kv_truncate", "kv_extract"]
    for hid in bystander.handle_ids:
        for op in kv_ops:
            reply = conn.call(fuzzer.next_id, op, {"kv": hid, "n": 0, "start": 0, "end": 1})
            fuzzer.next_id += 1
            assert reply["err"]["code"] in (ErrorCode.NOT_FOUND, ErrorCode.BAD_ARGS), (op, hid, reply)
        reply = conn.call(fuzzer.next_id, "pred", {"kv": hid, "tokens": [1, 2]})
        fuzzer.next_id += 1
        assert reply["err"]["code"] == ErrorCode.NOT_FOUND, (hid, reply)
        reply = conn.call(fuzzer.next_id, "kv_merge", {"a": hid, "b": hid})
        fuzzer.next_id += 1
        assert reply["err"]["code"] == ErrorCode.NOT_FOUND, (hid, reply)
    for name in ("private-notes", f"../{bystander.sdk.info.tenant}/private-notes"):
        reply = conn.call(fuzzer.next_id, "kv_open", {"name": name, "mode": "r"})
        fuzzer.next_id += 1
        assert reply["err"]["code"] in (ErrorCode.NOT_FOUND, ErrorCode.BAD_ARGS), (name, reply)
    assert_unharmed(gpu_worker_process, bystander)


def test_random_envelopes(gpu_worker_process, bystander, fuzzer) -> None:
    """Arbitrary msgpack values as whole requests: maps with missing, extra or mistyped id/op/args."""
    envelope = st.one_of(
        VALUES,
        st.fixed_dictionaries(
            {},
            optional={
                "id": st.one_of(_ints(), VALUES),
                "op": st.one_of(st.sampled_from([*FUZZ_OPS, "hello"]), st.text(max_size=300), VALUES),
                "args": st.one_of(_args(bystander.handle_ids), VALUES),
            },
        ),
    )

    @settings(SETTINGS, max_examples=150)
    @given(msg=envelope)
    def run(msg) -> None:
        conn = fuzzer.connection()
        try:
            frame = protocol.pack(msg)
        except (protocol.ProtocolError, ValueError, TypeError, OverflowError):
            return
        if isinstance(msg, dict) and isinstance(msg.get("op"), str) and msg["op"] in {"sleep", *WAITING_OPS}:
            return  # covered with bounded waits above
        conn.send_bytes(frame)
        reply = conn.recv()
        assert reply is not None, f"worker closed the connection on a decodable frame {msg!r}"
        try:
            req_id, _, _ = protocol.parse_request(msg)
        except protocol.ProtocolError:
            # A bad envelope: the reply is EBADFRAME, to the request's id if it has a valid one
            # (so the call that sent it fails at once), and the connection lives on.
            sent_id = msg.get("id") if isinstance(msg, dict) else None
            valid = isinstance(sent_id, int) and not isinstance(sent_id, bool) and 0 <= sent_id < 2**63
            expected_id = sent_id if valid else None
            assert reply == {"id": expected_id, "err": reply["err"]}, reply
            assert reply["err"]["code"] == ErrorCode.BAD_FRAME, reply
            fuzzer.count("bad_envelope")
            return
        check_reply(reply, req_id, bystander, fuzzer, msg.get("op", ""), msg.get("args"))

    run()
    assert fuzzer.stats.get("bad_envelope", 0) > 10, fuzzer.stats
    assert_unharmed(gpu_worker_process, bystander)


def _deep(depth: int) -> bytes:
    """A well-formed msgpack value nested ``depth`` arrays deep (never built as a Python object)."""
    return b"\x91" * depth + b"\xc0"


def test_hostile_byte_streams(gpu_worker_process, bystander, fuzzer) -> None:
    """Raw bytes on fresh authenticated connections: bad prefixes, truncation, garbage, depth."""
    body = st.one_of(
        st.binary(max_size=200),
        st.builds(_deep, st.integers(100, 200_000)),
        st.builds(lambda v: msgpack.packb(v, use_bin_type=True), VALUES),
    )
    stream = st.one_of(
        # length prefix that disagrees with the body (too short, too long, beyond the limit)
        st.tuples(st.integers(0, 2**32 - 1), body).map(lambda t: struct.pack(">I", t[0]) + t[1]),
        # well-prefixed body, possibly cut short
        st.tuples(body, st.integers(0, 64)).map(lambda t: struct.pack(">I", len(t[0])) + t[0][: len(t[0]) - t[1]]),
        st.binary(max_size=64),
    )

    @settings(SETTINGS, max_examples=120)
    @given(data=stream)
    def run(data: bytes) -> None:
        fuzzer.drop()
        conn = fuzzer.connection()
        conn.sock.settimeout(5)
        try:
            conn.send_bytes(data)
            conn.sock.shutdown(socket.SHUT_WR)  # EOF: a truncated frame must not hang the worker
        except (BrokenPipeError, ConnectionResetError):
            pass  # a bad length prefix closes the connection, maybe before all of data was sent
        while True:
            try:
                reply = conn.recv()
            except TimeoutError:
                pytest.fail(f"worker neither replied nor closed within 5 s after EOF on {data[:80]!r}")
            if reply is None:
                break
            assert isinstance(reply, dict) and ("err" in reply or "ok" in reply), reply
            if "err" in reply:
                assert reply["err"]["code"] in KNOWN_CODES, reply
                assert reply["err"]["code"] != ErrorCode.INTERNAL, reply
        fuzzer.drop()

    run()
    assert_unharmed(gpu_worker_process, bystander, fuzzer)
    # A fresh authenticated connection still gets normal answers.
    assert fuzzer.connection().call(fuzzer.next_id, "vocab_info", {})["ok"]["vocab_size"] > 0


def test_calls_before_hello_are_refused_and_close(gpu_worker_process, bystander, fuzzer) -> None:
    """Every op, a wrong token, a token of another session: EAUTH (or silence) and a closed
    connection; nothing runs unauthenticated."""
    attempts: list[tuple[str, Any]] = [(op, {}) for op in FUZZ_OPS]
    attempts += [("hello", {}), ("hello", {"token": None}), ("hello", {"token": "x" * 43}), ("hello", {"token": 7})]
    attempts += [("hello", {"token": bystander.token})]  # a valid token, but of another session

    @settings(SETTINGS, max_examples=40)
    @given(args=_args(bystander.handle_ids))
    def random_pre_hello(args) -> None:
        _refused(fuzzer.path, "kv_tokens", args)

    for op, args in attempts:
        _refused(fuzzer.path, op, args)
    random_pre_hello()
    assert_unharmed(gpu_worker_process, bystander)


def _refused(path: str, op: str, args: Any) -> None:
    conn = Raw(path, timeout=10)
    try:
        reply = conn.call(1, op, args)
        if reply is not None:
            assert reply["err"]["code"] == ErrorCode.NOT_AUTHENTICATED, (op, args, reply)
            assert conn.recv() is None, "connection stays open after a refused hello"
    finally:
        conn.close()


def test_non_list_mask_is_einval(gpu_worker_process, fuzzer) -> None:
    """Found by the fuzzer: a mask that is neither a handle nor a list is a bad argument."""
    conn = fuzzer.connection()
    kv = conn.call(fuzzer.next_id, "kv_create", {})["ok"]["kv"]
    (dist,) = conn.call(fuzzer.next_id + 1, "pred", {"kv": kv, "tokens": [5, 6]})["ok"]["dists"]
    fuzzer.next_id += 2
    for mask in (1.5, True, {"1": 2}):
        reply = conn.call(fuzzer.next_id, "dist_argmax", {"dist": dist, "mask": mask})
        fuzzer.next_id += 1
        assert reply["err"]["code"] == ErrorCode.BAD_ARGS, (mask, reply)


def test_advance_must_be_a_boolean_with_a_grammar_state(gpu_worker_process, fuzzer) -> None:
    """``advance`` asks the worker to feed its chosen token to a grammar state: anything but a
    boolean, or with a token-list mask, is a bad argument, refused before the call runs."""
    conn = fuzzer.connection()
    kv = conn.call(fuzzer.next_id, "kv_create", {})["ok"]["kv"]
    grammar = conn.call(fuzzer.next_id + 1, "grammar", {"regex": "a+"})["ok"]["grammar"]
    mask = conn.call(fuzzer.next_id + 2, "grammar_state", {"grammar": grammar})["ok"]["mask"]
    fuzzer.next_id += 3
    for params in ({"mask": mask, "advance": 1}, {"mask": mask, "advance": "yes"}, {"mask": [5], "advance": True}):
        reply = conn.call(fuzzer.next_id, "pred", {"kv": kv, "tokens": [5, 6], "then": {"argmax": params}})
        fuzzer.next_id += 1
        assert reply["err"]["code"] == ErrorCode.BAD_ARGS, (params, reply)
    length = conn.call(fuzzer.next_id, "kv_len", {"kv": kv})
    fuzzer.next_id += 1
    assert length["ok"] == 0, "a refused pred must not have landed any token"


def test_extreme_temperature_and_bias_do_not_fail_internally(gpu_worker_process, fuzzer) -> None:
    """Found by the fuzzer (temperature 1e-45): the limit is greedy sampling, not a NaN softmax."""
    conn = fuzzer.connection()
    kv = conn.call(fuzzer.next_id, "kv_create", {})["ok"]["kv"]
    (dist,) = conn.call(fuzzer.next_id + 1, "pred", {"kv": kv, "tokens": [5, 6]})["ok"]["dists"]
    fuzzer.next_id += 2
    for params in ({"temperature": 1e-45}, {"temperature": 1.0, "bias": {"7": 1e308, "8": 1e308}}):
        reply = conn.call(fuzzer.next_id, "dist_sample", {"dist": dist, **params})
        fuzzer.next_id += 1
        assert "ok" in reply or reply["err"]["code"] == ErrorCode.BAD_ARGS, (params, reply)


def test_grammar_source_of_the_wrong_type_is_einval(gpu_worker_process, fuzzer) -> None:
    """Found by the fuzzer (json_schema=b""): a schema that is not text or JSON is a bad argument."""
    conn = fuzzer.connection()
    hostile: list[dict[str, Any]] = [
        {"json_schema": b""},
        {"json_schema": 7},
        {"json_schema": {"type": b"string"}},
        {"json_schema": {"maximum": math.nan}},
        {"regex": b"a+"},
        {"ebnf": ["root ::= x"]},
    ]
    for args in hostile:
        reply = conn.call(fuzzer.next_id, "grammar", args)
        fuzzer.next_id += 1
        assert reply["err"]["code"] == ErrorCode.BAD_ARGS, (args, reply)
    reply = conn.call(fuzzer.next_id, "grammar", {"json_schema": {"type": "boolean"}})
    fuzzer.next_id += 1
    assert "grammar" in reply["ok"], reply
