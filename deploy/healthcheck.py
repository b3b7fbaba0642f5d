"""Container health checks (docker compose, ECS): ``healthcheck.py web`` / ``healthcheck.py celery NAME``.

* ``web``: ``GET /api/v1/health`` on the local uvicorn must answer 200 (PostgreSQL and Redis
  reachable). It sends a Host from ``DJANGO_ALLOWED_HOSTS`` and ``X-Forwarded-Proto: https`` so
  that neither host validation nor the HTTPS redirect of production settings gets in the way.
* ``celery NAME``: the Celery worker ``NAME@<hostname>`` answers a broker ping.

The gpu_worker has its own probe: ``python -m gpu_worker health``.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import urllib.request


def check_web() -> int:
    hosts = [h.strip() for h in os.environ.get("DJANGO_ALLOWED_HOSTS", "localhost").split(",") if h.strip()]
    host = next((h.lstrip(".") for h in hosts if h != "*"), "localhost")
    port = os.environ.get("SYMPHONY_PORT", "8000")
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/api/v1/health",
        headers={"Host": host, "X-Forwarded-Proto": "https"},
    )
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:  # noqa: S310 - fixed http://127.0.0.1 URL
            return 0 if resp.status == 200 else 1
    except Exception as exc:
        print(f"web unhealthy: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1


def check_celery(name: str) -> int:
    destination = f"{name}@{socket.gethostname()}"
    cmd = [sys.executable, "-m", "celery", "-A", "web", "inspect", "ping"]
    cmd += ["--destination", destination, "--timeout", "10"]
    return subprocess.run(cmd, stdout=subprocess.DEVNULL, timeout=18, check=False).returncode


def main(argv: list[str]) -> int:
    if argv[:1] == ["web"]:
        return check_web()
    if argv[:1] == ["celery"] and len(argv) == 2:
        return check_celery(argv[1])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
