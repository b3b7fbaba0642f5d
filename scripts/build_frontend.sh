#!/usr/bin/env bash
# Build the React console (frontend/) into frontend/dist through a nodeenv that reuses the
# system Node (downloading Node binaries is not possible here), then run its Vitest suite.
#
#   scripts/build_frontend.sh          build + test when sources changed (stamp), else nothing
#   scripts/build_frontend.sh --force  rebuild and retest regardless of the stamp
#
# Steps: regenerate the OpenAPI schema from Django (drf-spectacular) and the TypeScript types
# from it (openapi-typescript), `npm ci` when package-lock.json changed, typecheck + `vite build`,
# `vitest run`. The stamp (frontend/dist/.build-stamp) is a hash of every input, so the script
# is idempotent and cheap when nothing changed.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
FRONTEND=$ROOT/frontend
NODEENV=$ROOT/.nodeenv
STAMP=$FRONTEND/dist/.build-stamp
FORCE=0
[ "${1:-}" = "--force" ] && FORCE=1

log() { echo "build_frontend: $*" >&2; }

# 1. nodeenv on top of the system node/npm.
if [ ! -x "$NODEENV/bin/node" ]; then
  command -v node >/dev/null || { log "system node is missing (scripts/bootstrap.sh installs it)"; exit 1; }
  log "creating nodeenv in .nodeenv (system node $(node --version))"
  .venv/bin/nodeenv --node=system "$NODEENV" >/dev/null
fi
export PATH="$NODEENV/bin:$PATH"
export NODE_PATH="$NODEENV/lib/node_modules"
export npm_config_update_notifier=false npm_config_fund=false npm_config_audit=false

# 2. OpenAPI schema from the Django API (committed, so the console builds without Django too).
#    Under CI (CI=true) the committed schema must be what the API generates: a drift fails the
#    build, as does a schema that cannot be generated; elsewhere the schema is updated in place.
CHECK_SCHEMA=0
[ "${CI:-}" = true ] && CHECK_SCHEMA=1
if [ -x .venv/bin/python ]; then
  tmp=$(mktemp)
  if DJANGO_SETTINGS_MODULE=web.settings .venv/bin/python manage.py spectacular --file "$tmp" 2>/dev/null; then
    if ! cmp -s "$tmp" "$FRONTEND/openapi/schema.yml"; then
      if [ "$CHECK_SCHEMA" = 1 ]; then
        log "ERROR: frontend/openapi/schema.yml is not what the API generates; run scripts/build_frontend.sh and commit it:"
        diff -u "$FRONTEND/openapi/schema.yml" "$tmp" | head -40 >&2 || true
        rm -f "$tmp"
        exit 1
      fi
      cp "$tmp" "$FRONTEND/openapi/schema.yml"
      log "OpenAPI schema updated"
    fi
  elif [ "$CHECK_SCHEMA" = 1 ]; then
    log "ERROR: the OpenAPI schema could not be generated (manage.py spectacular failed)"
    rm -f "$tmp"
    exit 1
  else
    log "warning: could not regenerate the OpenAPI schema; using the committed one"
  fi
  rm -f "$tmp"
fi

# 3. Hash every input; nothing to do when it matches the stamp of the last good build.
inputs_hash() {
  (
    cd "$FRONTEND"
    find src public openapi index.html ../examples/completion.py package.json package-lock.json tsconfig.json vite.config.ts \
      -type f ! -name 'schema.d.ts' 2>/dev/null | LC_ALL=C sort | xargs sha256sum
    node --version
  ) | sha256sum | cut -d' ' -f1
}
HASH=$(inputs_hash)
if [ "$FORCE" = 0 ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$HASH" ] && [ -f "$FRONTEND/dist/index.html" ]; then
  log "up to date (stamp $HASH)"
  exit 0
fi

cd "$FRONTEND"
# 4. Dependencies, exactly as locked; reinstalled only when the lockfile changed.
LOCK_HASH=$(sha256sum package-lock.json | cut -d' ' -f1)
if [ ! -f node_modules/.lock-hash ] || [ "$(cat node_modules/.lock-hash)" != "$LOCK_HASH" ]; then
  log "npm ci"
  npm ci --no-audit --no-fund --loglevel=error
  echo "$LOCK_HASH" > node_modules/.lock-hash
fi

# 5. Types from the schema (under CI, the committed ones must match), typecheck, bundle, tests.
npm run --silent gen:api >/dev/null
if [ "$CHECK_SCHEMA" = 1 ] && ! git -C "$ROOT" diff --quiet -- frontend/src/api/schema.d.ts; then
  log "ERROR: frontend/src/api/schema.d.ts is not what the schema generates; run scripts/build_frontend.sh and commit it"
  git -C "$ROOT" diff --stat -- frontend/src/api/schema.d.ts >&2
  exit 1
fi
log "typecheck + vite build"
npm run --silent build
log "vitest"
npm test --silent
echo "$HASH" > "$STAMP"
log "built frontend/dist (stamp $HASH)"
