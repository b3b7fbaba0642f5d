"""The installed ``symphony`` CLI (the ``.venv/bin/symphony`` entry point) against the real ASGI
app: login (saved 0600), programs push (new program, then a new version), idempotent run, events,
cancel, kv ls/rm, usage, and clear errors; following a run (the streamed text alone on stdout,
byte for byte, the rest on stderr, ``kv:`` lines with ``-v`` only, nothing cutting the answer on a
shared terminal, its status as the exit code, Ctrl-C, a cancel through the real stack, an
unreachable server), runs ls/show; the Python client's list_runs and wait."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import signal
import socket
import stat
import subprocess
import time
from pathlib import Path

import pytest

from api.models import KVFile, Program, ProgramVersion, Run
from api.services import programs
from api.services.runs import publish_end, publish_event
from gpu_worker.contracts import EndEvent, KvEvent, MessageEvent, StatusEvent, TokenEvent
from tests.conftest import ROOT, wait_for
from tests.plugins.worker import RunningWorker

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.integration]


def entry_point(tmp_path: Path) -> str:
    """The installed ``symphony``: the shim scripts/bootstrap.sh writes into ``.venv/bin``. Git
    worktrees of this repository share one venv, whose shim runs the client/ of the checkout that
    wrote it; for another checkout the same shim is written pointing at this one's client/."""
    shim = ROOT / ".venv" / "bin" / "symphony"
    text = shim.read_text()
    written_for = re.search(r'PYTHONPATH="(.*)/client', text)
    assert written_for, f"{shim} is not the shim scripts/bootstrap.sh writes:\n{text}"
    if Path(written_for.group(1)).resolve() == ROOT.resolve():
        return str(shim)
    local = tmp_path / "symphony"
    local.write_text(text.replace(f'PYTHONPATH="{written_for.group(1)}/client', f'PYTHONPATH="{ROOT}/client'))
    local.chmod(0o755)
    return str(local)


@pytest.fixture
def cli(tmp_path, settings):
    settings.SYMPHONY_WORKER_ADMIN_SOCKET = str(tmp_path / "absent.sock")
    config = tmp_path / "config.json"
    symphony = entry_point(tmp_path)

    env = {k: v for k, v in os.environ.items() if not k.startswith("SYMPHONY_")}
    env.update(SYMPHONY_CONFIG=str(config))

    def command(argv: tuple[str, ...], key: str | None, url: str | None) -> list[str]:
        flags = [*(["--url", url] if url else []), *(["--api-key", key] if key else [])]
        return [symphony, *flags, *argv]

    def run(
        *argv: str, key: str | None = None, url: str | None = None, stdout=subprocess.PIPE
    ) -> subprocess.CompletedProcess:
        return subprocess.run(
            command(argv, key, url), env=env, stdout=stdout, stderr=subprocess.PIPE, text=True, timeout=60
        )

    def start(
        *argv: str,
        key: str | None = None,
        url: str | None = None,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    ) -> subprocess.Popen:
        """The CLI left running (a follow), for the test to feed events and signal it. SIGINT is
        reset to its default in the child: a test run started in the background by a
        non-interactive shell ignores SIGINT, the child would inherit that, and Python installs
        no KeyboardInterrupt handler for a signal ignored at its start."""
        return subprocess.Popen(
            command(argv, key, url),
            env=env,
            stdin=stdin,
            stdout=stdout,
            stderr=stderr,
            text=True,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )

    run.config = config
    run.start = start
    return run


@pytest.fixture
def logged_in(cli, api_asgi_server, api_tenant_a):
    assert cli("login", "--url", api_asgi_server, "--api-key", api_tenant_a.key_secret).returncode == 0
    return cli


@pytest.fixture
def program(api_tenant_a) -> Program:
    prog = Program.objects.create(tenant=api_tenant_a.tenant, name="echo")
    programs.add_version(prog, "echo.py", b"def main(args):\n    return args\n")
    return prog


def _end(run_id: str, status: str, error: str = "", result: object = None) -> None:
    """End the run as its executor does: the row's final status, then ``status``/``end`` events."""
    Run.objects.filter(pk=run_id).update(status=status, error=error, result=result)
    publish_end(Run.objects.get(pk=run_id))


