"""``symphony`` CLI: log in once, push programs, run them with live output, list and follow runs,
manage KV files, read usage. ``symphony --help`` and ``symphony COMMAND --help`` show examples.

URL and key come from flags, else ``SYMPHONY_URL`` / ``SYMPHONY_API_KEY``, else the file that
``login`` writes (``$SYMPHONY_CONFIG`` or ``~/.config/symphony/config.json``, mode 0600).
Output: tables and text when stdout is a terminal, JSON otherwise; ``--json`` / ``--human``
choose. Exit codes (client/README.md): 0 ok, 1 failed run or error, 2 usage, 3 cancelled run,
4 timed-out run, 130 interrupted.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from symphony_client import output
from symphony_client.client import ApiError, Client
from symphony_client.follow import EXIT_ERROR, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE, follow
from symphony_client.types import Run

DEFAULT_URL = "http://127.0.0.1:8000"
RUN_STATUSES = ("queued", "running", "succeeded", "failed", "timed_out", "cancelled")

EXAMPLES = """\
examples:
  symphony login --url http://127.0.0.1:8000 --api-key sk_...
  symphony programs push prog.py                # new program, or next version of "prog"
  symphony run prog.py --args '{"prompt": "hi"}' --follow
  symphony runs ls --status failed              # newest first, 20 unless --limit
  symphony runs show RUN_ID                     # with the runs it spawned
  symphony runs ls --parent RUN_ID              # the runs a run spawned
  symphony follow RUN_ID > answer.txt           # re-attach; the answer alone on stdout
  symphony follow RUN_ID -v                     # also the run's KV usage on stderr
  symphony logs RUN_ID                          # what the program printed (stdout, stderr)
  symphony trace RUN_ID                         # where its time went; --chrome > t.json for Perfetto
  symphony kv ls && symphony usage --json

exit codes: 0 succeeded/ok, 1 run failed or error, 2 usage error, 3 run cancelled
            (symphony cancel, the API), 4 run timed out, 130 interrupted (Ctrl-C)
"""

RUN_EXAMPLES = """\
examples:
  symphony run prog.py --args '{"prompt": "What is the capital of France?"}' --follow
  symphony run 12 --limits '{"max_tokens": 64, "deadline_s": 30}' --idempotency-key job-7
  symphony run prog.py --follow --json | jq -c 'select(.event == "token")'

