"""``GET /runs/<id>/trace`` on recorded data (the real stack's test is
tests/integration/test_run_trace_e2e.py): the tree the control plane builds around the worker's
spans, the Chrome format, the stored trace's bounds, and the tenant boundary."""

from __future__ import annotations

import pytest

from api.models import Program, RunTrace
from api.services import programs, run_traces
from api.services.runs import RunOutcome, create_run, finish_run, start_run
from gpu_worker.tracing import MAX_BUCKETS, MAX_SPANS


@pytest.fixture
def program(api_tenant_a):
    prog = Program.objects.create(tenant=api_tenant_a.tenant, name="p")
    programs.add_version(prog, "p.py", b"def main(args):\n    return args\n")
    return prog


def _worker_trace(started_at: float) -> dict:
    return {
        "started_at": started_at,
        "duration_s": 1.0,
        "spans": [
            {"kind": "syscall", "name": "pred", "start_s": 0.1, "end_s": 0.2, "attrs": {"batch_size": 2, "tokens": 5}},
            {"kind": "io", "name": "sleep", "start_s": 0.3, "end_s": 0.8, "attrs": {}},
        ],
        "buckets": [
            {"kind": "syscall", "name": "pred", "second": 0, "count": 7, "duration_s": 0.05}
            | {"queue_wait_s": 0.01, "tokens": 7, "end_s": 0.95}
        ],
        "dropped": 3,
    }


def _finished_with_trace(tenant, program, worker_trace=None):
    run, _ = create_run(tenant, program, None, {}, {})
    start_run(str(run.pk), "w1")
    run.refresh_from_db()
    t = run.started_at.timestamp()
    marks = run_traces.ExecutorMarks(
        session_created=(t + 0.01, t + 0.02),
        launched_at=t + 0.02,
        sandbox_start_s=0.1,
        sandbox_run_s=1.0,
        warm=True,
        session_ended=(t + 1.2, t + 1.25),
    )
    trace = run_traces.recorded(marks, worker_trace(t + 0.015) if worker_trace else _worker_trace(t + 0.015))
    finish_run(str(run.pk), RunOutcome(status="succeeded", usage={"decode_tokens": 12}, trace=trace))
    return run


def test_the_trace_is_one_tree_of_the_runs_spans_and_the_workers(api_tenant_a, program):
    run = _finished_with_trace(api_tenant_a.tenant, program)
    body = api_tenant_a.key_client().get(f"/api/v1/runs/{run.pk}/trace").json()
    assert body["complete"] and body["status"] == "succeeded" and body["dropped"] == 3
    assert body["worker_tracing"] == "on"
    spans = {s["name"] if s["name"] != "pred" else f"pred{s['attrs'].get('count', '')}": s for s in body["spans"]}
    ids = {s["id"]: s for s in body["spans"]}
    assert spans["run"]["parent"] is None
    assert spans["queued"]["attrs"] == {"worker": "w1"} and spans["queued"]["parent"] == spans["run"]["id"]
    assert spans["sandbox.start"]["attrs"] == {"warm": True}
    assert abs(spans["sandbox.start"]["duration_s"] - 0.1) < 1e-3
    session = spans["worker.session"]
    assert ids[session["parent"]]["name"] == "execute"
    assert spans["pred"]["parent"] == session["id"] and spans["pred"]["attrs"]["batch_size"] == 2
    assert abs(spans["sleep"]["duration_s"] - 0.5) < 1e-6
    assert abs(spans["sleep"]["start_s"] - (session["start_s"] + 0.3)) < 1e-3
    bucket = spans["pred7"]
    assert bucket["attrs"]["aggregated"] and bucket["duration_s"] == 0.05
    assert spans["end"]["attrs"]["decode_tokens"] == 12 and spans["end"]["attrs"]["status"] == "succeeded"


