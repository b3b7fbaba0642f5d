"""Control-plane fixtures: tenants with owners and API keys, and clients authenticated as them."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from django.conf import settings
from rest_framework.test import APIClient


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


@pytest.fixture
def api_tenant_a(db) -> ApiTenant:
    return _make_tenant("alpha")


@pytest.fixture
def api_tenant_b(db) -> ApiTenant:
    return _make_tenant("beta")


@pytest.fixture
def api_asgi_server() -> Iterator[str]:
    """The real ASGI app under uvicorn on a free port, on the test database; yields its base URL."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    db = settings.DATABASES["default"]
    env = {**os.environ, "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "web.asgi:application", "--port", str(port), "--log-level", "warning"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            break
        except OSError:
            if proc.poll() is not None:
                pytest.fail(f"uvicorn exited: {proc.stderr.read().decode()[-2000:]}")
            time.sleep(0.2)
    else:
        pytest.fail("uvicorn did not listen within 30 s")
    yield f"http://127.0.0.1:{port}"
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:  # a client left a stream open (a failed test's SSE reader)
        proc.kill()
        proc.wait()


@pytest.fixture
def worker_heartbeats(settings) -> Iterator:
    """``beat(info)`` writes a worker heartbeat in the worker's own format (gpu_worker.events)
    to a private Redis database, so workers running elsewhere on this machine stay out."""
    import json

    import redis

    from gpu_worker.events import HEARTBEAT_PREFIX

    settings.REDIS_URL = "redis://127.0.0.1:6379/9"
    client = redis.Redis.from_url(settings.REDIS_URL)
    client.flushdb()

    def beat(info: dict) -> None:
        client.set(HEARTBEAT_PREFIX + info["name"], json.dumps(info), ex=10)

    yield beat
    client.flushdb()
