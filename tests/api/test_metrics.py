"""``GET /metrics``: worker figures from real Redis heartbeats (in the worker's own format),
run/tenant/KV figures from PostgreSQL, parsed back with Prometheus' own parser; and who may
read them (token, else loopback only). The end-to-end check against a live worker's heartbeat
is in tests/integration/test_run_e2e.py."""

from __future__ import annotations

import re
import time

import pytest
import yaml
from django.core.cache import cache
from django.test import Client
from prometheus_client.parser import text_string_to_metric_families

from api.models import KVFile, Program, Run
from api.services import programs
from api.services.runs import create_run
from tests.conftest import ROOT

pytestmark = pytest.mark.django_db


def scrape(client: Client, **headers: str) -> dict[tuple[str, tuple], float]:
    response = client.get("/metrics", **headers)
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain; version=")
    samples = {}
    for family in text_string_to_metric_families(response.content.decode()):
        for sample in family.samples:
            samples[sample.name, tuple(sorted(sample.labels.items()))] = sample.value
    return samples


def test_worker_runs_and_kv_figures(worker_heartbeats, api_tenant_a, api_tenant_b):
    worker_heartbeats(
        {
            "name": "w1",
            "ok": True,
            "at": time.time() - 2,
            "pages_total": 100,
            "pages_free": 40,
            "host_pages": 7,
            "disk_pages": 3,
            "sessions": 5,
            "events_dropped": 1,
            "metrics": {
                "forwards": 1200,
                "calls": 9000,
                "failed_calls": 2,
                "tokens": 50_000,
                "batch_occupancy": 0.75,
                "avg_items_per_forward": 7.5,
                "forward_ms_ema": 40.0,
                "queue_wait_ms_avg": 12.0,
                "gap_ms_avg": 4.0,
                "queued_calls": 3,
            },
        }
    )
    worker_heartbeats({"name": "sick", "ok": False, "pages_total": 10, "pages_free": 0, "sessions": 0, "metrics": {}})
    program = Program.objects.create(tenant=api_tenant_a.tenant, name="p")
    programs.add_version(program, "p.py", b"def main(a):\n    return 1\n")
    for status in ("queued", "succeeded", "succeeded", "failed"):
        run, _ = create_run(api_tenant_a.tenant, program, None, {}, {})
        Run.objects.filter(pk=run.pk).update(status=status)
    KVFile.objects.create(tenant=api_tenant_a.tenant, worker="w1", name="a", residency="device", bytes=1000)
    KVFile.objects.create(tenant=api_tenant_b.tenant, worker="w1", name="b", residency="device", bytes=500)
    KVFile.objects.create(tenant=api_tenant_b.tenant, worker="w1", name="c", residency="disk", bytes=7)

    m = scrape(Client(REMOTE_ADDR="127.0.0.1"))

    w1, sick = (("worker", "w1"),), (("worker", "sick"),)
    assert (m["symphony_worker_up", w1], m["symphony_worker_up", sick]) == (1.0, 0.0)
    assert 1.5 < m["symphony_worker_heartbeat_age_seconds", w1] < 60
    assert m["symphony_worker_kv_device_pages", w1] == 100 and m["symphony_worker_kv_device_pages_free", w1] == 40
    assert (m["symphony_worker_kv_host_pages", w1], m["symphony_worker_kv_disk_pages", w1]) == (7, 3)
    assert m["symphony_worker_sessions", w1] == 5
    assert m["symphony_worker_forwards_total", w1] == 1200 and m["symphony_worker_pred_calls_total", w1] == 9000
    assert m["symphony_worker_pred_calls_failed_total", w1] == 2
    assert m["symphony_worker_batched_tokens_total", w1] == 50_000
    assert m["symphony_worker_batch_occupancy_ratio", w1] == 0.75
    assert m["symphony_worker_forward_seconds", w1] == pytest.approx(0.040)
    assert m["symphony_worker_queue_wait_seconds_avg", w1] == pytest.approx(0.012)
    assert m["symphony_worker_gap_seconds_avg", w1] == pytest.approx(0.004)
    assert m["symphony_worker_queued_pred_calls", w1] == 3
    assert m["symphony_worker_events_dropped_total", w1] == 1
    assert ("symphony_worker_forwards_total", sick) not in m  # it reported none: no made-up zero

    assert m["symphony_runs", (("status", "queued"),)] == 1 and m["symphony_runs", (("status", "running"),)] == 0
    assert m["symphony_runs_finished_total", (("status", "succeeded"),)] == 2
    assert m["symphony_runs_finished_total", (("status", "failed"),)] == 1
    assert m["symphony_runs_finished_total", (("status", "cancelled"),)] == 0
    assert m["symphony_tenants", ()] == 2
    assert m["symphony_kv_files", (("residency", "device"),)] == 2
    assert m["symphony_kv_file_bytes", (("residency", "device"),)] == 1500
    assert m["symphony_kv_file_bytes", (("residency", "disk"),)] == 7


