"""``symphony`` CLI: log in once, push programs, run them with live output, manage KV files,
read usage.

    symphony login --url http://127.0.0.1:8000 --api-key sk_...
    symphony programs push prog.py            # new program, or next version of "prog"
    symphony run prog.py --args '{"prompt": "hi"}' --follow
    symphony logs RUN_ID                      # what the program printed (stdout, stderr)
    symphony kv ls | symphony kv rm NAME
    symphony usage

URL and key come from flags, else ``SYMPHONY_URL`` / ``SYMPHONY_API_KEY``, else the file that
``login`` writes (``$SYMPHONY_CONFIG`` or ``~/.config/symphony/config.json``, mode 0600).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import httpx

from symphony_client.client import ApiError, Client

DEFAULT_URL = "http://127.0.0.1:8000"


def config_path() -> Path:
    return Path(os.environ.get("SYMPHONY_CONFIG") or Path.home() / ".config" / "symphony" / "config.json")


def _saved() -> dict:
    try:
        return json.loads(config_path().read_text())
    except (OSError, ValueError):
        return {}


def _connection_flags(suppress: bool) -> argparse.ArgumentParser:
    """``--url``/``--api-key``, accepted before the command and after it (``symphony login
    --api-key ...`` as well as ``symphony --api-key ... login``). On the commands' parsers the
    defaults are suppressed, so a flag given before the command is not reset by them."""
    flags = argparse.ArgumentParser(add_help=False)
    default = argparse.SUPPRESS if suppress else None
    flags.add_argument("--url", default=default, help=f"API base URL (default: $SYMPHONY_URL, login, {DEFAULT_URL})")
    flags.add_argument("--api-key", default=default, help="API key (default: $SYMPHONY_API_KEY, login)")
    return flags


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="symphony",
        description="Symphony CLI: programs, runs, KV files, usage.",
        parents=[_connection_flags(suppress=False)],
    )
    command_flags = _connection_flags(suppress=True)
    sub = parser.add_subparsers(dest="command", required=True)

    def command(group: argparse._SubParsersAction, name: str, text: str) -> argparse.ArgumentParser:
        return group.add_parser(name, help=text, parents=[command_flags])

    command(sub, "login", "check the URL and key, then save them for later commands")

    programs = sub.add_parser("programs", help="list or push programs").add_subparsers(dest="action", required=True)
    command(programs, "ls", "list programs")
    push = command(programs, "push", "upload a .py or .zip (a new version if the name exists)")
    push.add_argument("path")
    push.add_argument("--name", help="program name (default: the file name without extension)")
    command(programs, "rm", "delete a program (by name or id) with its finished runs").add_argument("program")

    run = command(sub, "run", "start a run of a program id, or of a file (pushed first)")
    run.add_argument("program", help="program id, or path to a .py/.zip")
    run.add_argument("--args", default="{}", help="JSON object passed to main(args)")
    run.add_argument("--limits", default="{}", help='JSON, e.g. {"max_tokens": 512, "deadline_s": 60}')
    run.add_argument("--idempotency-key")
    run.add_argument("--follow", action="store_true", help="stream tokens and events until the run ends")
    for name, text in (
        ("get", "show a run"),
        ("cancel", "cancel a run"),
        ("events", "follow a run's events"),
        ("logs", "print what a run's program wrote to stdout and stderr"),
    ):
        command(sub, name, text).add_argument("run_id")

    kv = sub.add_parser("kv", help="persistent KV files").add_subparsers(dest="action", required=True)
    command(kv, "ls", "list KV files")
    command(kv, "rm", "delete a KV file").add_argument("name")
    usage = command(sub, "usage", "usage per day and quota")
    usage.add_argument("--group-by", choices=["program", "api_key"], help="also sum usage per program or API key")
    return parser


def _follow(client: Client, run_id: str) -> dict:
    """Print tokens as they stream, other events as JSON lines; returns the final run."""
    for event in client.events(run_id):
        if event.type == "token":
            sys.stdout.write(event.data.get("text", ""))
            sys.stdout.flush()
        else:
            print(json.dumps({"event": event.type, "data": event.data}))
    return client.get_run(run_id)


def _program_id(client: Client, ref: str) -> int:
    if ref.isdigit():
        return int(ref)
    program, version = client.push_program(ref)
    print(json.dumps({"pushed": program["name"], "program": program["id"], "version": version}), file=sys.stderr)
    return program["id"]


def _login(url: str, key: str) -> int:
    me = Client(url, key).me()
    path = config_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch(mode=0o600, exist_ok=True)
    path.chmod(0o600)
    path.write_text(json.dumps({"url": url, "api_key": key}))
    print(f"logged in to {url} (tenant {me.get('active_tenant')}); saved to {path}")
    return 0


def _dispatch(client: Client, opts: argparse.Namespace) -> object:
    command = opts.command
    if command == "programs":
        if opts.action == "ls":
            return client.list_programs()
        if opts.action == "rm":
            return {"deleted": client.delete_program(opts.program)["name"]}
        program, version = client.push_program(opts.path, opts.name)
        return {"program": program["id"], "name": program["name"], "version": version}
    if command == "run":
        program = _program_id(client, opts.program)
        args, limits = json.loads(opts.args), json.loads(opts.limits)
        run = client.create_run(program, args, limits, opts.idempotency_key)
        if not opts.follow:
            return run
        print(json.dumps({"run": run["id"], "status": run["status"]}))
        return _follow(client, run["id"])
    if command == "get":
        return client.get_run(opts.run_id)
    if command == "cancel":
        return client.cancel_run(opts.run_id)
    if command == "events":
        _follow(client, opts.run_id)
        return None
    if command == "logs":
        logs = client.run_logs(opts.run_id)
        sys.stdout.write(logs["stdout"])
        sys.stderr.write(logs["stderr"])
        if logs["truncated"]:
            print("(output truncated: only its tail is kept)", file=sys.stderr)
        return None
    if command == "kv":
        if opts.action == "ls":
            return client.list_kv_files()
        client.delete_kv_file(opts.name)
        return {"deleted": opts.name}
    return {**client.quota(), **client.usage(opts.group_by)}


def main(argv: list[str] | None = None) -> int:
    opts = _parser().parse_args(argv)
    saved = _saved()
    url = opts.url or os.environ.get("SYMPHONY_URL") or saved.get("url") or DEFAULT_URL
    key = opts.api_key or os.environ.get("SYMPHONY_API_KEY") or saved.get("api_key")
    if not key:
        print("error: no API key: run `symphony login --api-key sk_...` or set SYMPHONY_API_KEY", file=sys.stderr)
        return 2
    try:
        if opts.command == "login":
            return _login(url, key)
        client = Client(url, key)
        try:
            out = _dispatch(client, opts)
        finally:
            client.close()
    except ApiError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except httpx.HTTPError as exc:
        print(f"error: cannot reach {url}: {exc}", file=sys.stderr)
        return 1
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if out is not None:
        print(json.dumps(out, indent=None if opts.command == "run" else 2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
