#!/usr/bin/env bash
# Run pytest and refuse to call "no tests collected" (exit 5) a success: it means the suite
# silently lost its tests, which must fail CI loudly.
set -uo pipefail
cd "$(dirname "$0")/.."
.venv/bin/python -m pytest "$@"
rc=$?
if [ "$rc" -eq 5 ]; then
  echo "pytest collected no tests: treating as a failure" >&2
  exit 1
fi
exit "$rc"