With --follow the exit code is the run's: 0 succeeded, 1 failed, 3 cancelled, 4 timed out.
Ctrl-C while following asks (from a terminal) whether to cancel; the run goes on otherwise;
either way the exit code is 130.
"""


class UsageError(Exception):
    """A command line that cannot be sent: reported before anything reaches the API (exit 2)."""


@dataclass
class Answer:
    """What a command prints: ``data`` as JSON, or in human mode ``human`` (text), a table of
    ``table`` kind, or ``data`` as ``key: value`` lines. ``code`` is the exit code."""

    data: Any = None  # the API's decoded JSON
    human: str | None = None
    table: str | None = None
    compact: bool = False
    code: int = EXIT_OK


def config_path() -> Path:
    return Path(os.environ.get("SYMPHONY_CONFIG") or Path.home() / ".config" / "symphony" / "config.json")


def _saved() -> dict:
    try:
        return json.loads(config_path().read_text())
    except (OSError, ValueError):
        return {}


def _common_flags(suppress: bool) -> argparse.ArgumentParser:
    """``--url``/``--api-key``/``--json``/``--human``, accepted before the command and after it
    (``symphony login --api-key ...`` as well as ``symphony --api-key ... login``). On the
    commands' parsers the defaults are suppressed, so a flag given before the command is not
    reset by them."""
    flags = argparse.ArgumentParser(add_help=False)
    default = argparse.SUPPRESS if suppress else None
    flags.add_argument("--url", default=default, help=f"API base URL (default: $SYMPHONY_URL, login, {DEFAULT_URL})")
    flags.add_argument("--api-key", default=default, help="API key (default: $SYMPHONY_API_KEY, login)")
    mode = flags.add_mutually_exclusive_group()
    mode.add_argument(
        "--json",
        dest="output",
        action="store_const",
        const="json",
        default=default,
        help="print JSON (JSON Lines for follow); the default for answers when stdout is not a terminal",
    )
    mode.add_argument(
        "--human",
        dest="output",
        action="store_const",
        const="human",
        default=default,
        help="print tables and text; the default on a terminal, and for follow and logs",
    )
    return flags


def _verbose_flag(parser: argparse.ArgumentParser) -> None:
    """``-v``: on the commands that follow a run, the only ones it changes."""
    parser.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="also the run's KV usage (kv: lines) and what a cancelled program reported, on stderr",
    )


def _parser() -> argparse.ArgumentParser:
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(
        prog="symphony",
        description="Symphony CLI: programs, runs, KV files, usage.",
        epilog=EXAMPLES,
        formatter_class=raw,
        parents=[_common_flags(suppress=False)],
    )
    command_flags = _common_flags(suppress=True)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(group: argparse._SubParsersAction, name: str, text: str, **kwargs: Any) -> argparse.ArgumentParser:
        return group.add_parser(
            name, help=text, description=text, parents=[command_flags], formatter_class=raw, **kwargs
        )

    command(sub, "login", "check the URL and key, then save them for later commands")

    programs = sub.add_parser("programs", help="list, push or delete programs").add_subparsers(
        dest="action", required=True, metavar="ACTION"
    )
    command(programs, "ls", "list programs")
    push = command(programs, "push", "upload a .py or .zip (a new version if the name exists)")
    push.add_argument("path")
    push.add_argument("--name", help="program name (default: the file name without extension)")
    command(programs, "rm", "delete a program (by name or id) with its finished runs").add_argument("program")

    run = command(sub, "run", "start a run of a program id, or of a file (pushed first)", epilog=RUN_EXAMPLES)
    run.add_argument("program", help="program id, or path to a .py/.zip")
    run.add_argument("--args", default="{}", help="JSON object passed to main(args)")
    run.add_argument("--limits", default="{}", help='JSON object, e.g. {"max_tokens": 512, "deadline_s": 60}')
    run.add_argument("--idempotency-key", help="same key and arguments again: the first run, not a new one")
    run.add_argument("--follow", action="store_true", help="stream output until the run ends; exit with its status")
    _verbose_flag(run)

    runs = sub.add_parser("runs", help="list runs or show one").add_subparsers(dest="action", required=True)
    ls = command(runs, "ls", "list runs, newest first", epilog="example:\n  symphony runs ls --status running --json")
    ls.add_argument("--status", choices=RUN_STATUSES)
    ls.add_argument("--program", type=int, help="only this program id's runs")
    ls.add_argument("--parent", metavar="RUN_ID", help="only the runs this run spawned")
    ls.add_argument("--limit", type=_positive, default=20, help="at most this many (default 20)")
    command(runs, "show", "show a run").add_argument("run_id")
    for name, text in (
        ("get", "show a run (same as `runs show`)"),
        ("cancel", "cancel a run"),
        ("follow", "follow a run's output until it ends; exit with its status"),
        ("events", "same as `follow`"),
        ("logs", "print what a run's program wrote to stdout and stderr"),
    ):
        about_run = command(sub, name, text)
        about_run.add_argument("run_id")
        if name in ("follow", "events"):
            _verbose_flag(about_run)

    trace = command(sub, "trace", "where a run's time went: a summary and its top 5 spans")
    trace.add_argument("run_id")
    trace.add_argument(
        "--chrome", action="store_true", help="print the Chrome trace-event JSON instead (open it in Perfetto)"
    )

    kv = sub.add_parser("kv", help="persistent KV files").add_subparsers(dest="action", required=True)
    command(kv, "ls", "list KV files")
    command(kv, "rm", "delete a KV file").add_argument("name")
    usage = command(sub, "usage", "usage per day and quota")
    usage.add_argument("--group-by", choices=["program", "api_key"], help="also sum usage per program or API key")
    return parser


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, not {text!r}")
    return value


def _json_object(flag: str, text: str) -> dict:
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise UsageError(f"{flag} is not valid JSON ({exc}): {text[:80]!r}") from None
    if not isinstance(value, dict):
        raise UsageError(f'{flag} must be a JSON object like \'{{"prompt": "hi"}}\', not {type(value).__name__}')
    return value


def _program_id(client: Client, ref: str) -> int:
    if ref.isdigit():
        return int(ref)
    if not Path(ref).is_file():
        raise UsageError(f"{ref!r} is neither a program id nor a file")
    program, version = client.push_program(ref)
    print(f"pushed {ref} as program {program['id']} ({program['name']}) version {version}", file=sys.stderr)
    return program["id"]


def _login(url: str, key: str) -> Answer:
    me = Client(url, key).me()
    path = config_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch(mode=0o600, exist_ok=True)
    path.chmod(0o600)
    path.write_text(json.dumps({"url": url, "api_key": key}))
    data = {"url": url, "tenant": me.get("active_tenant"), "config": str(path)}
    return Answer(data, human=f"logged in to {url} (tenant {me.get('active_tenant')}); saved to {path}")


def _run_line(run: Run) -> str:
    return f"run {run['id']} {run['status']} (program {run['program']} version {run['version']})"


def _run(client: Client, opts: argparse.Namespace, as_json: bool) -> Answer:
    if opts.verbose and not opts.follow:
        raise UsageError("-v/--verbose says more about a followed run: use it with --follow")
    args, limits = _json_object("--args", opts.args), _json_object("--limits", opts.limits)
    program = _program_id(client, opts.program)
    run = client.create_run(program, args, limits, opts.idempotency_key)
    if not opts.follow:
        return Answer(run, human=_run_line(run), compact=True)
    if as_json:
        print(json.dumps({"event": "created", "data": run}), flush=True)
    else:
        print(_run_line(run), file=sys.stderr, flush=True)
    return Answer(code=follow(client, run["id"], as_json, sys.stdout, sys.stderr, sys.stdin, opts.verbose))


def _dispatch(client: Client, opts: argparse.Namespace, as_json: bool) -> Answer:
    command, action = opts.command, getattr(opts, "action", None)
    if command == "programs":
        if action == "ls":
            return Answer(client.list_programs(), table="programs")
        if action == "rm":
            name = client.delete_program(opts.program)["name"]
            return Answer({"deleted": name}, human=f"deleted program {name}")
        program, version = client.push_program(opts.path, opts.name)
        data = {"program": program["id"], "name": program["name"], "version": version}
        return Answer(data, human=f"program {program['id']} ({program['name']}) version {version}")
    if command == "run":
        return _run(client, opts, as_json)
    if command == "runs" and action == "ls":
        return Answer(client.list_runs(opts.status, opts.program, opts.limit, opts.parent), table="runs")
    if command in ("get", "runs"):
        run = client.get_run(opts.run_id)
        return Answer(run, human=output.run_record(run))
    if command == "cancel":
        run = client.cancel_run(opts.run_id)
        return Answer(run, human=_run_line(run))
    if command in ("follow", "events"):
        return Answer(code=follow(client, opts.run_id, as_json, sys.stdout, sys.stderr, sys.stdin, opts.verbose))
    if command == "logs":
        logs = client.run_logs(opts.run_id)
        if as_json:
            return Answer(logs)
        sys.stdout.write(logs["stdout"])
        sys.stderr.write(logs["stderr"])
        if logs["truncated"]:
            print("(output truncated: only its tail is kept)", file=sys.stderr)
        return Answer()
    if command == "trace":
        if opts.chrome:
            events = client.run_trace_chrome(opts.run_id)  # JSON whatever the output mode: it is a file
            return Answer(events, human=json.dumps(events), compact=True)
        trace = client.run_trace(opts.run_id)
        return Answer(trace, human=output.trace_summary(trace))
    if command == "kv":
        if action == "ls":
            return Answer(client.list_kv_files(), table="kv")
        client.delete_kv_file(opts.name)
        return Answer({"deleted": opts.name}, human=f"deleted KV file {opts.name}")
    return Answer({**client.quota(), **client.usage(opts.group_by)})


def _print(answer: Answer, as_json: bool) -> None:
    if answer.data is None and answer.human is None:
        return
    if as_json:
        print(output.as_json(answer.data, compact=answer.compact))
    elif answer.human is not None:
        print(answer.human)
    elif answer.table is not None:
        print(output.table(answer.data, answer.table))
    else:
        print(output.record(answer.data))


def _output(opts: argparse.Namespace) -> str:
    """``--json``/``--human`` when given. Otherwise what the program printed (``logs``,
    ``follow``, ``run --follow``) is text, so ``> answer.txt`` keeps just that, and every other
    answer is a table on a terminal and JSON in a pipe (what scripts read)."""
    if opts.output:
        return opts.output
    if opts.command in ("logs", "follow", "events") or (opts.command == "run" and opts.follow):
        return "human"
    return "human" if sys.stdout.isatty() else "json"


def main(argv: list[str] | None = None) -> int:
    opts = _parser().parse_args(argv)
    as_json = _output(opts) == "json"
    saved = _saved()
    url = opts.url or os.environ.get("SYMPHONY_URL") or saved.get("url") or DEFAULT_URL
    key = opts.api_key or os.environ.get("SYMPHONY_API_KEY") or saved.get("api_key")
    if not key:
        print("error: no API key: run `symphony login --api-key sk_...` or set SYMPHONY_API_KEY", file=sys.stderr)
        return EXIT_USAGE
    try:
        if opts.command == "login":
            answer = _login(url, key)
        else:
            with Client(url, key) as client:
                answer = _dispatch(client, opts, as_json)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except ApiError as exc:
        print(f"error: {exc.message if exc.status == 0 else exc}", file=sys.stderr)  # 0: no HTTP answer
        return EXIT_ERROR
    except httpx.HTTPError as exc:
        print(f"error: cannot reach {url}: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    _print(answer, as_json)
    return answer.code


if __name__ == "__main__":
    sys.exit(main())