def test_cli_round_trip(cli, api_asgi_server, api_tenant_a, tmp_path):
    assert cli("programs", "ls").returncode == 2  # no key anywhere yet
    # As the README writes it: the flags after the command (before it works too, see `cli`).
    login = cli("login", "--url", api_asgi_server, "--api-key", api_tenant_a.key_secret)
    assert login.returncode == 0, login.stderr
    assert json.loads(cli.config.read_text()) == {"url": api_asgi_server, "api_key": api_tenant_a.key_secret}
    assert stat.S_IMODE(cli.config.stat().st_mode) == 0o600

    source = tmp_path / "hello.py"
    source.write_text("def main(args):\n    return args\n")
    first = json.loads(cli("programs", "push", str(source)).stdout)
    source.write_text("def main(args):\n    return {'v': 2}\n")
    second = json.loads(cli("programs", "push", str(source)).stdout)
    unchanged = json.loads(cli("programs", "push", str(source)).stdout)
    assert (first["name"], first["version"], second["version"], unchanged["version"]) == ("hello", 1, 2, 2)
    assert second["program"] == first["program"]
    assert ProgramVersion.objects.filter(program_id=first["program"]).count() == 2  # same bytes: no new version
    assert [p["name"] for p in json.loads(cli("programs", "ls").stdout)] == ["hello"]

    run_one = cli("run", str(first["program"]), "--args", '{"x": 1}', "--idempotency-key", "k1")
    again = cli("run", str(first["program"]), "--args", '{"x": 1}', "--idempotency-key", "k1")
    run_id = json.loads(run_one.stdout)["id"]
    assert json.loads(again.stdout)["id"] == run_id and Run.objects.count() == 1
    other = cli("run", str(first["program"]), "--args", '{"x": 2}', "--idempotency-key", "k1")
    assert other.returncode == 1 and "422 idempotency_mismatch" in other.stderr and run_id in other.stderr
    publish_event(run_id, TokenEvent("Hi"))
    publish_event(run_id, EndEvent("succeeded"))
    events = cli("events", run_id)  # the program's text alone on stdout, the rest on stderr
    assert (events.returncode, events.stdout) == (0, "Hi\n") and f"run {run_id} succeeded" in events.stderr
    lines = [json.loads(line) for line in cli("follow", run_id, "--json").stdout.splitlines()]
    assert [line["event"] for line in lines] == ["token", "end", "run"] and lines[0]["data"] == {"text": "Hi"}
    assert json.loads(cli("cancel", run_id).stdout)["status"] == "cancelled"

    KVFile.objects.create(tenant=api_tenant_a.tenant, worker="local", name="doc", residency="disk")
    assert [kv["name"] for kv in json.loads(cli("kv", "ls").stdout)] == ["doc"]
    missing = cli("kv", "rm", "nope")
    assert missing.returncode == 1 and "no KV file named 'nope'" in missing.stderr
    usage = json.loads(cli("usage").stdout)
    assert usage["plan"] == "free" and "days" in usage
    grouped = json.loads(cli("usage", "--group-by", "program").stdout)  # the one run was cancelled unstarted
    assert grouped["plan"] == "free" and grouped["groups"] == [] and "groups" not in usage

    # The run was cancelled before it started: the program goes, and the run with it.
    assert json.loads(cli("programs", "rm", "hello").stdout) == {"deleted": "hello"}
    assert cli("programs", "ls").stdout.strip() == "[]" and not Run.objects.filter(pk=run_id).exists()
    gone = cli("programs", "rm", "hello")
    assert gone.returncode == 1 and "no program named or numbered 'hello'" in gone.stderr

    bad = cli("get", run_id, key="sk_bad_bad")
    assert bad.returncode == 1 and "401" in bad.stderr
    unreachable = cli("programs", "ls", url="http://127.0.0.1:9")
    assert unreachable.returncode == 1 and "cannot reach" in unreachable.stderr


