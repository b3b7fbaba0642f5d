"""The sandbox entry point: ``python3 -m symphony.run /lip/program.py``.

Loads the LIP (a ``.py`` file, or a zip whose ``main`` module defines ``main``), reads its
arguments (JSON from ``SYMPHONY_ARGS_FILE`` or ``SYMPHONY_ARGS``), calls ``main(args)`` (awaited
if it is a coroutine function), reports the result to the worker with ``finish`` and prints one
result record on stdout for the launcher. Exit status: 0 success, 1 the program raised, 2 the
program could not be loaded or the session could not be reached.

The result record is a single line ``RESULT_MARKER + json`` written after everything the
program printed; the launcher separates it from the program's own output.

Warm mode (``python3 -m symphony.run --wait /run/symphony/control.sock``, used by
``sandbox/pool.py``): the SDK is imported first, then the runner connects to the pool slot's
control socket and blocks until the launcher sends one job line (``{"program", "token",
"run_id"}``). It reports ``{"event": "connected"}`` once its session ``hello`` succeeded (the
run's first syscall) and ``{"event": "done", "exit", "record"}`` (sha256 of the record line)
just before exiting, so the launcher need not wait for gVisor's teardown to know the run ended.
The program can write to that socket too: nothing on it is trusted more than stdout is.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import json
import os
import socket
import sys
import traceback
import types
from collections.abc import Callable
from typing import Any

RESULT_MARKER = "\x1esymphony-result:"
ENV_ARGS = "SYMPHONY_ARGS"
ENV_ARGS_FILE = "SYMPHONY_ARGS_FILE"
ENV_TOKEN = "SYMPHONY_TOKEN"  # noqa: S105 - the name of the variable, not a secret
ENV_RUN_ID = "SYMPHONY_RUN_ID"
#: A spawned run's entry, ``module:function`` (also read from ``entry.json`` next to the args file).
ENV_ENTRY = "SYMPHONY_ENTRY"
MAX_ERROR_CHARS = 8000

EXIT_OK = 0
EXIT_PROGRAM_FAILED = 1
EXIT_SETUP_FAILED = 2
#: Warm mode: the control socket closed without a job (the pool was closed or recycled it).
EXIT_NO_JOB = 3
MAX_JOB_BYTES = 64 * 1024


class SetupError(Exception):
    """The program or its arguments could not be loaded (not the program's own failure)."""


def load_args() -> Any:
    path = os.environ.get(ENV_ARGS_FILE)
    try:
        if path:
            with open(path, encoding="utf-8") as fh:
                return json.load(fh)
        raw = os.environ.get(ENV_ARGS)
        return json.loads(raw) if raw else {}
    except (OSError, ValueError) as exc:
        raise SetupError(f"cannot read program arguments: {exc}") from None


def load_entry() -> tuple[str, str]:
    """``(module, function)`` this run executes: a spawned run's entry (``entry.json`` staged
    next to the args, or ``SYMPHONY_ENTRY``), else ``("", "main")``: the program's own main.
    The control plane has checked and normalised it (``api/services/procs.py``)."""
    raw = os.environ.get(ENV_ENTRY, "")
    args_file = os.environ.get(ENV_ARGS_FILE)
    if args_file:
        path = os.path.join(os.path.dirname(args_file), "entry.json")
        try:
            with open(path, encoding="utf-8") as fh:
                raw = json.load(fh)
        except FileNotFoundError:
            pass
        except (OSError, ValueError) as exc:
            raise SetupError(f"cannot read the run's entry: {exc}") from None
    if not isinstance(raw, str):
        raise SetupError("the run's entry must be a string")
    module, _, function = raw.partition(":")
    return ("" if module == "self" else module), function or "main"


def _is_zip(path: str) -> bool:
    """Whether the program is a zip. ``zipfile`` is imported only for files that start like
    one (``PK``): importing it costs ~25 ms of a cold gVisor start, and most LIPs are one file."""
    with open(path, "rb") as fh:
        if fh.read(2) != b"PK":
            return False
    import zipfile

    return zipfile.is_zipfile(path)


def load_program(path: str, entry_module: str = "", function: str = "main") -> types.ModuleType:
    """Import the LIP: a zip is put on ``sys.path`` and its ``main`` module imported (or the
    spawned run's ``entry_module``); the module must define ``function``."""
    if not os.path.isfile(path):
        raise SetupError(f"program {path} does not exist")
    if _is_zip(path):
        sys.path.insert(0, path)
        name = entry_module or "main"
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:
                where = f"entry module {name}" if entry_module else "top-level main module (main.py or main/)"
                raise SetupError(f"zip program has no {where}") from None
            raise
    elif entry_module:
        raise SetupError(f"a single-file program has no module {entry_module!r} (spawn 'self:function' instead)")
    else:
        spec = importlib.util.spec_from_file_location("__lip__", path)
        if spec is None or spec.loader is None:
            raise SetupError(f"cannot load program {path}")
        module = importlib.util.module_from_spec(spec)
        sys.modules["__lip__"] = module
        spec.loader.exec_module(module)
    if not callable(getattr(module, function, None)):
        raise SetupError(f"program defines no {function}(args) function")
    return module


def call_main(module: types.ModuleType, args: Any, function: str = "main") -> Any:
    fn = getattr(module, function)
    if inspect.iscoroutinefunction(fn):
        import asyncio  # only for async programs: ~50 ms of a cold gVisor start otherwise

        return asyncio.run(fn(args))
    return fn(args)


def error_summary(exc: BaseException) -> str:
    """``Type: message`` plus the program's own last frames (no SDK or stdlib frames; bounded)."""
    import sysconfig  # here, not at the top: every cold start would pay for it

    skip = (os.path.dirname(os.path.abspath(__file__)), sysconfig.get_paths()["stdlib"])
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not f.filename.startswith(skip)]
    lines = [f"{type(exc).__name__}: {exc}"]
    if frames:
        lines.append("Traceback (most recent call last):")
        lines.extend(traceback.format_list(frames[-8:]))
    text = "\n".join(line.rstrip("\n") for line in lines)
    return text[:MAX_ERROR_CHARS]


