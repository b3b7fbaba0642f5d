"""The per-tenant request rate (plan.api_requests_per_minute, api/throttling.py), through the real
URL conf, the shared Redis cache and PostgreSQL: every key and member of a tenant draw from one
budget on the REST API, the run events stream and the OpenAI endpoints; another tenant is not
touched; the window slides (a minute boundary does not reset it); a cache outage lets requests through."""

from __future__ import annotations

import pytest
from django.core.cache import cache
from django.test import Client
from rest_framework.test import APIClient

from api import throttling
from api.models import Plan
from tests.api.test_metrics import scrape

pytestmark = pytest.mark.django_db

RUN_ID = "00000000-0000-0000-0000-000000000001"


@pytest.fixture(autouse=True)
def _fresh_counters():
    cache.clear()
    yield
    cache.clear()


def test_openai_durations() -> None:
    from api.throttling import openai_duration

    assert [openai_duration(s) for s in (0, 7, 59, 60, 61, 3600, 93784)] == [
        "0s",
        "7s",
        "59s",
        "1m0s",
        "1m1s",
        "1h0m0s",
        "26h3m4s",
    ]


def _on_plan(api_tenant, per_minute: int | None, name: str = "tiny") -> None:
    Plan.objects.update_or_create(name=name, defaults={"api_requests_per_minute": per_minute})
    api_tenant.tenant.plan = name
    api_tenant.tenant.save(update_fields=["plan"])


def test_keys_and_members_of_a_tenant_share_one_budget_and_others_are_untouched(api_tenant_a, api_tenant_b):
    _on_plan(api_tenant_a, 6)
    key, console = api_tenant_a.key_client(), api_tenant_a.session_client()
    answered = [key.get("/api/v1/programs") for _ in range(3)] + [console.get("/api/v1/runs") for _ in range(3)]
    assert [r.status_code for r in answered] == [200] * 6
    # Each answer says where the tenant stands, so a client can slow down before it is refused.
    assert [r["RateLimit-Remaining"] for r in answered] == ["5", "4", "3", "2", "1", "0"]
    assert {r["RateLimit-Limit"] for r in answered} == {"6"}
    assert all(1 <= int(r["RateLimit-Reset"]) <= 60 for r in answered)

    refused = key.get("/api/v1/programs")
    assert refused.status_code == 429
    assert refused.json()["error"]["code"] == "throttled"
    assert "allows 6 API requests per minute" in refused.json()["error"]["message"]
    assert 1 <= int(refused["Retry-After"]) <= 60
    assert refused["RateLimit-Remaining"] == "0" and refused["RateLimit-Reset"] == refused["Retry-After"]
    assert console.get("/api/v1/quota").status_code == 429  # the member shares it

    # The run events stream and the OpenAI endpoints draw from the same budget.
    events = key.get(f"/api/v1/runs/{RUN_ID}/events")
    assert events.status_code == 429 and events.json()["error"]["code"] == "throttled"
    assert 1 <= int(events["Retry-After"]) <= 60 and events["RateLimit-Limit"] == "6"
    models = key.get("/v1/models")
    assert models.status_code == 429
    assert models.json()["error"]["code"] == "rate_limit_exceeded" and models["Retry-After"]
    assert models["RateLimit-Remaining"] == "0"
    # OpenAI's names for the same figures, which the openai client's users read.
    assert models["x-ratelimit-limit-requests"] == "6" and models["x-ratelimit-remaining-requests"] == "0"
    from api.throttling import openai_duration

    assert models["x-ratelimit-reset-requests"] == openai_duration(int(models["RateLimit-Reset"]))

    other = api_tenant_b.key_client()  # the default free plan, its own budget
    assert [other.get("/api/v1/programs").status_code for _ in range(10)] == [200] * 10

    # Operators see the refusals (four above), summed over every web process.
    assert scrape(Client(REMOTE_ADDR="127.0.0.1"))["symphony_requests_throttled_total", ()] == 4


def test_the_window_slides_so_a_minute_boundary_does_not_reset_it(api_tenant_a, monkeypatch):
    _on_plan(api_tenant_a, 2)
    now = [60 * 16_667 + 50.0]  # 10 s before a minute boundary
    monkeypatch.setattr(throttling.time, "time", lambda: now[0])
    client = api_tenant_a.key_client()
    assert [client.get("/api/v1/programs").status_code for _ in range(3)] == [200, 200, 429]
    assert client.get("/api/v1/programs")["Retry-After"] == "60"
    now[0] += 40  # past the boundary, but both requests are less than a minute old
    refused = client.get("/api/v1/programs")
    assert refused.status_code == 429 and refused["Retry-After"] == "20"
    now[0] += 20  # the two requests have slid out
    assert client.get("/api/v1/programs").status_code == 200


def test_a_plan_without_a_rate_is_unlimited_and_anonymous_requests_are_not_counted(api_tenant_a):
    _on_plan(api_tenant_a, None, name="unmetered")
    client = api_tenant_a.key_client()
    answers = [client.get("/api/v1/programs") for _ in range(30)]
    assert all(r.status_code == 200 and "RateLimit-Limit" not in r for r in answers)
    _on_plan(api_tenant_a, 1)
    assert [APIClient().get("/api/v1/health").status_code for _ in range(3)] == [200] * 3
    assert "RateLimit-Limit" not in APIClient().get("/api/v1/programs")  # anonymous: 401, not counted
    assert client.get("/api/v1/programs").status_code == 200


def test_pro_gets_ten_times_the_free_rate():
    rates = dict(Plan.objects.values_list("name", "api_requests_per_minute"))
    assert rates["free"] == 600 and rates["pro"] == 6000


def test_a_cache_outage_lets_requests_through(api_tenant_a, settings):
    _on_plan(api_tenant_a, 1)
    settings.CACHES = {
        "default": {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": "redis://127.0.0.1:1/0"}
    }
    key, console = api_tenant_a.key_client(), api_tenant_a.session_client()
    assert [key.get("/api/v1/programs").status_code for _ in range(3)] == [200] * 3
    assert [console.get("/api/v1/programs").status_code for _ in range(3)] == [200] * 3
    assert APIClient(HTTP_AUTHORIZATION="Bearer sk_wrong_key").get("/api/v1/programs").status_code == 401


def test_the_tenants_of_one_account_share_one_budget(api_tenant_a, api_tenant_b):
    """A person's second tenant is no second budget: the requests of every tenant one user
    created count in one window; another person's tenant keeps its own."""
    from tests.plugins.api import second_tenant_of

    _on_plan(api_tenant_a, 4)
    twin = second_tenant_of(api_tenant_a, "alpha-twin")  # on the same plan
    first, second = api_tenant_a.key_client(), twin.key_client()
    answered = [client.get("/api/v1/programs") for client in (first, second, first, second)]
    assert [r.status_code for r in answered] == [200] * 4
    refused = second.get("/api/v1/programs")
    assert refused.status_code == 429
    assert "counted across every tenant of its account" in refused.json()["error"]["message"]
    _on_plan(api_tenant_b, 4)
    assert api_tenant_b.key_client().get("/api/v1/programs").status_code == 200
