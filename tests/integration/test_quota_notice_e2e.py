"""A quota notice through the whole real stack: a LIP's run on a real worker (gVisor sandbox,
tiny model) uses more tokens than the tenant's monthly quota; when the Celery executor records
its usage, the owners' notice is queued, and a housekeeping Celery worker mails it over SMTP to a
real server on 127.0.0.1. The next run is refused for the quota the mail warned about."""

from __future__ import annotations

import uuid

import pytest

from tests.conftest import celery_worker, wait_for
from tests.plugins.api import _make_tenant

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.integration,
    pytest.mark.docker,
    pytest.mark.vllm,
]

#: The API's default Celery queue in this module (the notice's mail task goes there).
HOUSEKEEPING_QUEUE = f"housekeeping-{uuid.uuid4().hex[:8]}"

PREFILL_LIP = b"""
from symphony import kv_create, pred


def main(args):
    kv = kv_create()
    pred(kv, list(range(100, 100 + args["tokens"])))
    return {"prefilled": args["tokens"]}
"""


@pytest.fixture(scope="module")
def stack_worker(gpu_worker_process):
    return gpu_worker_process


@pytest.fixture
def stack_env(smtp_sink) -> dict[str, str]:
    return {
        "CELERY_DEFAULT_QUEUE": HOUSEKEEPING_QUEUE,
        "SYMPHONY_EMAIL_URL": f"smtp://{smtp_sink.host}:{smtp_sink.port}",
        "SYMPHONY_PUBLIC_URL": "https://console.example.com",
    }


def _run(client, program: dict, tokens: int) -> dict:
    run = client.create_run(program["id"], args={"tokens": tokens})
    wait_for(lambda: client.get_run(run["id"])["status"] not in ("queued", "running"), timeout=120, message="the run")
    done = client.get_run(run["id"])
    assert done["status"] == "succeeded", done
    return done


def test_owners_are_mailed_at_80_and_100_percent_of_the_monthly_tokens(stack, smtp_sink, tmp_path):
    from api.models import Plan, QuotaNotice
    from symphony_client import ApiError, Client

    owner = _make_tenant(f"quota-{uuid.uuid4().hex[:6]}")
    Plan.objects.create(name="tiny-month", tokens_per_month=50, max_concurrent_runs=4)
    owner.tenant.plan = "tiny-month"
    owner.tenant.save()
    client = Client(stack, owner.key_secret, timeout=60)
    lip = tmp_path / "prefill.py"
    lip.write_bytes(PREFILL_LIP)
    program = client.upload_program(lip, name="prefill")

    def percents() -> list[int]:
        return sorted(QuotaNotice.objects.filter(tenant=owner.tenant).values_list("percent", flat=True))

    with celery_worker(HOUSEKEEPING_QUEUE, stack.env):
        _run(client, program, 42)  # 84% of 50
        wait_for(lambda: percents() == [80], timeout=30, message="the 80% notice")  # right after the usage
        warning = smtp_sink.wait_for(owner.user.email, "has used 80% of its monthly tokens")
        _run(client, program, 8)  # 100%
        wait_for(lambda: percents() == [80, 100], timeout=30, message="the 100% notice")
        used_up = smtp_sink.wait_for(owner.user.email, "has used 100% of its monthly tokens")

    body = warning.get_body(preferencelist=("plain",)).get_content()
    assert "has used 42 of the 50 tokens its plan (tiny-month) allows" in body
    assert "At 100%, new runs are refused" in body and "https://console.example.com/usage" in body
    assert "New runs are refused until" in used_up.get_body(preferencelist=("plain",)).get_content()
    assert len(smtp_sink.to(owner.user.email)) == 2

    with pytest.raises(ApiError) as refused:
        client.create_run(program["id"], args={"tokens": 4})
    assert refused.value.status == 429 and "monthly token quota" in str(refused.value)
