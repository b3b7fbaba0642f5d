"""Redis runs bounded (``maxmemory``) and never evicts (``noeviction``) in every way the stack
starts it: ``make up`` (scripts/bootstrap.sh), compose and ElastiCache (Terraform); and a real
redis-server started with those flags, once full, refuses a write instead of dropping a counter
(docs/DEPLOY.md#redis-memory)."""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

import pytest
import redis
import yaml

from tests.conftest import wait_for
from tests.plugins.browser import free_port

ROOT = Path(__file__).resolve().parents[2]


def _bootstrap_redis_flags() -> list[str]:
    script = (ROOT / "scripts" / "bootstrap.sh").read_text()
    start = script[script.index("start_redis() {") :]
    command = re.search(r"redis-server --daemonize yes(.*?)--dir", start, re.S)[1].replace("\\\n", " ")
    return shlex.split(command.replace('"$REDIS_MAXMEMORY"', "512mb"))


def test_make_up_compose_and_terraform_bound_redis_without_eviction():
    flags = _bootstrap_redis_flags()
    assert flags[flags.index("--maxmemory") + 1] == "512mb"
    assert flags[flags.index("--maxmemory-policy") + 1] == "noeviction"
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    command = " ".join(compose["services"]["redis"]["command"])
    assert '--maxmemory "${REDIS_MAXMEMORY:-1gb}"' in command and "--maxmemory-policy noeviction" in command
    tf = (ROOT / "infra" / "terraform" / "database.tf").read_text()
    group = re.search(r'resource "aws_elasticache_parameter_group" "redis" \{(.*?)\n\}', tf, re.S)[1]
    assert re.search(r'name\s*=\s*"maxmemory-policy"\s*\n\s*value\s*=\s*"noeviction"', group)
    assert "parameter_group_name = aws_elasticache_parameter_group.redis.name" in tf


@pytest.fixture
def full_redis(tmp_path) -> redis.Redis:
    port = free_port()
    flags = [f if f != "512mb" else "4mb" for f in _bootstrap_redis_flags() if f not in ("::1", "-::1")]
    proc = subprocess.Popen(["redis-server", *flags[flags.index("--save") :], "--port", str(port), "--dir", tmp_path])
    client = redis.Redis(port=port)
    try:
        wait_for(lambda: _ping(client), 10, message="redis-server")
        yield client
    finally:
        proc.terminate()
        proc.wait(10)


def _ping(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.ConnectionError:
        return False


def test_a_full_redis_refuses_writes_and_keeps_its_counters(full_redis):
    full_redis.set("symphony:throttle", 7, ex=600)  # a counter with a TTL: what volatile-* evicts
    added = 0
    with pytest.raises(redis.exceptions.OutOfMemoryError, match="maxmemory"):
        while added < 10_000:  # bounded: 10,000 x 4 KB is ten times the 4 MB maxmemory
            full_redis.xadd("run:flood", {"type": "token", "data": "x" * 4096})
            added += 1
    assert added > 0 and full_redis.get("symphony:throttle") == b"7"
