"""Run the whole local stack in the foreground (``make up``).

Starts each long-running process of the stack, writes its PID to ``var/run/<name>.pid``,
prints the console URL and admin credentials, and on Ctrl-C (SIGINT) or SIGTERM stops exactly
the processes it started, by PID. ``make down`` uses the same PID files from another shell.
If any process exits on its own, the others are stopped too, so a half-running stack never
pretends to be up.

``SYMPHONY_WORKERS=N`` starts N local gpu_workers (scale-out on one machine, docs/DEPLOY.md):
the first is ``$SYMPHONY_WORKER_NAME`` (``local``) as with one, the others ``<name>-2`` ...
``<name>-N``, each with its own admin socket and sessions dir under ``var/run/<name>/`` and its
own Celery executor consuming only ``worker.<name>``; all share the KV store and are chosen
between by api/services/routing.py (``SYMPHONY_ROUTING`` must stay ``heartbeat``): a worker gets
runs once its gpu_worker heartbeats and its executor has announced itself, so the two may start
in any order. Adding, draining and removing a worker of a running stack: docs/DEPLOY.md.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV_BIN = ROOT / ".venv" / "bin"
RUN_DIR = ROOT / "var" / "run"
LOG_DIR = ROOT / "var" / "log"


@dataclass(frozen=True)
class Service:
    name: str
    argv: list[str]
    #: Defaults for this process only; the caller's environment wins.
    env_defaults: dict[str, str] = field(default_factory=dict)
    #: Settings of this process that win over the caller's environment (an extra worker's own).
    env_overrides: dict[str, str] = field(default_factory=dict)
    #: A file that appears once the process serves (a gpu_worker's admin socket): ``up`` says so.
    ready_path: Path | None = None


def local_worker_count() -> int:
    raw = os.environ.get("SYMPHONY_WORKERS", "1").strip() or "1"
    if not raw.isdigit() or not 1 <= int(raw) <= 16:
        raise SystemExit(f"stack: SYMPHONY_WORKERS must be a number of local workers from 1 to 16, not {raw!r}")
    return int(raw)


def worker_services(python: str) -> list[Service]:
    """One gpu_worker and one Celery executor per local worker; the first also consumes the
    shared ``symphony`` queue and keeps the single-worker names and paths."""
    base = os.environ.get("SYMPHONY_WORKER_NAME", "local")
    out = []
    for index in range(1, local_worker_count() + 1):
        name = base if index == 1 else f"{base}-{index}"
        own: dict[str, str] = {}
        worker_argv = [python, "-m", "gpu_worker", "--name", name]
        if index > 1:
            run_dir = RUN_DIR / name
            own = {
                "SYMPHONY_WORKER_NAME": name,
                "SYMPHONY_WORKER_ADMIN_SOCKET": str(run_dir / "admin.sock"),
                "SYMPHONY_SESSIONS_DIR": str(run_dir / "sessions"),
            }
            worker_argv += ["--admin-socket", own["SYMPHONY_WORKER_ADMIN_SOCKET"]]
            worker_argv += ["--sessions-dir", own["SYMPHONY_SESSIONS_DIR"]]
        admin_socket = Path(
            own.get("SYMPHONY_WORKER_ADMIN_SOCKET")
            or os.environ.get("SYMPHONY_WORKER_ADMIN_SOCKET")
            or RUN_DIR / "worker-admin.sock"
        )
        suffix = "" if index == 1 else f"-{name}"
        queues = f"symphony,worker.{name}" if index == 1 else f"worker.{name}"
        out.append(Service(f"gpu_worker{suffix}", worker_argv, env_overrides=own, ready_path=admin_socket))
        out.append(
            Service(
                f"celery{suffix}",
                [
                    python,
                    "-m",
                    "celery",
                    "-A",
                    "web",
                    "worker",
                    "--loglevel=INFO",
                    "-Q",
                    queues,
                    "--concurrency",
                    os.environ.get("CELERY_CONCURRENCY", "4"),
                    "--hostname",
                    f"celery-{name}@%h",
                ],
                # One pre-started sandbox per Celery child (sandbox/pool.py): warm runs start in ~50 ms.
                env_defaults={"SYMPHONY_SANDBOX_POOL_SIZE": "1"},
                env_overrides=own,
            )
        )
    return out


def services() -> list[Service]:
    host = os.environ.get("SYMPHONY_HOST", "127.0.0.1")
    port = os.environ.get("SYMPHONY_PORT", "8000")
    python = str(VENV_BIN / "python")
    return [
        *worker_services(python),
        Service(
            "celery-beat",
            [python, "-m", "celery", "-A", "web", "beat", "--loglevel=INFO", "-s", str(ROOT / "var" / "celerybeat")],
        ),
        # X-Forwarded-For is Django's to judge (SYMPHONY_TRUSTED_PROXIES, api/client_address.py):
        # uvicorn would otherwise believe any loopback client's.
        Service(
            "web",
            [python, "-m", "uvicorn", "web.asgi:application", "--host", host, "--port", port, "--no-proxy-headers"],
        ),
    ]


def pid_file(name: str) -> Path:
    return RUN_DIR / f"{name}.pid"


def stop_pids(pids: dict[str, int], timeout: float = 20.0) -> None:
    """SIGTERM each process, wait, then SIGKILL the ones still alive."""
    for pid in pids.values():
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + timeout
    remaining = dict(pids)
    while remaining and time.monotonic() < deadline:
        for name, pid in list(remaining.items()):
            if not _alive(pid):
                remaining.pop(name)
        time.sleep(0.2)
    for name, pid in remaining.items():
        print(f"stack: {name} (pid {pid}) ignored SIGTERM; killing", file=sys.stderr)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for name in pids:
        pid_file(name).unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        waited, _ = os.waitpid(pid, os.WNOHANG)
        if waited == pid:
            return False
    except ChildProcessError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def down() -> int:
    """Stop a stack started by another ``make up`` using its PID files."""
    pids = {}
    for path in RUN_DIR.glob("*.pid"):
        try:
            pids[path.stem] = int(path.read_text().strip())
        except ValueError:
            path.unlink()
    if not pids:
        print("stack: nothing to stop")
        return 0
    stop_pids(pids)
    print("stack: stopped " + ", ".join(sorted(pids)))
    return 0


def up() -> int:
    RUN_DIR.mkdir(parents=True, exist_ok=True)
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    stale = [p for p in RUN_DIR.glob("*.pid") if _alive(int(p.read_text().strip() or 0))]
    if stale:
        print(f"stack: already running ({', '.join(p.stem for p in stale)}); `make down` first", file=sys.stderr)
        return 1
    procs: dict[str, subprocess.Popen] = {}
    stopping = False

    def handle_signal(signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, handle_signal)
    signal.signal(signal.SIGTERM, handle_signal)
    host = os.environ.get("SYMPHONY_HOST", "127.0.0.1")
    port = os.environ.get("SYMPHONY_PORT", "8000")
    # Links in mails (password reset, invitations) point at this console.
    os.environ.setdefault("SYMPHONY_PUBLIC_URL", f"http://{host}:{port}")
    #: Services that say when they serve (``ready_path``), not yet ready.
    waiting: dict[str, Path] = {}
    for service in services():
        if service.ready_path is not None:
            waiting[service.name] = service.ready_path
        log = open(LOG_DIR / f"{service.name}.log", "ab")
        env = {**service.env_defaults, **os.environ, **service.env_overrides}
        proc = subprocess.Popen(
            service.argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        procs[service.name] = proc
        pid_file(service.name).write_text(str(proc.pid))
        print(f"stack: started {service.name} pid={proc.pid} log=var/log/{service.name}.log")
    creds = ROOT / "var" / "admin-credentials.txt"
    print(f"\n  Symphony console: http://{host}:{port}/\n  Admin:            http://{host}:{port}/admin/")
    if not os.environ.get("SYMPHONY_EMAIL_URL"):
        print("  Mail:             written to var/mail/ (set SYMPHONY_EMAIL_URL to send over SMTP)")
    if creds.exists():
        print("  " + creds.read_text().strip().replace("\n", "\n  "))
    print("\n  Ctrl-C stops the stack.\n")
    started = time.monotonic()
    for name in waiting:
        print(
            f"stack: {name} starting (loading the model; the first start on a machine also compiles it, "
            "a few minutes); runs and requests sent meanwhile wait for it"
        )
    exit_code = 0
    while not stopping:
        for name, path in list(waiting.items()):
            if path.exists():
                print(f"stack: {name} ready after {time.monotonic() - started:.0f} s")
                del waiting[name]
        for name, proc in procs.items():
            if proc.poll() is not None:
                print(f"stack: {name} exited with {proc.returncode}; see var/log/{name}.log", file=sys.stderr)
                stopping = True
                exit_code = 1
                break
        time.sleep(0.5)
    print("stack: stopping")
    stop_pids({name: proc.pid for name, proc in procs.items()})
    return exit_code


if __name__ == "__main__":
    sys.exit(down() if sys.argv[1:] == ["down"] else up())