def test_client_meets_the_tenant_request_rate_of_the_real_app(api_asgi_server, api_tenant_a):
    """The real server's 429 is what the client's retry logic reads (tests/unit/test_client_throttle.py)."""
    from django.core.cache import cache

    from api.models import Plan
    from symphony_client import ApiError, Client

    cache.clear()
    Plan.objects.create(name="two-a-minute", api_requests_per_minute=2)
    api_tenant_a.tenant.plan = "two-a-minute"
    api_tenant_a.tenant.save(update_fields=["plan"])
    client = Client(api_asgi_server, api_tenant_a.key_secret, throttle_wait_s=0)
    assert client.quota()["limits"]["api_requests_per_minute"] == 2
    client.list_programs()
    with pytest.raises(ApiError) as refused:
        client.list_programs()
    assert (refused.value.status, refused.value.code) == (429, "throttled")
    assert "allows 2 API requests per minute" in refused.value.message
    cache.clear()


@pytest.mark.parametrize(("status", "code"), [("succeeded", 0), ("failed", 1), ("cancelled", 3), ("timed_out", 4)])
def test_follow_exits_with_the_runs_status(logged_in, api_tenant_a, program, status, code):
    """A script can tell a failed run from a good one by the exit code alone (it was 0 for all)."""
    run_id = json.loads(logged_in("run", str(program.pk)).stdout)["id"]
    _end(run_id, status, error="" if status == "succeeded" else "it went wrong")
    followed = logged_in("follow", run_id)
    assert followed.returncode == code, followed.stderr
    assert f"run {run_id} {status}" in followed.stderr and "Traceback" not in followed.stderr


def test_run_follow_prints_the_text_to_stdout_and_the_progress_to_stderr(logged_in, program):
    following = logged_in.start("run", str(program.pk), "--args", '{"prompt": "capital?"}', "--follow")
    first = following.stderr.readline()  # "run <id> queued (program ...)", before any event
    assert first.startswith("run ") and " queued " in first, first
    run_id = first.split()[1]
    assert Run.objects.get(pk=run_id).args == {"prompt": "capital?"}
    publish_event(run_id, StatusEvent("queued", reason="waiting for gpu_worker 'local' to finish starting"))
    publish_event(run_id, StatusEvent("running"))
    for text in ("Par", "is."):
        publish_event(run_id, TokenEvent(text))
    publish_event(run_id, MessageEvent({"source": "wiki"}))
    _end(run_id, "failed", error="deadline passed", result={"partial": True})
    out, err = following.communicate(timeout=60)
    assert following.returncode == 1, err
    assert out == 'Paris.\n{"source": "wiki"}\n'  # no event JSON among the program's text
    assert f"run {run_id}: running" in err and f"run {run_id} failed after" in err and "deadline passed" in err
    assert f"run {run_id}: queued (waiting for gpu_worker 'local' to finish starting)" in err  # why it waits
    assert 'result: {"partial": true}' in err


def test_ctrl_c_while_following_without_a_terminal_says_how_to_reattach(logged_in, program):
    """stdin is not a terminal: no question, the run goes on, exit 130 without a traceback."""
    run_id = json.loads(logged_in("run", str(program.pk)).stdout)["id"]
    publish_event(run_id, TokenEvent("thinking\n"))
    following = logged_in.start("follow", run_id)
    assert following.stdout.readline() == "thinking\n"  # attached and streaming
    following.send_signal(signal.SIGINT)
    _, err = following.communicate(timeout=30)
    assert following.returncode == 130, err
    assert f"symphony follow {run_id}" in err and "Traceback" not in err and "cancel run" not in err
    assert Run.objects.get(pk=run_id).status == "queued"


def test_ctrl_c_while_following_from_a_terminal_offers_to_cancel(logged_in, program):
    run_id = json.loads(logged_in("run", str(program.pk)).stdout)["id"]
    publish_event(run_id, TokenEvent("thinking\n"))
    terminal, stdin = pty.openpty()
    try:
        following = logged_in.start("follow", run_id, stdin=stdin)
        assert following.stdout.readline() == "thinking\n"
        following.send_signal(signal.SIGINT)
        deadline = time.monotonic() + 30
        asked = ""
        while f"cancel run {run_id}? [y/N]" not in asked and time.monotonic() < deadline:
            asked += following.stderr.read(1)
        os.write(terminal, b"y\n")
        _, err = following.communicate(timeout=30)
    finally:
        os.close(terminal)
        os.close(stdin)
    assert following.returncode == 130, asked + err
    assert f"run {run_id} cancelled\nCancelled by you at " in err and "Traceback" not in asked + err
    assert Run.objects.get(pk=run_id).status == "cancelled"


