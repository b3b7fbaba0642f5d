"""What a spawned run executes (sandbox/symphony/run.py): the entry staged next to its args
picks a module of the bundle and a function of it; and the SDK's own checks of a spawn, made
before anything is sent. No docker or worker: the runner's loading is plain Python."""

from __future__ import annotations

import json
import sys
import zipfile
from pathlib import Path

import pytest

from sandbox.spec import SandboxSpec
from sandbox.staging import stage_program
from symphony import calls, run
from symphony.errors import ChildFailed, DeadlineExceeded, InvalidArgument, SymphonyError
from symphony.wire import protocol


@pytest.fixture
def bundle(tmp_path: Path) -> Path:
    path = tmp_path / "team.zip"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("main.py", "def main(args):\n    return 'main'\n")
        z.writestr("spawn_agents_x/__init__.py", "")
        z.writestr("spawn_agents_x/scout.py", "def main(args):\n    return 'scout'\n\ndef other(args):\n    return 2\n")
    yield path
    for name in [m for m in sys.modules if m == "main" or m.startswith("spawn_agents_x")]:
        del sys.modules[name]
    sys.path[:] = [p for p in sys.path if p != str(path)]


def test_the_staged_entry_picks_a_module_and_function_of_the_bundle(monkeypatch, tmp_path, bundle):
    lip = tmp_path / "lip"
    lip.mkdir()
    spec = SandboxSpec(str(bundle), {"a": 1}, "/x.sock", "t", "r", "tenant", entry="spawn_agents_x.scout:other")
    name = stage_program(spec, lip)
    assert json.loads((lip / "entry.json").read_text()) == "spawn_agents_x.scout:other"
    monkeypatch.setenv(run.ENV_ARGS_FILE, str(lip / "args.json"))
    module, function = run.load_entry()
    assert (module, function) == ("spawn_agents_x.scout", "other")
    loaded = run.load_program(str(lip / name), module, function)
    assert run.call_main(loaded, {}, function) == 2


def test_a_single_file_programs_own_function_is_staged_as_self(monkeypatch, tmp_path):
    """The control plane stores ``self:helper`` (api/services/procs.py): the runner reads
    ``self`` as the program itself."""
    single = tmp_path / "p.py"
    single.write_text("def main(args):\n    return 1\n\ndef helper(args):\n    return 2\n")
    lip = tmp_path / "lip"
    lip.mkdir()
    name = stage_program(SandboxSpec(str(single), {}, "/x.sock", "t", "r", "tenant", entry="self:helper"), lip)
    monkeypatch.setenv(run.ENV_ARGS_FILE, str(lip / "args.json"))
    module, function = run.load_entry()
    assert (module, function) == ("", "helper")
    assert run.call_main(run.load_program(str(lip / name), module, function), {}, function) == 2


def test_a_run_a_client_started_runs_main(monkeypatch, tmp_path, bundle):
    lip = tmp_path / "lip"
    lip.mkdir()
    name = stage_program(SandboxSpec(str(bundle), {}, "/x.sock", "t", "r", "tenant"), lip)
    assert sorted(p.name for p in lip.iterdir()) == ["args.json", "program.zip"]  # no entry staged
    monkeypatch.setenv(run.ENV_ARGS_FILE, str(lip / "args.json"))
    module, function = run.load_entry()
    assert (module, function) == ("", "main")
    assert run.call_main(run.load_program(str(lip / name), module, function), {}) == "main"


def test_entries_that_are_not_there_are_setup_errors(tmp_path, bundle):
    single = tmp_path / "p.py"
    single.write_text("def main(args):\n    return 1\n\ndef helper(args):\n    return 2\n")
    assert run.call_main(run.load_program(str(single), "", "helper"), {}, "helper") == 2
    with pytest.raises(run.SetupError, match="single-file program has no module 'x'"):
        run.load_program(str(single), "x", "main")
    with pytest.raises(run.SetupError, match="defines no nowhere"):
        run.load_program(str(single), "", "nowhere")
    with pytest.raises(run.SetupError, match=r"zip program has no entry module spawn_agents_x\.spy"):
        run.load_program(str(bundle), "spawn_agents_x.spy", "main")


def test_the_sdk_refuses_a_bad_spawn_before_sending():
    for args in ({"x": float("nan")}, {1, 2}, object()):
        with pytest.raises(InvalidArgument, match="args must be JSON"):
            calls.spawn(None, args, None)
    with pytest.raises(InvalidArgument, match="entry must be a module name"):
        calls.spawn(3, {}, None)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="limits must be a mapping"):
        calls.spawn(None, {}, [1])  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="timeout must be"):
        calls.child_wait("c", -1)
    call = calls.spawn("self", None, {"deadline_s": 5})
    assert (call.op, call.args.get("entry", ""), call.args["limits"]) == ("spawn", "", {"deadline_s": 5})


def test_wait_returns_a_result_or_raises_the_childs_end():
    parse = calls.child_wait("c1", 2).parse
    ok = protocol.ChildStatus(child="c1", status="succeeded", result={"x": 1}).to_wire()
    assert parse(ok) == {"x": 1}
    failed = protocol.ChildStatus(child="c1", status="failed", error="RuntimeError: boom").to_wire()
    with pytest.raises(ChildFailed, match="child run c1 failed: RuntimeError: boom") as caught:
        parse(failed)
    assert isinstance(caught.value, SymphonyError) and caught.value.status == "failed"
    with pytest.raises(ChildFailed, match="cancelled"):
        parse(protocol.ChildStatus(child="c1", status="cancelled").to_wire())
    with pytest.raises(DeadlineExceeded, match="still running after 2s"):
        parse(protocol.ChildStatus(child="c1", status="running").to_wire())
