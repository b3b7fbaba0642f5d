"""A run's sandbox resources are bounded by its plan, and past a bound it is refused, not
quietly lowered.

``limits.memory_mb`` took any integer: every plan's runs could ask for the sandbox's 4096 MiB,
and a larger value (or ``pids``/``output_limit_bytes`` past the sandbox's caps) was accepted and
silently cut at execution. Now the plan's ``max_memory_mb`` bounds memory and each cap is a 400
naming it. Through the real URL conf, serializers and PostgreSQL."""

from __future__ import annotations

import time

import pytest

from api.models import Plan, Program, Run
from api.services import programs
from api.services.execution import _resource

pytestmark = pytest.mark.django_db

CANARY_S = 5.0


@pytest.fixture
def program(api_tenant_a) -> Program:
    prog = Program.objects.create(tenant=api_tenant_a.tenant, name="p")
    programs.add_version(prog, "p.py", b"def main(args):\n    return args\n")
    return prog


def _run(tenant, program: Program, limits: dict):
    return tenant.key_client().post("/api/v1/runs", {"program": program.pk, "limits": limits}, format="json")


def _canary(tenant) -> None:
    started = time.monotonic()
    assert tenant.key_client().get("/api/v1/runs").status_code == 200
    assert time.monotonic() - started < CANARY_S


def test_memory_past_the_plan_is_a_400_naming_the_plans_limit(api_tenant_a, api_tenant_b, program):
    free = Plan.objects.get(name="free")
    assert api_tenant_a.tenant.plan == "free" and free.max_memory_mb == 1024
    refused = _run(api_tenant_a, program, {"memory_mb": 2048})
    assert refused.status_code == 400, refused.content
    error = refused.json()["error"]
    assert error["code"] == "invalid"
    assert "1024 MiB" in error["detail"]["limits"]["memory_mb"][0], error
    assert not Run.objects.exists()

    accepted = _run(api_tenant_a, program, {"memory_mb": 1024})
    assert accepted.status_code == 201 and accepted.json()["limits"]["memory_mb"] == 1024
    # A plan that allows more (pro: 4096) lets its tenants ask for it.
    api_tenant_a.tenant.plan = "pro"
    api_tenant_a.tenant.save(update_fields=["plan"])
    assert _run(api_tenant_a, program, {"memory_mb": 4096}).status_code == 201
    _canary(api_tenant_b)


@pytest.mark.parametrize(
    ("limits", "field"),
    [
        ({"memory_mb": 5000}, "memory_mb"),
        ({"pids": 5000}, "pids"),
        ({"output_limit_bytes": 1 << 40}, "output_limit_bytes"),
    ],
)
def test_past_the_sandboxs_caps_is_a_400_not_a_silent_cut(api_tenant_a, api_tenant_b, program, limits, field):
    response = _run(api_tenant_a, program, limits)
    assert response.status_code == 400, response.content
    assert field in response.json()["error"]["detail"]["limits"]
    assert not Run.objects.exists()
    _canary(api_tenant_b)


def test_a_plan_lowered_after_the_run_was_accepted_still_caps_its_sandbox():
    assert _resource({"memory_mb": 4096}, "memory_mb", plan_cap=1024) == 1024
    assert _resource({}, "memory_mb", plan_cap=1024) == 512