def emit_record(fd: int, record: dict[str, Any]) -> bytes:
    """Write the result record on the saved stdout fd (after flushing the program's output)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: S110 - a program may have replaced or closed its streams
            pass
    line = (RESULT_MARKER + json.dumps(record, separators=(",", ":"), default=str) + "\n").encode()
    data = b"\n" + line
    while data:
        data = data[os.write(fd, data) :]
    return line


def _finish(session: Any, result: Any, error: str | None) -> str | None:
    """Send ``finish``; returns an error message if the worker refused it."""
    if session is None:
        return None
    try:
        session.finish(result, error)
    except Exception as exc:
        return f"finish failed: {exc}"
    return None


def run(path: str, on_connected: Callable[[], None] | None = None, records: list[bytes] | None = None) -> int:
    """Run the program at ``path``; ``records`` (if given) receives the result record line."""
    out_fd = os.dup(1)
    session = None
    import symphony
    from symphony import checks

    def emit(record: dict[str, Any]) -> None:
        line = emit_record(out_fd, record)
        if records is not None:
            records.append(line)

    try:
        args = load_args()
        entry_module, function = load_entry()
        session = symphony.connect()
        symphony.set_session(session)
        if on_connected is not None:
            on_connected()
        module = load_program(path, entry_module, function)
    except Exception as exc:
        msg = str(exc) if isinstance(exc, SetupError | symphony.SymphonyError) else error_summary(exc)
        _finish(session, None, msg)
        emit({"ok": False, "error": msg, "setup": True})
        return EXIT_SETUP_FAILED
    try:
        result = call_main(module, args, function)
        result = checks.json_keys(result, "finish", "result")  # {1: "a"} is {"1": "a"}, as in JSON
        json.dumps(result, allow_nan=False)  # the result must be JSON: fail here, clearly, not later
    except SystemExit as exc:
        if exc.code in (None, 0):
            result = None
        else:
            msg = f"program exited with status {exc.code!r}"
            _finish(session, None, msg)
            emit({"ok": False, "error": msg})
            return EXIT_PROGRAM_FAILED
    except BaseException as exc:
        msg = error_summary(exc)
        not_json = "JSON serializable" in str(exc) or "JSON compliant" in str(exc)
        if isinstance(exc, TypeError | ValueError) and not_json:
            msg = f"main() returned a value that is not JSON: {exc}"
        _finish(session, None, msg)
        emit({"ok": False, "error": msg})
        return EXIT_PROGRAM_FAILED
    refused = _finish(session, result, None)
    if refused is not None:
        emit({"ok": False, "error": refused})
        return EXIT_PROGRAM_FAILED
    emit({"ok": True, "result": result})
    return EXIT_OK


def _send(sock: socket.socket, message: dict[str, Any]) -> None:
    try:
        sock.sendall(json.dumps(message, separators=(",", ":")).encode() + b"\n")
    except OSError:
        pass  # the launcher went away or the program closed the socket; the exit still counts


def receive_job(control_path: str) -> tuple[socket.socket, dict[str, Any]] | None:
    """Connect to the slot's control socket and block until one job line arrives (None: no job)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(control_path)
    buf = bytearray()
    while b"\n" not in buf:
        chunk = sock.recv(4096)
        if not chunk or len(buf) > MAX_JOB_BYTES:
            sock.close()
            return None
        buf.extend(chunk)
    job = json.loads(bytes(buf).split(b"\n", 1)[0])
    return (sock, job) if isinstance(job, dict) else None


def run_warm(control_path: str) -> int:
    """Warm-pool entry: pre-import the SDK, wait for a job, run it (see the module docstring)."""
    import hashlib  # for the record's digest; imported here, before the job, not on the clock

    import symphony
    import symphony.aio  # noqa: F401 - imported before the job arrives: that is the point

    received = receive_job(control_path)
    if received is None:
        return EXIT_NO_JOB
    sock, job = received
    os.environ[ENV_TOKEN] = str(job.get("token", ""))
    os.environ[ENV_RUN_ID] = str(job.get("run_id", ""))
    records: list[bytes] = []
    code = run(str(job.get("program", "")), lambda: _send(sock, {"event": "connected"}), records)
    digest = hashlib.sha256(records[-1]).hexdigest() if records else None
    _send(sock, {"event": "done", "exit": code, "record": digest})
    return code


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) == 2 and argv[0] == "--wait":
        code = run_warm(argv[1])
    elif len(argv) == 1:
        code = run(argv[0])
    else:
        print("usage: python3 -m symphony.run PROGRAM(.py|.zip) | --wait CONTROL_SOCKET", file=sys.stderr)
        return EXIT_SETUP_FAILED
    # Daemon threads the program left behind must not keep the sandbox alive.
    sys.stdout.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