def test_runs_ls_and_show(logged_in, program):
    ids = []
    for n in range(3):  # the free plan runs two at a time: the first has ended when the third starts
        ids.append(json.loads(logged_in("run", str(program.pk), "--args", json.dumps({"n": n})).stdout)["id"])
        if n == 0:
            _end(ids[0], "failed", error="boom")
    listed = json.loads(logged_in("runs", "ls").stdout)  # a pipe: JSON, as scripts read it
    assert [run["id"] for run in listed] == ids[::-1]
    assert [run["id"] for run in json.loads(logged_in("runs", "ls", "--limit", "2", "--json").stdout)] == ids[:0:-1]
    assert [run["id"] for run in json.loads(logged_in("runs", "ls", "--status", "failed").stdout)] == ids[:1]
    table = logged_in("runs", "ls", "--human").stdout.splitlines()
    assert table[0].split() == ["ID", "STATUS", "PROGRAM", "PROGRAM", "ID", "VERSION", "CREATED", "ERROR"]
    row = table[-1].split()[:5]
    assert row == [ids[0], "failed", program.name, str(program.pk), "1"] and table[-1].endswith("boom")
    assert json.loads(logged_in("runs", "show", ids[1]).stdout)["args"] == {"n": 1}
    shown = logged_in("runs", "show", ids[0], "--human").stdout
    # One "key  value" line per field, keys padded to the longest (program_name).
    assert shown.splitlines()[0] == f"echo n=0  (run {ids[0]}, failed)"  # runs have no name: program, 1st arg
    fields = dict(line.split(None, 1) for line in shown.splitlines()[1:] if line.strip())
    assert fields["id"] == ids[0] and fields["error"] == "boom" and fields["program_name"] == "echo", shown
    bad = logged_in("runs", "ls", "--limit", "0")
    assert bad.returncode == 2 and "--limit" in bad.stderr


def test_runs_show_has_the_runs_usage_timings_and_cost(logged_in, program):
    from api.services.runs import RunOutcome, finish_run, start_run

    run_id = json.loads(logged_in("run", str(program.pk)).stdout)["id"]
    waiting = logged_in("runs", "show", run_id, "--human").stdout
    assert "usage" in waiting and "(recorded when the run ends)" in waiting
    start_run(run_id, "local")
    usage = {"prefill_tokens": 120, "decode_tokens": 30, "pred_calls": 31, "forwards": 29, "sandbox_seconds": 1.5}
    finish_run(run_id, RunOutcome(status="succeeded", result="ok", usage=usage))
    shown = json.loads(logged_in("runs", "show", run_id).stdout)
    assert shown["usage"]["decode_tokens"] == 30 and shown["usage"]["forwards"] == 29
    assert shown["timings"]["queue_wait_s"] >= 0
    lines = logged_in("runs", "show", run_id, "--human").stdout.splitlines()
    assert any(line.split() == ["prefill_tokens", "120"] for line in lines), lines
    assert any(line.split() == ["forwards", "29"] for line in lines), lines
    cost = next(line for line in lines if line.startswith("cost"))
    assert cost.split()[2] == "USD" and float(cost.split()[1]) > 0
    assert any(line.startswith("time_to_first_token_s") and line.split()[1] == "-" for line in lines)


