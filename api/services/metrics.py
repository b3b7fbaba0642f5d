"""Prometheus metrics of the whole service, collected at scrape time.

Why at scrape time from the sources of truth instead of counters kept in this process: web
processes are many and short-lived, while what operators watch lives elsewhere. Worker figures
(KV pages per tier, sessions, forwards, batch occupancy, queue waits) come from the heartbeats
every gpu_worker writes to Redis (the same record routing reads); run, tenant and stored-KV
figures come from PostgreSQL. Any web process can answer a scrape and all give the same numbers.

Worker counters (``..._total``) are the worker's own since it started: a restarted worker starts
them again at zero, which Prometheus' ``rate()`` treats as a counter reset.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from django.db.models import Count, Sum
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from api.models import KVFile, Run, Tenant
from api.services import auth_failures, routing, shared_counters
from api.throttling import THROTTLED_COUNTER

#: Heartbeat keys (``health`` fields) exported per worker as gauges: (key, metric name, help).
WORKER_GAUGES = (
    ("pages_total", "symphony_worker_kv_device_pages", "Device KV pages the worker manages."),
    ("pages_free", "symphony_worker_kv_device_pages_free", "Device KV pages free now."),
    ("host_pages", "symphony_worker_kv_host_pages", "KV pages held in host memory (spilled or clean copies)."),
    ("disk_pages", "symphony_worker_kv_disk_pages", "KV pages of files spilled to the KV store."),
    ("sessions", "symphony_worker_sessions", "LIP sessions open on the worker."),
)
#: Scheduler metrics (the heartbeat's ``metrics``) exported as counters: (key, name, help).
SCHEDULER_COUNTERS = (
    ("forwards", "symphony_worker_forwards", "Forward passes run."),
    ("calls", "symphony_worker_pred_calls", "pred calls scheduled."),
    ("failed_calls", "symphony_worker_pred_calls_failed", "pred calls that failed."),
    ("tokens", "symphony_worker_batched_tokens", "Tokens run through forward passes (prefill and decode)."),
)
#: Scheduler metrics exported as gauges, milliseconds turned into seconds: (key, name, help, scale).
SCHEDULER_GAUGES = (
    ("batch_occupancy", "symphony_worker_batch_occupancy_ratio", "Tokens per forward / the forward's token budget.", 1),
    ("avg_items_per_forward", "symphony_worker_items_per_forward", "Average pred calls batched per forward.", 1),
    ("forward_ms_ema", "symphony_worker_forward_seconds", "Recent forward time (moving average).", 1e-3),
    ("queue_wait_ms_avg", "symphony_worker_queue_wait_seconds_avg", "Average wait of a pred call to run.", 1e-3),
    ("gap_ms_avg", "symphony_worker_gap_seconds_avg", "Average idle time of the engine between forwards.", 1e-3),
    ("queued_calls", "symphony_worker_queued_pred_calls", "pred calls waiting now.", 1),
)


class ServiceCollector:
    """One scrape's worth of metric families (a ``prometheus_client`` custom collector)."""

    def collect(self) -> Iterator[Metric]:
        yield from self._workers()
        yield from self._runs()
        yield from self._tenants_and_kv()
        yield self._auth_failures()
        yield self._throttled()

    def _workers(self) -> Iterator[Metric]:
        workers = sorted(routing.live_workers(), key=lambda w: w.name)
        up = GaugeMetricFamily("symphony_worker_up", "1 if the heartbeat says healthy.", labels=["worker"])
        age = GaugeMetricFamily(
            "symphony_worker_heartbeat_age_seconds", "Seconds since the worker's last heartbeat.", labels=["worker"]
        )
        gauges = {key: GaugeMetricFamily(name, text, labels=["worker"]) for key, name, text in WORKER_GAUGES}
        counters = {key: CounterMetricFamily(name, text, labels=["worker"]) for key, name, text in SCHEDULER_COUNTERS}
        sched = {key: GaugeMetricFamily(name, text, labels=["worker"]) for key, name, text, _ in SCHEDULER_GAUGES}
        dropped = CounterMetricFamily(
            "symphony_worker_events_dropped", "Run events the worker could not publish.", labels=["worker"]
        )
        now = time.time()
        for w in workers:
            health: dict[str, Any] = w.health
            up.add_metric([w.name], 1.0 if w.ok else 0.0)
            if isinstance(health.get("at"), int | float):
                age.add_metric([w.name], max(0.0, now - float(health["at"])))
            for key, family in gauges.items():
                if _is_number(health.get(key)):
                    family.add_metric([w.name], float(health[key]))
            metrics = health.get("metrics") or {}
            for key, counter in counters.items():
                if _is_number(metrics.get(key)):
                    counter.add_metric([w.name], float(metrics[key]))
            for key, _, _, scale in SCHEDULER_GAUGES:
                if _is_number(metrics.get(key)):
                    sched[key].add_metric([w.name], float(metrics[key]) * scale)
            if _is_number(health.get("events_dropped")):
                dropped.add_metric([w.name], float(health["events_dropped"]))
        yield up
        yield age
        yield from gauges.values()
        yield from counters.values()
        yield from sched.values()
        yield dropped

    def _runs(self) -> Iterator[Metric]:
        by_status = dict(Run.objects.values_list("status").annotate(n=Count("pk")).order_by())
        active = GaugeMetricFamily("symphony_runs", "Runs queued or running now.", labels=["status"])
        finished = CounterMetricFamily("symphony_runs_finished", "Runs that ended, by how.", labels=["status"])
        for status in Run.STATUSES:
            family = finished if status in Run.TERMINAL else active
            family.add_metric([status], float(by_status.get(status, 0)))
        yield active
        yield finished

    def _tenants_and_kv(self) -> Iterator[Metric]:
        open_tenants = Tenant.objects.filter(closed_at__isnull=True).count()
        yield GaugeMetricFamily("symphony_tenants", "Tenants signed up and not closed.", value=float(open_tenants))
        files = GaugeMetricFamily("symphony_kv_files", "Persistent KV files, by where they are.", labels=["residency"])
        size = GaugeMetricFamily("symphony_kv_file_bytes", "Bytes of persistent KV files.", labels=["residency"])
        rows = KVFile.objects.values_list("residency").annotate(n=Count("pk"), b=Sum("bytes")).order_by("residency")
        for residency, n, total in rows:
            files.add_metric([residency], float(n))
            size.add_metric([residency], float(total or 0))
        yield files
        yield size

    def _auth_failures(self) -> Metric:
        family = CounterMetricFamily(
            "symphony_auth_failures", "Refused credentials across all web processes, by reason.", labels=["reason"]
        )
        for reason, count in auth_failures.totals().items():
            family.add_metric([reason], float(count))
        return family

    def _throttled(self) -> Metric:
        count = shared_counters.read([THROTTLED_COUNTER])[THROTTLED_COUNTER]
        return CounterMetricFamily(
            "symphony_requests_throttled",
            "Requests refused for their tenant's API request rate (429), across all web processes.",
            value=float(count),
        )


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def exposition() -> tuple[bytes, str]:
    """The Prometheus text exposition of the service now, and its content type."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ServiceCollector())
    return generate_latest(registry), CONTENT_TYPE_LATEST
