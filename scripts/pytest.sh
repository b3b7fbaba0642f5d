#!/usr/bin/env bash
# Run pytest and refuse to call "no tests collected" (exit 5) a success: it means the suite
# silently lost its tests, which must fail CI loudly.
set -uo pipefail
cd "$(dirname "$0")/.."
# Tasks the tests queue without a Celery worker of their own (tenant purges, mails) go to a queue
# that only tests use, emptied first: a stack's worker on the default queue never runs them
# against its own database.
export CELERY_DEFAULT_QUEUE="${CELERY_DEFAULT_QUEUE:-pytest-housekeeping}"
.venv/bin/python -m celery -A web purge -f -Q "$CELERY_DEFAULT_QUEUE" >/dev/null 2>&1 || true
.venv/bin/python -m pytest "$@"
rc=$?
if [ "$rc" -eq 5 ]; then
  echo "pytest collected no tests: treating as a failure" >&2
  exit 1
fi
exit "$rc"
