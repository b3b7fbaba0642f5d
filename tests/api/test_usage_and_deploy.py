"""Usage by day is tenant-scoped; the OpenAPI schema builds; production settings pass
``check --deploy``; auth endpoints are throttled against brute force."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys

import pytest
from django.core.cache import cache
from django.test import Client
from rest_framework.test import APIClient

from api.models import Program
from api.services import programs
from api.services.runs import RunOutcome, create_run, finish_run
from tests.conftest import ROOT, redis_db_url


@pytest.mark.django_db
def test_usage_by_day_sums_only_own_tenant(api_tenant_a, api_tenant_b):
    for owner, tokens in ((api_tenant_a, 5), (api_tenant_a, 7), (api_tenant_b, 100)):
        prog, _ = Program.objects.get_or_create(tenant=owner.tenant, name="p")
        programs.add_version(prog, "p.py", b"def main(a):\n    return 1\n")
        run, _ = create_run(owner.tenant, prog, None, {}, {})
        finish_run(str(run.pk), RunOutcome(status="succeeded", usage={"decode_tokens": tokens}))
    days = api_tenant_a.key_client().get("/api/v1/usage").json()["days"]
    assert len(days) == 1 and days[0]["decode_tokens"] == 12 and days[0]["runs"] == 2
    assert api_tenant_a.key_client().get("/api/v1/usage?from=bad").status_code == 400


@pytest.mark.django_db
def test_openapi_schema_builds(api_tenant_a):
    response = api_tenant_a.session_client().get("/api/schema/")
    assert response.status_code == 200 and b"/api/v1/runs" in response.content


@pytest.mark.django_db
def test_login_is_throttled(settings):
    cache.clear()
    client = APIClient()
    codes = [
        client.post("/api/v1/auth/login", {"email": "x@example.com", "password": "bad"}, format="json").status_code
        for _ in range(25)
    ]
    cache.clear()
    assert 429 in codes and codes[0] == 401


@pytest.mark.django_db
def test_api_key_guessing_is_refused_after_the_limit_even_for_a_valid_key(api_tenant_a):
    """A guesser gets 401 up to the limit, then 429 for every key, so a hit late in the window
    is not revealed; another address is unaffected, and the counter lives in the shared Redis
    cache (what every web process sees)."""
    cache.clear()
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Bearer sk_guess_" + "x" * 40)
    codes = [client.get("/api/v1/programs").status_code for _ in range(31)]
    assert codes[:30] == [401] * 30 and codes[30] == 429, codes
    valid = APIClient()
    valid.credentials(HTTP_AUTHORIZATION=f"Bearer {api_tenant_a.key_secret}")
    blocked = valid.get("/api/v1/programs")
    assert blocked.status_code == 429 and blocked.json()["error"]["code"] == "throttled"
    assert int(blocked.headers["Retry-After"]) >= 1
    assert valid.get("/api/v1/programs", REMOTE_ADDR="127.0.0.2").status_code == 200
    cache.clear()
    assert valid.get("/api/v1/programs").status_code == 200


@pytest.mark.django_db
def test_every_route_that_takes_a_key_shares_the_guessing_limit(api_tenant_a):
    """The OpenAI endpoints and the SSE events view are plain async views, not DRF: they count
    wrong keys into the same per-address window and refuse every key past it, each in its own
    error envelope, so none of them is an unthrottled oracle for the same secrets."""
    cache.clear()
    prog = Program.objects.create(tenant=api_tenant_a.tenant, name="p")
    programs.add_version(prog, "p.py", b"def main(a):\n    return 1\n")
    run, _ = create_run(api_tenant_a.tenant, prog, None, {}, {})
    events = f"/api/v1/runs/{run.pk}/events"
    guess = {"HTTP_AUTHORIZATION": "Bearer sk_guess_" + "x" * 40}
    client = Client()
    codes = [client.get("/v1/models", **guess).status_code for _ in range(20)]
    codes += [client.get(events, **guess).status_code for _ in range(10)]
    assert codes == [401] * 30, codes

    valid = {"HTTP_AUTHORIZATION": f"Bearer {api_tenant_a.key_secret}"}
    models = client.get("/v1/models", **valid)
    assert models.status_code == 429 and models.json()["error"]["code"] == "rate_limit_exceeded"
    assert int(models.headers["Retry-After"]) >= 1
    streamed = client.get(events, **valid)
    assert streamed.status_code == 429 and streamed.json()["error"]["code"] == "throttled"
    assert int(streamed.headers["Retry-After"]) >= 1
    assert client.get("/api/v1/programs", **valid).status_code == 429
    cache.clear()
    assert client.get("/v1/models", **valid).status_code == 200


def test_check_deploy_clean_with_production_env():
    # The settings are what this checks: the plans-against-pools check (api/checks.py) would
    # read the heartbeats of whatever test workers run now, so it gets a Redis database no
    # worker writes to (api/test_plan_checks.py covers that check).
    env = {
        **os.environ,
        "DJANGO_DEBUG": "0",
        "DJANGO_SECRET_KEY": secrets.token_urlsafe(50),
        "REDIS_URL": redis_db_url(12),
    }
    proc = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.django_db
def test_staff_tenants_is_staff_only(api_tenant_a, api_tenant_b):
    assert api_tenant_a.key_client().get("/api/v1/admin/tenants").status_code == 403
    assert api_tenant_a.session_client().get("/api/v1/admin/tenants").status_code == 403
    api_tenant_b.user.is_staff = True
    api_tenant_b.user.save()
    slugs = [t["slug"] for t in api_tenant_b.session_client().get("/api/v1/admin/tenants").json()]
    assert slugs == ["alpha", "beta"]


@pytest.mark.django_db
def test_invoice_lines_follow_price_sheet(api_tenant_a, api_tenant_b):
    prog = Program.objects.create(tenant=api_tenant_a.tenant, name="p")
    programs.add_version(prog, "p.py", b"def main(a):\n    return 1\n")
    run, _ = create_run(api_tenant_a.tenant, prog, None, {}, {})
    finish_run(
        str(run.pk), RunOutcome(status="succeeded", usage={"decode_tokens": 2_000_000, "prefill_tokens": 50_000})
    )
    client = api_tenant_a.key_client()
    invoices = client.get("/api/v1/invoices").json()
    assert len(invoices) == 1
    month = invoices[0]["id"]
    detail = client.get(f"/api/v1/invoices/{month}").json()
    lines = {line["item"]: line for line in detail["lines"]}
    assert lines["decode_tokens"]["amount"] == "0.800000" and lines["prefill_tokens"]["amount"] == "0.005000"
    assert detail["total"] == "0.805000" and detail["runs"] == 1
    assert detail["days"] == [{"day": detail["days"][0]["day"], "runs": 1, "amount": "0.805000"}]
    assert api_tenant_b.key_client().get(f"/api/v1/invoices/{month}").json()["total"] == "0.000000"
    assert client.get("/api/v1/invoices/2026-13").status_code == 404


def test_stored_kv_is_billed_once_per_period_and_is_not_a_run(api_tenant_a, api_tenant_b, settings):
    import redis

    from api.models import KVFile
    from api.services.billing import KV_METER_PERIOD_S, invoice, meter_kv_storage, usage_by_day

    settings.REDIS_URL = redis_db_url(9)
    redis.Redis.from_url(settings.REDIS_URL).flushdb()
    KVFile.objects.create(tenant=api_tenant_a.tenant, worker="w", name="a", residency="disk", bytes=3 << 30)
    KVFile.objects.create(tenant=api_tenant_a.tenant, worker="w", name="b", residency="host", bytes=1 << 30)
    KVFile.objects.create(tenant=api_tenant_b.tenant, worker="w", name="empty", residency="disk", bytes=0)
    now = 1_800_000_000.0
    assert meter_kv_storage(now) == 1
    assert meter_kv_storage(now + 1) == 0, "the same period must not be billed twice"
    assert meter_kv_storage(now + KV_METER_PERIOD_S) == 1
    (day,) = usage_by_day(api_tenant_a.tenant)
    assert day["runs"] == 0
    assert day["kv_gib_hours"] == pytest.approx(2 * 4 * KV_METER_PERIOD_S / 3600)
    lines = {line["item"]: line for line in invoice(api_tenant_a.tenant, day["day"][:7])["lines"]}
    assert float(lines["kv_gib_hours"]["quantity"]) == pytest.approx(day["kv_gib_hours"])
    assert usage_by_day(api_tenant_b.tenant) == []
    redis.Redis.from_url(settings.REDIS_URL).flushdb()


@pytest.mark.django_db
def test_usage_grouped_by_program_and_by_api_key(api_tenant_a, api_tenant_b):
    """Which program and which key used what: runs summed per group over the range, console runs
    (no key) and stored KV files (no run) as their own rows, another tenant's usage nowhere."""
    from api.models import UsageRecord
    from api.services.keys import issue_key

    tenant = api_tenant_a.tenant
    chat, batch = (Program.objects.create(tenant=tenant, name=n) for n in ("chat", "batch"))
    for prog in (chat, batch):
        programs.add_version(prog, "p.py", b"def main(a):\n    return 1\n")
    ci_key = issue_key(tenant, "ci", ["runs"]).key
    for prog, key, decode in ((chat, ci_key, 10), (chat, ci_key, 5), (batch, None, 100), (chat, None, 1)):
        run, _ = create_run(tenant, prog, None, {}, {}, api_key=key)
        finish_run(str(run.pk), RunOutcome(status="succeeded", usage={"decode_tokens": decode, "prefill_tokens": 2}))
    UsageRecord.objects.create(tenant=tenant, kv_gib_hours=0.5)  # the storage meter's row
    other = Program.objects.create(tenant=api_tenant_b.tenant, name="chat")
    programs.add_version(other, "p.py", b"def main(a):\n    return 1\n")
    run, _ = create_run(api_tenant_b.tenant, other, None, {}, {})
    finish_run(str(run.pk), RunOutcome(status="succeeded", usage={"decode_tokens": 999}))

    client = api_tenant_a.key_client()
    by_program = client.get("/api/v1/usage?group_by=program").json()["groups"]
    assert [(g["kind"], g["name"], g["runs"], g["decode_tokens"]) for g in by_program] == [
        ("program", "batch", 1, 100),
        ("program", "chat", 3, 16),
        ("storage", None, 0, 0),
    ]
    assert by_program[-1]["kv_gib_hours"] == 0.5
    by_key = client.get("/api/v1/usage?group_by=api_key").json()["groups"]
    assert [(g["kind"], g["name"], g["runs"], g["decode_tokens"]) for g in by_key] == [
        ("console", None, 2, 101),
        ("api_key", "ci", 2, 15),
        ("storage", None, 0, 0),
    ]
    assert by_key[1]["prefix"] == ci_key.prefix and by_key[1]["id"] == ci_key.pk
    plain = client.get("/api/v1/usage").json()
    assert "groups" not in plain and sum(d["decode_tokens"] for d in plain["days"]) == 116
    assert client.get("/api/v1/usage?group_by=tenant").status_code == 400
