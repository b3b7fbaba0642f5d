"""Container entrypoint of the Symphony images: derive connection URLs, then exec the command.

Deployments inject connection *parts* (host, user, password from a secret store) rather than
URLs, because a generated password may contain characters that break a URL. This builds, unless
already set:

* ``DATABASE_URL`` from ``DATABASE_HOST/PORT/NAME/USER/PASSWORD`` (+ ``DATABASE_SSLMODE``),
* ``REDIS_URL`` (db 0), ``CELERY_BROKER_URL`` (db 1), ``CELERY_RESULT_BACKEND`` (db 2) from
  ``REDIS_HOST/PORT/AUTH_TOKEN`` (``REDIS_TLS=1`` selects ``rediss://`` with verified certificates),

URL-encoding every secret, and then ``exec``s its arguments (PID 1 stays the service itself).
Nothing is printed: the values are secrets.
"""

from __future__ import annotations

import os
import sys
from urllib.parse import quote


def _q(value: str) -> str:
    return quote(value, safe="")


def database_url(env: dict[str, str]) -> str | None:
    host = env.get("DATABASE_HOST")
    if not host:
        return None
    user = _q(env.get("DATABASE_USER", "symphony"))
    password = env.get("DATABASE_PASSWORD", "")
    auth = f"{user}:{_q(password)}" if password else user
    url = f"postgres://{auth}@{host}:{env.get('DATABASE_PORT', '5432')}/{_q(env.get('DATABASE_NAME', 'symphony'))}"
    sslmode = env.get("DATABASE_SSLMODE")
    return f"{url}?sslmode={_q(sslmode)}" if sslmode else url


def redis_url(env: dict[str, str], db: int) -> str | None:
    host = env.get("REDIS_HOST")
    if not host:
        return None
    tls = env.get("REDIS_TLS", "0").strip().lower() in {"1", "true", "yes", "on"}
    token = env.get("REDIS_AUTH_TOKEN", "")
    auth = f":{_q(token)}@" if token else ""
    url = f"{'rediss' if tls else 'redis'}://{auth}{host}:{env.get('REDIS_PORT', '6379')}/{db}"
    return f"{url}?ssl_cert_reqs=required" if tls else url


def derive(env: dict[str, str]) -> dict[str, str]:
    """The URL variables to add to ``env`` (those not already set)."""
    out: dict[str, str] = {}
    candidates = {
        "DATABASE_URL": database_url(env),
        "REDIS_URL": redis_url(env, 0),
        "CELERY_BROKER_URL": redis_url(env, 1),
        "CELERY_RESULT_BACKEND": redis_url(env, 2),
    }
    for name, value in candidates.items():
        if value and not env.get(name):
            out[name] = value
    return out


def main(argv: list[str]) -> int:
    if not argv:
        print("entrypoint: no command given", file=sys.stderr)
        return 2
    os.environ.update(derive(dict(os.environ)))
    os.execvp(argv[0], argv)  # noqa: S606 - replacing this process with the service is the point
    return 127  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
