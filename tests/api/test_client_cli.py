"""The ``symphony`` CLI against the real ASGI app: login (saved 0600), programs push (new program,
then a new version), idempotent run, events, cancel, kv ls/rm, usage, and clear errors."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys

import pytest

from api.models import KVFile, ProgramVersion, Run
from api.services.runs import publish_event
from tests.conftest import ROOT

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.integration]


@pytest.fixture
def cli(tmp_path, settings):
    settings.SYMPHONY_WORKER_ADMIN_SOCKET = str(tmp_path / "absent.sock")
    config = tmp_path / "config.json"

    def run(*argv: str, key: str | None = None, url: str | None = None) -> subprocess.CompletedProcess:
        env = {k: v for k, v in os.environ.items() if not k.startswith("SYMPHONY_")}
        env.update(PYTHONPATH=str(ROOT / "client"), SYMPHONY_CONFIG=str(config))
        flags = [*(["--url", url] if url else []), *(["--api-key", key] if key else [])]
        cmd = [sys.executable, "-m", "symphony_client", *flags, *argv]
        return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)

    run.config = config
    return run


def test_cli_round_trip(cli, api_asgi_server, api_tenant_a, tmp_path):
    assert cli("programs", "ls").returncode == 2  # no key anywhere yet
    # As the README writes it: the flags after the command (before it works too, see `cli`).
    login = cli("login", "--url", api_asgi_server, "--api-key", api_tenant_a.key_secret)
    assert login.returncode == 0, login.stderr
    assert json.loads(cli.config.read_text()) == {"url": api_asgi_server, "api_key": api_tenant_a.key_secret}
    assert stat.S_IMODE(cli.config.stat().st_mode) == 0o600

    source = tmp_path / "hello.py"
    source.write_text("def main(args):\n    return args\n")
    first = json.loads(cli("programs", "push", str(source)).stdout)
    source.write_text("def main(args):\n    return {'v': 2}\n")
    second = json.loads(cli("programs", "push", str(source)).stdout)
    unchanged = json.loads(cli("programs", "push", str(source)).stdout)
    assert (first["name"], first["version"], second["version"], unchanged["version"]) == ("hello", 1, 2, 2)
    assert second["program"] == first["program"]
    assert ProgramVersion.objects.filter(program_id=first["program"]).count() == 2  # same bytes: no new version
    assert [p["name"] for p in json.loads(cli("programs", "ls").stdout)] == ["hello"]

    run_one = cli("run", str(first["program"]), "--args", '{"x": 1}', "--idempotency-key", "k1")
    again = cli("run", str(first["program"]), "--idempotency-key", "k1")
    run_id = json.loads(run_one.stdout)["id"]
    assert json.loads(again.stdout)["id"] == run_id and Run.objects.count() == 1
    publish_event(run_id, "token", {"text": "Hi"})
    publish_event(run_id, "end", {"status": "succeeded"})
    events = cli("events", run_id)
    assert events.stdout.startswith("Hi") and '"event": "end"' in events.stdout
    assert json.loads(cli("cancel", run_id).stdout)["status"] == "cancelled"

    KVFile.objects.create(tenant=api_tenant_a.tenant, worker="local", name="doc", residency="disk")
    assert [kv["name"] for kv in json.loads(cli("kv", "ls").stdout)] == ["doc"]
    missing = cli("kv", "rm", "nope")
    assert missing.returncode == 1 and "no KV file named 'nope'" in missing.stderr
    usage = json.loads(cli("usage").stdout)
    assert usage["plan"] == "free" and "days" in usage
    grouped = json.loads(cli("usage", "--group-by", "program").stdout)  # the one run was cancelled unstarted
    assert grouped["plan"] == "free" and grouped["groups"] == [] and "groups" not in usage

    # The run was cancelled before it started: the program goes, and the run with it.
    assert json.loads(cli("programs", "rm", "hello").stdout) == {"deleted": "hello"}
    assert cli("programs", "ls").stdout.strip() == "[]" and not Run.objects.filter(pk=run_id).exists()
    gone = cli("programs", "rm", "hello")
    assert gone.returncode == 1 and "no program named or numbered 'hello'" in gone.stderr

    bad = cli("get", run_id, key="sk_bad_bad")
    assert bad.returncode == 1 and "401" in bad.stderr
    unreachable = cli("programs", "ls", url="http://127.0.0.1:9")
    assert unreachable.returncode == 1 and "cannot reach" in unreachable.stderr


def test_client_meets_the_tenant_request_rate_of_the_real_app(api_asgi_server, api_tenant_a):
    """The real server's 429 is what the client's retry logic reads (tests/unit/test_client_throttle.py)."""
    from django.core.cache import cache

    from api.models import Plan
    from symphony_client import ApiError, Client

    cache.clear()
    Plan.objects.create(name="two-a-minute", api_requests_per_minute=2)
    api_tenant_a.tenant.plan = "two-a-minute"
    api_tenant_a.tenant.save(update_fields=["plan"])
    client = Client(api_asgi_server, api_tenant_a.key_secret, throttle_wait_s=0)
    assert client.quota()["limits"]["api_requests_per_minute"] == 2
    client.list_programs()
    with pytest.raises(ApiError) as refused:
        client.list_programs()
    assert (refused.value.status, refused.value.code) == (429, "throttled")
    assert "allows 2 API requests per minute" in refused.value.message
    cache.clear()