def test_bad_arguments_are_reported_before_anything_is_sent(logged_in, program, tmp_path):
    source = tmp_path / "fresh.py"
    source.write_text("def main(args):\n    return args\n")
    for flag, value, says in (
        ("--args", "{prompt: hi}", "--args is not valid JSON"),
        ("--args", '["hi"]', "--args must be a JSON object"),
        ("--limits", "64", "--limits must be a JSON object"),
    ):
        refused = logged_in("run", str(source), flag, value)
        assert refused.returncode == 2 and says in refused.stderr, refused.stderr
    quiet = logged_in("run", str(source), "-v")  # -v only changes what a followed run prints
    assert quiet.returncode == 2 and "use it with --follow" in quiet.stderr, quiet.stderr
    assert logged_in("runs", "ls", "-v").returncode == 2
    assert not Program.objects.filter(name="fresh").exists() and not Run.objects.exists()
    # The API's per-field detail, not its generic "request failed".
    invalid = logged_in("run", str(program.pk), "--limits", '{"max_tokens": "many"}')
    assert invalid.returncode == 1 and "400 invalid: limits.max_tokens:" in invalid.stderr, invalid.stderr
    helped = logged_in("--help")
    assert helped.returncode == 0 and "examples:" in helped.stdout and "exit codes:" in helped.stdout
    assert "symphony run prog.py" in logged_in("run", "--help").stdout


def test_python_client_lists_and_waits_for_runs(api_asgi_server, api_tenant_a, program, tmp_path):
    from symphony_client import Client, Pushed

    source = tmp_path / "echo.py"
    source.write_text("def main(args):\n    return args\n")
    with Client(api_asgi_server, api_tenant_a.key_secret) as client:
        pushed = client.push_program(source)
        assert isinstance(pushed, Pushed) and (pushed.program["id"], pushed.version) == (program.pk, 1)
        runs = [client.create_run(program.pk, {"n": n}) for n in range(2)]
        assert [r["id"] for r in client.list_runs()] == [r["id"] for r in reversed(runs)]
        assert [r["id"] for r in client.list_runs(limit=1)] == [runs[-1]["id"]]
        assert client.list_runs(status="succeeded") == []
        started = time.monotonic()
        with pytest.raises(TimeoutError, match="still queued"):
            client.wait(runs[0], timeout=1)
        assert time.monotonic() - started < 5
        _end(runs[0]["id"], "succeeded", result={"n": 0})
        done = client.wait(runs[0]["id"], timeout=10)
        assert (done["status"], done["result"]) == ("succeeded", {"n": 0})


def _kv(tokens: int) -> KvEvent:
    return KvEvent(run_pages=1, tenant_device_pages=1, tenant_host_pages=0, tokens=tokens)


def test_follow_to_a_file_keeps_exactly_the_streamed_text(logged_in, program, tmp_path):
    """KV ticks came every half second and each put a newline into the answer on stdout."""
    run_id = json.loads(logged_in("run", str(program.pk)).stdout)["id"]
    publish_event(run_id, StatusEvent("running"))
    for text, tokens in ((" of the", 3), (" sea, a place", 7), (" where", 9)):
        publish_event(run_id, TokenEvent(text))
        publish_event(run_id, _kv(tokens))
    _end(run_id, "succeeded")
    for flags in ((), ("-v",), ("--verbose",)):
        answer = tmp_path / "answer.txt"
        with answer.open("w") as stdout:
            followed = logged_in("follow", run_id, *flags, stdout=stdout)
        assert followed.returncode == 0, followed.stderr
        assert answer.read_bytes() == b" of the sea, a place where\n", flags
        assert f"run {run_id}: running" in followed.stderr and f"run {run_id} succeeded" in followed.stderr
        kv_lines = [line for line in followed.stderr.splitlines() if line.startswith("kv:")]
        if flags:
            assert kv_lines[0] == "kv: 3 tokens in 1 page of this run; the tenant holds 1 device page, 0 in host memory"
            assert len(kv_lines) == 3
        else:
            assert kv_lines == [], followed.stderr


def _read_terminal(terminal: int, proc: subprocess.Popen, timeout: float) -> str:
    """All a process wrote to the terminal whose other end is ``terminal``, until it exits."""
    seen = b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([terminal], [], [], 0.2)
        if ready:
            try:
                chunk = os.read(terminal, 4096)
            except OSError:  # EIO: the process closed its end
                break
            seen += chunk
        elif proc.poll() is not None:
            break
    return seen.decode()


