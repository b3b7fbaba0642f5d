"""The process relay's messages (gpu_worker/contracts.py): what the worker pushes for a LIP's
``spawn`` / ``child_cancel`` and what the parent's executor answers, as JSON both ways."""

from __future__ import annotations

import pytest

from gpu_worker import contracts


def test_requests_and_replies_round_trip():
    request = contracts.ProcRequest(
        id="r1", op="spawn", parent="p1", entry="agents.scout:main", args={"a": [1, "b"]}, limits={"deadline_s": 5}
    )
    assert contracts.ProcRequest.decode(request.encode()) == request
    cancel = contracts.ProcRequest(id="r2", op="cancel", parent="p1", child="c1")
    assert contracts.ProcRequest.decode(cancel.encode().encode()) == cancel
    reply = contracts.ProcReply(id="r1", ok=False, code="EDQUOT", message="spawn refused: ...")
    assert contracts.ProcReply.decode(reply.encode()) == reply
    assert contracts.proc_requests_key("p1") == "symphony:procs:p1"
    assert contracts.proc_reply_key("r1") == "symphony:procs:reply:r1"


@pytest.mark.parametrize("raw", ['{"id": "x", "op": "exec", "parent": "p"}', "[]", '{"op": "spawn", "extra": 1}'])
def test_anything_else_is_refused(raw):
    with pytest.raises(ValueError):
        contracts.ProcRequest.decode(raw)


def test_a_malformed_reply_is_refused():
    for raw in ("[]", '{"id": "x"}', '{"id": "x", "ok": true, "surprise": 1}'):
        with pytest.raises(ValueError):
            contracts.ProcReply.decode(raw)
