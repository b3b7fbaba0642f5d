"""Results, streamed messages and channel messages follow JSON's rules for map keys.

Sent as it is, ``return {1: "a"}`` would fail a finished program at its very end (the wire carries
string keys only) and lose its result, and a coordinator its children's work with it.
``json.dumps`` takes such dicts, so the SDK writes their keys as JSON does and refuses, naming
where, only what JSON itself cannot say."""

from __future__ import annotations

import pytest

import symphony as sy
from symphony import checks

pytestmark = [pytest.mark.integration, pytest.mark.docker, pytest.mark.vllm, pytest.mark.timeout(300)]

PROGRAM = """
import symphony as sy


def main(args):
    sy.send_to_user({7: "streamed", "nested": [{8: None}]})
    sy.channel("keys").send({1: "sent"})
    received = sy.channel("keys").recv(timeout=10)
    return {1: "a", 2: [{3: None}], None: True, 1.5: "f", False: 0, "received": received}
"""

COLLIDING = """
def main(args):
    return {"children": [{1: "a", "1": "b"}]}
"""


def test_keys_are_written_as_json_writes_them_and_collisions_name_their_place() -> None:
    assert checks.json_keys({1: {True: [None, {2.5: "x"}]}}, "finish", "result") == {
        "1": {"true": [None, {"2.5": "x"}]}
    }
    with pytest.raises(sy.InvalidArgument, match=r"result\[0\]: keys 1 and '1' are the same key"):
        checks.json_keys([{1: "a", "1": "b"}], "finish", "result")
    with pytest.raises(sy.InvalidArgument, match=r"data\['k'\]: key \(1, 2\) of type tuple cannot be a JSON key"):
        checks.json_keys({"k": {(1, 2): 0}}, "send_to_user", "data")


def test_a_program_returning_int_keys_keeps_its_result(lip_runner) -> None:
    run = lip_runner.run(PROGRAM)
    assert run.result.status == "succeeded", (run.result.error, run.result.stderr[-2000:])
    assert run.result.result == {
        "1": "a",
        "2": [{"3": None}],
        "null": True,
        "1.5": "f",
        "false": 0,
        "received": {"1": "sent"},
    }


def test_keys_that_collide_in_json_fail_the_run_naming_where(lip_runner) -> None:
    run = lip_runner.run(COLLIDING)
    assert run.result.status == "failed"
    assert "result['children'][0]: keys 1 and '1' are the same key in JSON" in run.result.error, run.result.error


def test_send_to_user_takes_int_keys(session) -> None:
    session.send_to_user({1: "a", 2: {3: "b"}})  # refused with EBADFRAME before