def test_lines_about_the_run_do_not_cut_the_answer_on_a_shared_terminal(logged_in, program):
    """stdout and stderr on one terminal: a status or kv line arriving mid-line waits for the line's end."""
    run_id = json.loads(logged_in("run", str(program.pk)).stdout)["id"]
    publish_event(run_id, TokenEvent("The capital is Par"))
    publish_event(run_id, StatusEvent("running"))
    publish_event(run_id, _kv(12))
    publish_event(run_id, TokenEvent("is.\nIt lies on"))
    publish_event(run_id, _kv(20))
    publish_event(run_id, TokenEvent(" the Seine."))
    _end(run_id, "succeeded")
    terminal, child = pty.openpty()
    try:
        following = logged_in.start("follow", run_id, "-v", stdout=child, stderr=child)
        os.close(child)
        shown = _read_terminal(terminal, following, timeout=30).replace("\r\n", "\n")
        assert following.wait(timeout=30) == 0, shown
    finally:
        os.close(terminal)
    assert "The capital is Paris.\nrun " in shown and "It lies on the Seine.\n" in shown, shown
    lines = shown.splitlines()
    assert lines.index(f"run {run_id}: running") == lines.index("The capital is Paris.") + 1, shown
    assert "kv: 20 tokens in 1 page of this run; the tenant holds 1 device page, 0 in host memory" in lines


def test_follow_says_cannot_reach_at_once(cli, api_tenant_a):
    """It retried for 23 s and then said "0 stream_lost"; the other commands said "cannot reach"."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{probe.getsockname()[1]}"  # closed when the block ends
    started = time.monotonic()
    followed = cli("follow", "0f3c1a52-0000-4000-8000-000000000000", key=api_tenant_a.key_secret, url=url)
    took = time.monotonic() - started
    assert followed.returncode == 1 and followed.stderr.startswith(f"error: cannot reach {url}: "), followed.stderr
    assert took < 2, took


CANCELLABLE = b"""
import time

import symphony as sy


def main(args):
    for i in range(600):
        sy.send_to_user(f"tick {i} ")
        time.sleep(0.1)
    return "not cancelled"
"""


@pytest.fixture(scope="module")
def stack_worker(shared_stack_worker: RunningWorker) -> RunningWorker:
    return shared_stack_worker


@pytest.mark.docker
@pytest.mark.vllm
def test_a_cancel_you_asked_for_ends_the_follow_without_a_traceback(cli, stack, api_tenant_a, tmp_path):
    """Through the real stack the stopped program's ConnectionLost traceback was the last thing
    printed. Now: the friendly line, exit 3 (the documented code for a cancelled run)."""
    lip = tmp_path / "ticker.py"
    lip.write_bytes(CANCELLABLE)
    key = api_tenant_a.key_secret
    following = cli.start("run", str(lip), "--limits", '{"deadline_s": 120}', "--follow", key=key, url=stack)
    pushed = following.stderr.readline()
    created = following.stderr.readline()  # "run <id> queued (program ...)"
    assert pushed.startswith("pushed ") and created.startswith("run "), pushed + created
    run_id = created.split()[1]
    assert following.stdout.read(len("tick 0 tick 1 ")) == "tick 0 tick 1 "  # it runs and streams
    cancelled = cli("cancel", run_id, key=key, url=stack)
    assert cancelled.returncode == 0, cancelled.stderr
    out, err = following.communicate(timeout=120)
    assert following.returncode == 3, err
    assert re.fullmatch(r"(tick \d+ )*\n", out), out  # the answer, then its one closing newline
    assert re.search(
        rf"run {run_id} cancelled after [\d.]+s\nCancelled by you at \d{{4}}-\d\d-\d\d \d\d:\d\d:\d\d", err
    )
    assert "Traceback" not in err and "ConnectionLost" not in err, err
    # The executor then records what the stopped program reported; re-attaching reads it.
    wait_for(lambda: "ConnectionLost" in Run.objects.get(pk=run_id).error, timeout=60)
    again = cli("follow", run_id, key=key, url=stack)
    assert again.returncode == 3 and "Cancelled by you at " in again.stderr, again.stderr
    assert "Traceback" not in again.stderr and "ConnectionLost" not in again.stderr, again.stderr
    verbose = cli("follow", run_id, "-v", key=key, url=stack)  # what it reported, on request
    assert verbose.returncode == 3 and "ConnectionLost" in verbose.stderr, verbose.stderr
