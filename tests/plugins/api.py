"""Control-plane fixtures: tenants with owners and API keys, and clients authenticated as them."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from rest_framework.test import APIClient

from tests.conftest import redis_db_url


@dataclass
class ApiTenant:
    tenant: object
    user: object
    key_secret: str

    def key_client(self) -> APIClient:
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {self.key_secret}")
        return client

    def session_client(self) -> APIClient:
        client = APIClient()
        client.force_login(self.user)
        return client


def _make_tenant(slug: str) -> ApiTenant:
    from django.contrib.auth import get_user_model

    from api.models import Membership, Tenant
    from api.services.keys import issue_key
    from api.tenancy import KEY_SCOPES

    tenant = Tenant.objects.create(name=slug.title(), slug=slug)
    user = get_user_model().objects.create_user(
        username=f"{slug}@example.com", email=f"{slug}@example.com", password="pw-12345678"
    )
    Membership.objects.create(user=user, tenant=tenant, role="owner")
    return ApiTenant(tenant=tenant, user=user, key_secret=issue_key(tenant, "test", list(KEY_SCOPES), user).secret)


def second_tenant_of(owner: ApiTenant, slug: str) -> ApiTenant:
    """Another tenant created by ``owner``'s user, on the same plan, with a key of its own; both
    tenants then count against that user's account (``Tenant.account_key``), as two tenants one
    person made in the console do."""
    from api.models import Membership, Tenant
    from api.services.keys import issue_key
    from api.tenancy import KEY_SCOPES

    user = owner.user
    Tenant.objects.filter(pk=owner.tenant.pk).update(account=user)
    owner.tenant.refresh_from_db()
    tenant = Tenant.objects.create(name=slug.title(), slug=slug, account=user, plan=owner.tenant.plan)
    Membership.objects.create(user=user, tenant=tenant, role="owner")
    return ApiTenant(tenant=tenant, user=user, key_secret=issue_key(tenant, "test", list(KEY_SCOPES), user).secret)


@pytest.fixture
def api_tenant_a(db) -> ApiTenant:
    return _make_tenant("alpha")


@pytest.fixture
def api_tenant_b(db) -> ApiTenant:
    return _make_tenant("beta")


@pytest.fixture
def api_asgi_server() -> Iterator[str]:
    """The real ASGI app under uvicorn on a free port, on the test database; yields its base URL."""
    from tests.plugins.browser import child_env_for_test_db, start_uvicorn, stop

    proc, url = start_uvicorn(child_env_for_test_db())
    yield url
    stop(proc, timeout=10)  # then killed: a client may have left a stream open (a failed test's SSE reader)


@pytest.fixture
def worker_heartbeats(settings) -> Iterator:
    """``beat(info)`` writes a worker heartbeat in the contract's format (gpu_worker.contracts)
    to a private Redis database, so workers running elsewhere on this machine stay out."""
    import redis

    from gpu_worker import contracts

    settings.REDIS_URL = redis_db_url(9)
    client = redis.Redis.from_url(settings.REDIS_URL)
    client.flushdb()

    def beat(info: dict, executor_slots: int = 4) -> None:
        """``executor_slots``: the slots of the executor announced for it (0: none consumes its queue)."""
        from api.services import executor_presence

        key = contracts.heartbeat_key(info["name"])
        client.set(key, contracts.encode_heartbeat(info), ex=contracts.HEARTBEAT_TTL_S)
        if executor_slots:
            executor_presence.announce([info["name"]], f"test@{info['name']}", executor_slots)

    yield beat
    client.flushdb()
