"""Worker-side bias vectors (``bias_create`` / ``bias_ref``): what the protocol accepts, the
session's caps, and the choice they bias, combined with an allowed-token mask. The real worker
and the SDK drive them in tests/sandbox/test_sdk.py and the watermark example."""

from __future__ import annotations

import struct
from array import array
from types import SimpleNamespace

import pytest
import torch

from gpu_worker import bias_vectors
from gpu_worker import protocol as p
from gpu_worker.ops.pred import chooser
from gpu_worker.protocol import ErrorCode, ProtocolError
from gpu_worker.sessions import SessionLimits, WorkerSession

VOCAB = 100


def _decode(args: dict) -> p.BiasCreate:
    wire = p.unpack_body(p.pack(args)[p.HEADER_BYTES :])
    return p.BiasCreate.decode(wire, VOCAB)


def _refused(args: dict) -> str:
    with pytest.raises(ProtocolError) as caught:
        p.BiasCreate.decode(args, VOCAB)
    assert caught.value.code == ErrorCode.BAD_ARGS
    return caught.value.message


def _session() -> WorkerSession:
    return WorkerSession("s1", "tenant-a", "run-1", SessionLimits(), "/nonexistent.sock", max_dists=16)


def test_a_token_set_and_a_dense_vector_decode_to_what_the_sdk_built() -> None:
    got = _decode(p.BiasCreate(ids=[3, 1, 3], value=2.5).to_wire())
    assert (got.ids, got.value, got.values) == ((3, 1, 3), 2.5, None)
    dense = [float(i) / 8 for i in range(VOCAB)]
    wire = p.BiasCreate(values=dense).to_wire()
    assert isinstance(wire["values"], bytes) and len(wire["values"]) == VOCAB * 4  # float32, not a list
    assert list(_decode(wire).values) == dense
    assert list(p.BiasCreate.decode({"values": dense}, VOCAB).values) == dense  # a plain list too


def test_bias_create_refuses_what_it_cannot_apply() -> None:
    assert "exactly one of ids" in _refused({})
    assert "exactly one of ids" in _refused({"ids": [1], "value": 1.0, "values": [0.0] * VOCAB})
    assert "needs a value" in _refused({"ids": [1]})
    assert "value goes with ids" in _refused({"values": [0.0] * VOCAB, "value": 1.0})
    assert "ids" in _refused({"ids": [VOCAB], "value": 1.0})
    assert "values" in _refused({"values": [0.0] * (VOCAB - 1)})
    assert "values" in _refused({"values": b"\0" * (VOCAB * 4 - 1)})
    assert "finite" in _refused({"values": [0.0] * (VOCAB - 1) + [float("nan")]})
    assert "finite" in _refused({"values": struct.pack("<f", float("inf")) * VOCAB})
    assert "value" in _refused({"ids": [1], "value": float("inf")})


def test_a_negative_bias_ref_is_refused() -> None:
    with pytest.raises(ProtocolError) as caught:
        p.Sample.decode({"bias_ref": -1}, VOCAB)
    assert caught.value.code == ErrorCode.BAD_ARGS and "bias_ref" in caught.value.message


def test_the_store_caps_handles_and_bytes_and_frees_on_release() -> None:
    store = bias_vectors.BiasStore(max_handles=2, max_bytes=3 * VOCAB * 4)
    a = store.add(torch.zeros(VOCAB))
    b = store.add(torch.zeros(VOCAB))
    with pytest.raises(ProtocolError) as caught:
        store.add(torch.zeros(VOCAB))
    assert caught.value.code == ErrorCode.NO_SPACE and "limit 2" in caught.value.message
    store.release(a)
    assert store.bytes == VOCAB * 4
    with pytest.raises(ProtocolError) as caught:
        store.add(torch.zeros(3 * VOCAB))  # one handle free, but over the byte cap
    assert caught.value.code == ErrorCode.NO_SPACE and "bytes" in caught.value.message
    with pytest.raises(ProtocolError) as caught:
        store.get(a)
    assert caught.value.code == ErrorCode.NOT_FOUND
    with pytest.raises(ProtocolError):
        store.release(a)
    store.clear()
    assert len(store) == 0 and store.bytes == 0
    with pytest.raises(ProtocolError):
        store.get(b)


def test_a_session_holds_the_documented_caps() -> None:
    s = _session()
    assert (s.biases.max_handles, s.biases.max_bytes) == (p.MAX_BIAS_HANDLES, p.MAX_BIAS_BYTES)


def test_a_bias_ref_moves_the_choice_and_combines_with_a_mask() -> None:
    s, ctx = _session(), SimpleNamespace(vocab_size=VOCAB)
    logits = torch.zeros(VOCAB)
    logits[7] = 5.0
    green = s.biases.add(bias_vectors.token_set_vector(VOCAB, range(50, 100), 10.0))
    assert chooser(ctx, s, p.Argmax())(logits) == 7
    assert chooser(ctx, s, p.Argmax(bias_ref=green))(logits) >= 50
    # The mask still decides what is allowed; the bias only ranks what it allows.
    assert chooser(ctx, s, p.Argmax(bias_ref=green, mask=(7, 60)))(logits) == 60
    assert chooser(ctx, s, p.Argmax(bias_ref=green, mask=(7, 8)))(logits) == 7
    # A sparse bias adds on top of the vector.
    assert chooser(ctx, s, p.Argmax(bias_ref=green, bias={7: 20.0}))(logits) == 7
    dense = s.biases.add(bias_vectors.dense_vector(array("f", [-1.0] * 99 + [9.0])))
    assert chooser(ctx, s, p.Sample(temperature=0.0, bias_ref=dense))(logits) == 99
    assert torch.equal(logits, torch.cat([torch.zeros(7), torch.tensor([5.0]), torch.zeros(92)]))  # untouched


def test_an_unknown_bias_ref_fails_before_any_forward() -> None:
    s = _session()
    with pytest.raises(ProtocolError) as caught:
        chooser(SimpleNamespace(vocab_size=VOCAB), s, p.Argmax(bias_ref=5))
    assert caught.value.code == ErrorCode.NOT_FOUND


def test_the_sdk_sends_a_token_set_past_one_list_dense() -> None:
    """More ids than one list of a frame may hold (a vocabulary past 131k tokens, half green):
    the SDK sends the same bias as one float32 per token, which the worker decodes to it."""
    from symphony import calls

    vocab = 2 * p.MAX_ARRAY_ITEMS + 10
    ids = range(0, vocab, 2)
    call = calls.bias_set(ids, 3.0, vocab)
    assert call.op == "bias_create" and set(call.args) == {"values"}
    got = p.BiasCreate.decode(p.unpack_body(p.pack(call.args)[p.HEADER_BYTES :]), vocab)
    assert torch.equal(bias_vectors.dense_vector(got.values), bias_vectors.token_set_vector(vocab, ids, 3.0))
    small = calls.bias_set([5, 2, 5], -1.0, vocab)
    assert small.args == {"ids": [2, 5], "value": -1.0}
