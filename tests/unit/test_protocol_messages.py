"""The typed op definitions of gpu_worker/protocol.py: what the SDK builds decodes to the same
values on the worker, and a refused argument is EINVAL naming the field."""

from __future__ import annotations

import pytest

from gpu_worker import protocol as p
from gpu_worker.protocol import ErrorCode, ProtocolError

VOCAB = 100


def _refused(cls: type[p.Args], args: dict, vocab: int = VOCAB) -> str:
    with pytest.raises(ProtocolError) as caught:
        cls.decode(args, vocab)
    assert caught.value.code == ErrorCode.BAD_ARGS
    return caught.value.message


def test_what_the_sdk_builds_the_worker_decodes_to_the_same_values() -> None:
    then = p.Sample(temperature=0.5, top_k=3, seed=7, mask=[1, 2], bias={5: -1.5})
    sent = p.Pred(kv=3, tokens=[1, 2, 3], positions=[0, -1], then=then)
    wire = p.unpack_body(p.pack(sent.to_wire())[p.HEADER_BYTES :])
    got = p.Pred.decode(wire, VOCAB)
    assert (got.kv, got.tokens, got.positions) == (3, (1, 2, 3), (0, 2))
    assert isinstance(got.then, p.Sample)
    assert (got.then.temperature, got.then.top_k, got.then.seed) == (0.5, 3, 7)
    assert got.then.mask == (1, 2) and got.then.bias == {5: -1.5}
    assert wire["then"]["sample"]["bias"] == {"5": -1.5}  # string keys: strict_map_key


def test_defaults_are_left_off_the_wire_and_filled_in_by_the_worker() -> None:
    assert p.KvCreate(name=None).to_wire() == {}
    assert p.Tokenize(text="hi").to_wire() == {"text": "hi"}
    assert p.KvOpen.decode({"name": "notes"}) == p.KvOpen(name="notes", mode="r")
    assert p.Pred.decode({"kv": 1, "tokens": [4, 5]}, VOCAB).positions == (1,)
    assert p.Pred.decode({"kv": 1, "tokens": [4], "then": "argmax"}, VOCAB).then == p.Argmax()


@pytest.mark.parametrize(
    ("cls", "args", "message"),
    [
        (p.KvLen, {}, "kv must be an integer in [0, 9223372036854775807]"),
        (p.KvLen, {"kv": True}, "kv must be an integer"),
        (p.KvTruncate, {"kv": 1, "n": -1}, "n must be an integer in [0,"),
        (p.Pred, {"kv": 1, "tokens": []}, "tokens must be a list of 1..8192 token ids"),
        (p.Pred, {"kv": 1, "tokens": [VOCAB]}, f"tokens must hold integers in [0, {VOCAB})"),
        (p.Pred, {"kv": 1, "tokens": [1], "positions": [1]}, "position 1 outside tokens (length 1)"),
        (p.Pred, {"kv": 1, "tokens": [1], "then": "sample"}, 'then must be "argmax"'),
        (p.Pred, {"kv": 1, "tokens": [1], "then": {"argmax": {"advance": True}}}, "advance needs a grammar state"),
        (p.DistSample, {"dist": 1, "temperature": float("nan")}, "temperature must be a number in [0, 100]"),
        (p.DistSample, {"dist": 1, "top_p": 0}, "top_p must be a number in (0, 1]"),
        (p.DistArgmax, {"dist": 1, "bias": {"500": 1.0}}, "bias token id out of range"),
        (p.DistArgmax, {"dist": 1, "mask": []}, "an allowed-token mask must list"),
        (p.KvOpen, {"name": "x", "mode": "rw"}, 'mode must be "r" or "w"'),
        (p.SendToUser, {}, "data is required"),
        (p.Sleep, {"seconds": -1}, "seconds must be a number in [0, 3600.0]"),
        (p.Grammar, {"regex": "a", "ebnf": "b"}, "give exactly one of json_schema, regex, ebnf"),
        (p.ApplyChatTemplate, {"messages": [{"role": "user"}]}, "each message must be a map"),
        (p.CreateSession, {"tenant": "", "run_id": "r"}, "tenant must not be empty"),
    ],
)
def test_a_refused_argument_names_its_field(cls: type[p.Args], args: dict, message: str) -> None:
    assert message in _refused(cls, args)


def test_unknown_keys_are_ignored_and_messages_are_immutable() -> None:
    got = p.KvLen.decode({"kv": 2, "surplus": [1, 2]})
    assert got == p.KvLen(kv=2)
    with pytest.raises(AttributeError):
        got.kv = 3  # type: ignore[misc]
    with pytest.raises(TypeError):
        p.KvLen(kv=1, surplus=2)  # type: ignore[call-arg]


def test_a_reply_message_anywhere_in_a_reply_is_packed_as_its_map() -> None:
    frame = p.pack(p.ok_reply(7, p.KvRef(kv=4)))
    assert p.unpack_body(frame[p.HEADER_BYTES :]) == {"id": 7, "ok": {"kv": 4}}
    assert p.HelloReply.from_wire({"session_id": "s"}).tenant is None
