"""The run page's trace waterfall in real Chromium against the whole real stack (scenario
``traceWaterfall`` of tests/browser/console.mjs): a program that sleeps between two generations
runs through Celery, the gVisor sandbox and the worker on the tiny model; once it has ended the
waterfall ranks its sleep as the slowest operation with the longest bar, zooms and resets (by
mouse and keyboard), links the Chrome format, and fits a 390 px screen."""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.browser, pytest.mark.integration, pytest.mark.docker, pytest.mark.vllm, pytest.mark.slow]

SLEEP_S = 2.0
SLEEPY_LIP = f'''"""Generates, sleeps {SLEEP_S} s, generates again: the sleep is where its time goes."""

import symphony as sy


def main(args):
    kv = sy.kv_create()
    first = sy.generate(kv, sy.tokenize("The trace of a run shows"), max_tokens=3, stop=[])
    sy.sleep({SLEEP_S})
    second = sy.generate(kv, [], max_tokens=3, stop=[])
    return {{"tokens": first + second}}
'''


@pytest.fixture(autouse=True)
def _fresh_throttle_counters():
    """Sign-in shares the per-address ``auth`` throttle (see test_console.py)."""
    from django.core.cache import cache

    cache.clear()


def test_the_run_page_draws_the_runs_trace_as_a_waterfall(symphony_stack, browser):
    from django.contrib.auth import get_user_model

    from api.models import Membership, Program, Run, Tenant
    from api.services.programs import add_version

    tenant = Tenant.objects.create(name="Trace Co", slug="trace-co")
    user = get_user_model().objects.create_user(
        username="trace@example.com", email="trace@example.com", password="pw-trace-12345"
    )
    Membership.objects.create(user=user, tenant=tenant, role="owner")
    program = Program.objects.create(tenant=tenant, name="sleepy", description="Sleeps between two generations")
    add_version(program, "sleepy.py", SLEEPY_LIP.encode())

    result = browser(
        "traceWaterfall",
        timeout=400,
        baseUrl=symphony_stack,
        email="trace@example.com",
        password="pw-trace-12345",
        programName="sleepy",
        runTimeoutMs=300000,
    )
    run = Run.objects.get(tenant=tenant)
    assert result["status"] == "succeeded", (result, run.error)
    # While the run went on, the card said when its trace comes.
    assert "appears here when the run has ended" in result["whileRunning"], result["whileRunning"]

    # The sleep is the slowest operation, and its bar the longest of the operations' bars.
    bars = result["bars"]
    assert [b["name"] for b in bars].count("pred") >= 2, bars
    assert result["slowest"] == "sleep", bars
    assert bars[0]["name"] == "sleep" and bars[0]["rank"] == "1", bars
    assert bars[0]["width"] > bars[1]["width"], bars
    assert result["slowestText"].strip().startswith("Slowest 3 operations: sleep"), result["slowestText"]

    # A click zooms the axis to the sleep (its bar then nearly fills the track); reset restores.
    assert result["zoomedLabel"].startswith("Zoomed to sleep"), result["zoomedLabel"]
    assert result["sleepFill"] > 0.85, result["sleepFill"]
    assert result["rowsZoomed"] < result["rowsWhole"] == result["rowsReset"], result
    assert result["resetLabel"].startswith("Whole run"), result["resetLabel"]
    # The keyboard does the same: the arrow moved to the run's second row, Enter zoomed, Escape reset.
    assert result["focusedAfterArrow"] == "queued", result["focusedAfterArrow"]
    assert result["keyboardZoom"].startswith("Zoomed to queued"), result["keyboardZoom"]
    assert result["keyboardReset"].startswith("Whole run"), result["keyboardReset"]

    # The link downloads the Chrome trace-event JSON of this run (what Perfetto opens).
    assert result["downloadText"] == "Download trace (Chrome format)"
    assert result["downloadHref"] == f"/api/v1/runs/{run.pk}/trace?format=chrome"
    assert result["downloadName"] == f"run-{run.pk}-trace.json", result["downloadName"]
    assert result["chrome"]["sleep"] and result["chrome"]["unit"] == "ms", result["chrome"]
    assert result["chrome"]["events"] > len(bars), result["chrome"]