def test_without_a_token_only_loopback_may_read(worker_heartbeats, settings):
    settings.SYMPHONY_METRICS_TOKEN = ""
    assert Client(REMOTE_ADDR="::1").get("/metrics").status_code == 200
    refused = Client(REMOTE_ADDR="10.0.3.7").get("/metrics")
    assert refused.status_code == 403 and "SYMPHONY_METRICS_TOKEN" in refused.json()["error"]["message"]


def test_with_a_token_the_bearer_decides_and_the_host_header_does_not(worker_heartbeats, settings):
    settings.SYMPHONY_METRICS_TOKEN = "s3cret-token"
    remote = Client(REMOTE_ADDR="10.0.3.7")
    ok = remote.get("/metrics", HTTP_AUTHORIZATION="Bearer s3cret-token", HTTP_HOST="10.0.3.9:8000")
    assert ok.status_code == 200 and b"symphony_tenants" in ok.content  # a task's IP: not in ALLOWED_HOSTS
    for headers in ({}, {"HTTP_AUTHORIZATION": "Bearer wrong"}, {"HTTP_AUTHORIZATION": "s3cret-token"}):
        denied = Client(REMOTE_ADDR="127.0.0.1").get("/metrics", **headers)
        assert denied.status_code == 401 and denied["WWW-Authenticate"].startswith("Bearer"), headers
    post = remote.post("/metrics", HTTP_AUTHORIZATION="Bearer s3cret-token")
    assert post.status_code == 405 and post["Allow"] == "GET, HEAD"
    assert b"symphony_" not in Client().get("/metricsx").content  # the console's routes are untouched


def test_refused_credentials_are_counted_across_processes(worker_heartbeats, api_tenant_a):
    """Wrong keys, throttled keys and failed sign-ins are counted in the shared cache, so any web
    process's scrape shows the service's totals (what the guessing alerts watch)."""
    cache.clear()
    metrics = Client(REMOTE_ADDR="127.0.0.1")
    for reason in ("bad_api_key", "throttled_api_key", "bad_login"):
        assert scrape(metrics)["symphony_auth_failures_total", (("reason", reason),)] == 0
    guesser = Client(REMOTE_ADDR="10.0.3.7")
    for _ in range(31):
        guesser.get("/v1/models", HTTP_AUTHORIZATION="Bearer sk_guess_" + "x" * 40)
    Client().post("/api/v1/auth/login", {"email": "alpha@example.com", "password": "wrong"}, "application/json")
    m = scrape(metrics)
    assert m["symphony_auth_failures_total", (("reason", "bad_api_key"),)] == 30
    assert m["symphony_auth_failures_total", (("reason", "throttled_api_key"),)] == 1
    assert m["symphony_auth_failures_total", (("reason", "bad_login"),)] == 1
    cache.clear()


def test_the_shipped_alert_rules_name_only_series_the_service_exports(worker_heartbeats):
    """deploy/prometheus/alerts.yml: valid YAML in Prometheus' rule-file shape, and no rule
    watches a series that does not exist (a typo there would be an alert that never fires)."""
    scheduler = ("forwards", "calls", "failed_calls", "tokens", "batch_occupancy", "avg_items_per_forward")
    scheduler += ("forward_ms_ema", "queue_wait_ms_avg", "gap_ms_avg", "queued_calls")
    health = ("pages_total", "pages_free", "host_pages", "disk_pages", "sessions", "events_dropped")
    # A worker with every field a live one sends.
    heartbeat = {"name": "w1", "ok": True, "at": time.time(), **dict.fromkeys(health, 1)}
    worker_heartbeats({**heartbeat, "metrics": dict.fromkeys(scheduler, 1)})
    exported = {name for name, _ in scrape(Client(REMOTE_ADDR="127.0.0.1"))}
    rules = yaml.safe_load((ROOT / "deploy" / "prometheus" / "alerts.yml").read_text())
    alerts = [rule for group in rules["groups"] for rule in group["rules"]]
    assert alerts and all({"alert", "expr", "annotations"} <= rule.keys() for rule in alerts)
    named = {name for rule in alerts for name in re.findall(r"\bsymphony_\w+", rule["expr"])}
    assert named and named <= exported, named - exported
    config = yaml.safe_load((ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text())
    assert config["rule_files"] == ["alerts.yml"]
    assert config["scrape_configs"][0]["metrics_path"] == "/metrics"