def test_a_worker_with_tracing_off_leaves_the_control_planes_marks_and_says_so(api_tenant_a, program):
    """What a worker started with ``--trace off`` sends: the session's bounds, no spans."""

    def off(started_at: float) -> dict:
        return {"started_at": started_at, "duration_s": 1.0, "spans": [], "buckets": [], "dropped": 0}

    run = _finished_with_trace(api_tenant_a.tenant, program, lambda t: off(t) | {"enabled": False})
    response = api_tenant_a.key_client().get(f"/api/v1/runs/{run.pk}/trace")
    assert response.status_code == 200
    body = response.json()
    assert body["complete"] and body["worker_tracing"] == "off"
    by_name = {s["name"]: s for s in body["spans"]}
    assert {"run", "queued", "execute", "session.create", "sandbox.start", "sandbox.run", "end"} <= set(by_name)
    assert by_name["worker.session"]["attrs"] == {"tracing": "off"}
    assert not [s for s in body["spans"] if s["kind"] in ("syscall", "io", "wait", "kv_move")]

    from symphony_client.output import trace_summary

    assert "tracing was off on its worker" in trace_summary(body)
    # A worker of before the switch sent no ``enabled``: it traced.
    earlier = _finished_with_trace(api_tenant_a.tenant, program, off)
    assert api_tenant_a.key_client().get(f"/api/v1/runs/{earlier.pk}/trace").json()["worker_tracing"] == "on"


def test_a_queued_runs_worker_tracing_is_not_known_yet(api_tenant_a, program):
    run, _ = create_run(api_tenant_a.tenant, program, None, {}, {})
    assert api_tenant_a.key_client().get(f"/api/v1/runs/{run.pk}/trace").json()["worker_tracing"] is None


def test_the_chrome_format_has_complete_and_async_events(api_tenant_a, program):
    run = _finished_with_trace(api_tenant_a.tenant, program)
    events = api_tenant_a.key_client().get(f"/api/v1/runs/{run.pk}/trace?format=chrome").json()["traceEvents"]
    by_phase = {(e["name"], e["ph"]) for e in events}
    assert {("run", "X"), ("sandbox.start", "X"), ("sleep", "b"), ("sleep", "e"), ("end", "i")} <= by_phase
    sleep = [e for e in events if e["name"] == "sleep"]
    assert sleep[1]["ts"] - sleep[0]["ts"] == pytest.approx(500_000, abs=1)


def test_another_tenant_gets_a_404_and_a_bad_format_a_400(api_tenant_a, api_tenant_b, program):
    run = _finished_with_trace(api_tenant_a.tenant, program)
    other = api_tenant_b.key_client().get(f"/api/v1/runs/{run.pk}/trace")
    assert other.status_code == 404 and other.json()["error"]["code"] == "not_found"
    bad = api_tenant_a.key_client().get(f"/api/v1/runs/{run.pk}/trace?format=xml")
    assert bad.status_code == 400 and "format" in bad.json()["error"]["detail"]


def test_a_queued_run_has_a_partial_trace(api_tenant_a, program):
    run, _ = create_run(api_tenant_a.tenant, program, None, {}, {})
    body = api_tenant_a.key_client().get(f"/api/v1/runs/{run.pk}/trace").json()
    assert not body["complete"] and [s["name"] for s in body["spans"]] == ["run", "queued"]


def test_a_stored_trace_is_clipped_to_the_workers_bounds(api_tenant_a, program):
    flood = {
        "started_at": 1.0,
        "duration_s": 1.0,
        "spans": [{"kind": "syscall", "name": "pred", "start_s": 0, "end_s": 0, "attrs": {}}] * (MAX_SPANS + 50),
        "buckets": [
            {"kind": "syscall", "name": "pred", "second": i, "count": 1, "duration_s": 0}
            | {"queue_wait_s": 0, "tokens": 1, "end_s": i}
            for i in range(MAX_BUCKETS + 10)
        ],
        "dropped": 0,
    }
    data = run_traces.recorded(run_traces.ExecutorMarks(), flood)
    assert len(data["worker"]["spans"]) == MAX_SPANS and len(data["worker"]["buckets"]) == MAX_BUCKETS
    run, _ = create_run(api_tenant_a.tenant, program, None, {}, {})
    start_run(str(run.pk), "w1")
    finish_run(str(run.pk), RunOutcome(status="failed", trace=data))
    assert RunTrace.objects.filter(run=run).count() == 1
