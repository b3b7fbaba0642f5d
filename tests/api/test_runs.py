"""Run creation (idempotency, quota), cancel, exactly-once start, finish with usage and events."""

from __future__ import annotations

import json
import math

import pytest
import redis
from django.conf import settings

from api.models import Program, Run, UsageRecord
from api.services import programs
from api.services.runs import RunOutcome, create_run, finish_run, output_tail, start_run

pytestmark = pytest.mark.django_db


@pytest.fixture
def program(api_tenant_a):
    prog = Program.objects.create(tenant=api_tenant_a.tenant, name="p", default_args={"a": 1, "b": 2})
    programs.add_version(prog, "p.py", b"def main(args):\n    return args\n")
    return prog


def test_create_is_idempotent_and_merges_default_args(api_tenant_a, program):
    client = api_tenant_a.key_client()
    body = {"program": program.pk, "args": {"b": 3}, "limits": {"max_tokens": 64}}
    first = client.post("/api/v1/runs", body, format="json", HTTP_IDEMPOTENCY_KEY="abc")
    again = client.post("/api/v1/runs", body, format="json", HTTP_IDEMPOTENCY_KEY="abc")
    assert first.status_code == 201 and again.status_code == 200
    assert first.json()["id"] == again.json()["id"]
    assert first.json()["args"] == {"a": 1, "b": 3}
    assert Run.objects.count() == 1


def test_an_idempotency_key_reused_with_another_body_is_a_422(api_tenant_a, program):
    """Answering the first run to a request with other args would drop them without a word."""
    client = api_tenant_a.key_client()
    body = {"program": program.pk, "args": {"b": 3}}
    first = client.post("/api/v1/runs", body, format="json", HTTP_IDEMPOTENCY_KEY="k")
    assert first.status_code == 201
    for other in ({**body, "args": {"b": 4}}, {**body, "limits": {"max_tokens": 8}}, {**body, "version": 1}):
        refused = client.post("/api/v1/runs", other, format="json", HTTP_IDEMPOTENCY_KEY="k")
        assert refused.status_code == 422, (other, refused.content)
        error = refused.json()["error"]
        assert error["code"] == "idempotency_mismatch" and first.json()["id"] in error["message"]
    # The same body with its keys in another order is the same request.
    reordered = {"args": {"b": 3}, "program": program.pk}
    same = client.post("/api/v1/runs", reordered, format="json", HTTP_IDEMPOTENCY_KEY="k")
    assert same.status_code == 200 and same.json()["id"] == first.json()["id"]
    assert Run.objects.count() == 1


def test_an_idempotency_key_or_ids_past_their_columns_are_a_400(api_tenant_a, program):
    client = api_tenant_a.key_client()
    body = {"program": program.pk}
    too_long = client.post("/api/v1/runs", body, format="json", HTTP_IDEMPOTENCY_KEY="k" * 201)
    assert too_long.status_code == 400, too_long.content
    assert "Idempotency-Key" in too_long.json()["error"]["detail"]
    assert client.post("/api/v1/runs", body, format="json", HTTP_IDEMPOTENCY_KEY="k" * 200).status_code == 201
    assert Run.objects.count() == 1
    for out_of_range in ({"program": 2**63}, {"program": program.pk, "version": 2**31}):
        response = client.post("/api/v1/runs", out_of_range, format="json")
        assert response.status_code == 400 and response.json()["error"]["code"] == "invalid", response.content


def test_quota_rejects_over_plan_requests(api_tenant_a, program):
    client = api_tenant_a.key_client()
    # A per-request value past the plan is the request's fault: a 400 naming the field.
    response = client.post("/api/v1/runs", {"program": program.pk, "limits": {"max_tokens": 10**9}}, format="json")
    assert response.status_code == 400 and response.json()["error"]["code"] == "invalid", response.content
    assert response.json()["error"]["detail"]["limits"]["max_tokens"] == [
        "can be at most 4,096 tokens on this tenant's plan"
    ]
    response = client.post("/api/v1/runs", {"program": program.pk, "limits": {"deadline_s": 10**5}}, format="json")
    assert response.status_code == 400 and "deadline_s" in response.json()["error"]["detail"]["limits"]
    # A limit that frees up later (concurrent runs) stays a 429.
    for _ in range(2):
        create_run(api_tenant_a.tenant, program, None, {}, {})
    assert client.post("/api/v1/runs", {"program": program.pk}, format="json").status_code == 429
    assert client.get("/api/v1/quota").json()["use"]["active_runs"] == 2


def test_start_once_finish_writes_usage_and_events(api_tenant_a, program):
    run, _ = create_run(api_tenant_a.tenant, program, None, {}, {})
    assert start_run(str(run.pk), "local") is not None
    assert start_run(str(run.pk), "local") is None
    finish_run(str(run.pk), RunOutcome(status="failed", error="boom", exit_code=1, usage={"decode_tokens": 7}))
    run.refresh_from_db()
    assert (run.status, run.error, run.exit_code) == ("failed", "boom", 1)
    assert UsageRecord.objects.get(run=run).decode_tokens == 7
    entries = redis.Redis.from_url(settings.REDIS_URL).xrange(f"run:{run.pk}")
    types = [e[1][b"type"].decode() for e in entries]
    assert types == ["status", "status", "end"]
    assert json.loads(entries[-1][1][b"data"])["status"] == "failed"


def test_a_second_finish_overwrites_the_usage_row_it_wrote(api_tenant_a, program):
    """A redelivered task or a settle after a crash records the same run's outcome again: one
    usage row, the latest counters, still marked as a run's."""
    run, _ = create_run(api_tenant_a.tenant, program, None, {}, {})
    start_run(str(run.pk), "local")
    finish_run(str(run.pk), RunOutcome(status="succeeded", usage={"decode_tokens": 7, "prefill_tokens": 3}))
    first = UsageRecord.objects.get(run=run)
    finish_run(str(run.pk), RunOutcome(status="succeeded", usage={"decode_tokens": 9}))
    again = UsageRecord.objects.get(run=run)
    assert UsageRecord.objects.filter(run=run).count() == 1
    assert (again.pk, again.decode_tokens, again.prefill_tokens, again.from_run) == (first.pk, 9, 0, True)
    assert again.created_at == first.created_at and again.tenant_id == api_tenant_a.tenant.pk


def test_starting_and_finishing_a_run_take_few_queries(api_tenant_a, program, django_assert_max_num_queries):
    """Both are on the path of every answer (a /v1 request is a run): the start reads the run
    with its tenant and program version in one statement, and the finish writes the usage in
    one upsert (``update_or_create`` took six statements)."""
    run, _ = create_run(api_tenant_a.tenant, program, None, {}, {})
    with django_assert_max_num_queries(5):  # savepoint/BEGIN, lock+join, closed check, update, commit
        started = start_run(str(run.pk), "local")
    assert started is not None
    with django_assert_max_num_queries(0):
        assert (started.tenant.slug, started.program_version.sha256) == (run.tenant.slug, run.program_version.sha256)
    # savepoint, lock+join, update, upsert, release; then the quota alert's plan and month's usage
    with django_assert_max_num_queries(7):
        finish_run(str(run.pk), RunOutcome(status="succeeded", usage={"decode_tokens": 1}))


def test_cancel_then_cancel_again_conflicts(api_tenant_a, program):
    run, _ = create_run(api_tenant_a.tenant, program, None, {}, {})
    client = api_tenant_a.key_client()
    assert client.post(f"/api/v1/runs/{run.pk}/cancel").json()["status"] == "cancelled"
    assert client.post(f"/api/v1/runs/{run.pk}/cancel").status_code == 409
    assert start_run(str(run.pk), "local") is None


def test_a_run_says_who_cancelled_it_and_is_named_after_its_program(api_tenant_a, program):
    """The key or person that cancelled a run (its page says "Cancelled by you"), none for a run
    cancelled with its parent; a run without a name takes its program's and first argument."""
    client = api_tenant_a.key_client()
    by_key = client.post("/api/v1/runs", {"program": program.pk, "args": {"topic": "the sea"}}, format="json").json()
    assert by_key["name"] == f"{program.name} the sea"
    client.post(f"/api/v1/runs/{by_key['id']}/cancel")
    prefix = api_tenant_a.key_secret.split("_")[1]
    assert client.get(f"/api/v1/runs/{by_key['id']}").json()["cancelled_by"] == f"API key sk_{prefix}_…"
    session = api_tenant_a.session_client()
    named = session.post("/api/v1/runs", {"program": program.pk, "name": "nightly"}, format="json").json()
    assert named["name"] == "nightly"
    session.post(f"/api/v1/runs/{named['id']}/cancel")
    assert session.get(f"/api/v1/runs/{named['id']}").json()["cancelled_by"] == api_tenant_a.user.email
    assert "cancelled_by" not in session.get("/api/v1/runs").json()["results"][0]
    bad = session.post("/api/v1/runs", {"program": program.pk, "name": "x\u0000"}, format="json")
    assert bad.status_code == 400 and "name" in bad.json()["error"]["detail"]


def test_monthly_token_quota_refuses_new_runs_once_used_up(api_tenant_a, program):
    from api.models import Plan

    Plan.objects.filter(name="free").update(tokens_per_month=100)
    run, _ = create_run(api_tenant_a.tenant, program, None, {}, {})
    start_run(str(run.pk), "local")
    finish_run(str(run.pk), RunOutcome(status="succeeded", usage={"prefill_tokens": 80, "decode_tokens": 20}))
    response = api_tenant_a.key_client().post("/api/v1/runs", {"program": program.pk}, format="json")
    assert response.status_code == 429
    assert "monthly token quota" in response.json()["error"]["message"]
    assert api_tenant_a.key_client().get("/api/v1/quota").json()["use"]["tokens_this_month"] == 100


def test_session_limits_cap_the_run_by_plan_and_carry_the_tool_allowlist(api_tenant_a, program):
    from api.models import Plan
    from api.services.quotas import session_limits

    Plan.objects.filter(name="free").update(tokens_per_month=1000, max_device_pages_per_run=32, max_concurrent_runs=10)
    api_tenant_a.tenant.allowed_tool_hosts = ["127.0.0.1:8765"]
    api_tenant_a.tenant.save()
    run, _ = create_run(api_tenant_a.tenant, program, None, {}, {"max_tokens": 2000, "deadline_s": 30})
    limits = session_limits(run)
    assert limits == {
        "max_tokens": 1000,
        "deadline_s": 30.0,
        "allowed_hosts": ["127.0.0.1:8765"],
        "max_pages": 32,
        "max_stored_bytes": 1 << 30,
        "kv_pinned_share": 0.1,
        "kv_host_share": 0.1,
        "max_kv_files": 100,
        "weight": 1.0,
        "max_stream_bytes": 16 * 1024 * 1024,
        "account": api_tenant_a.tenant.account_key,
    }
    unbounded, _ = create_run(api_tenant_a.tenant, program, None, {}, {})
    assert session_limits(unbounded)["deadline_s"] == 120.0  # no deadline asked: the plan's
    # A run may tighten what the plan and the tenant allow, never loosen it.
    api_tenant_a.tenant.allowed_tool_hosts = ["127.0.0.1:8765", "127.0.0.1:9000"]
    api_tenant_a.tenant.save()
    narrowed, _ = create_run(
        api_tenant_a.tenant,
        program,
        None,
        {},
        {"max_pages": 8, "max_kv_bytes": 1 << 20, "allowed_hosts": ["127.0.0.1:9000"]},
    )
    limits = session_limits(narrowed)
    assert limits["max_pages"] == 8 and limits["max_kv_bytes"] == 1 << 20
    assert limits["allowed_hosts"] == ["127.0.0.1:9000"]
    wider, _ = create_run(api_tenant_a.tenant, program, None, {}, {"max_pages": 1000})
    assert session_limits(wider)["max_pages"] == 32
    # The plan's scheduling weight is the worker's fair share for every run of its tenants.
    Plan.objects.filter(name="free").update(scheduling_weight=2.5)
    assert session_limits(wider)["weight"] == 2.5


def test_malformed_or_unknown_run_limits_are_a_400_naming_them(api_tenant_a, program):
    """Each was a 500 (``int("abc")`` in the quota check) or a run accepted only to fail when it
    started; ``weight`` is the operator's to set, not the tenant's."""
    client = api_tenant_a.key_client()
    for limits, field in (
        ({"max_tokens": "abc"}, "max_tokens"),
        ({"deadline_s": [1]}, "deadline_s"),
        ({"deadline_s": -1}, "deadline_s"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"memory_mb": "x"}, "memory_mb"),
        ({"max_pages": 1.5}, "max_pages"),
        ({"allowed_hosts": 5}, "allowed_hosts"),
        ({"allowed_hosts": ["x" * 300]}, "allowed_hosts"),
        ({"weight": 1000}, "weight"),
        ({"cpus": 8}, "cpus"),
    ):
        response = client.post("/api/v1/runs", {"program": program.pk, "limits": limits}, format="json")
        assert response.status_code == 400, (limits, response.content)
        error = response.json()["error"]
        assert error["code"] == "invalid" and field in error["detail"]["limits"], (limits, error)
    assert not Run.objects.exists()
    body = {"program": program.pk, "limits": {"max_tokens": 64, "deadline_s": 5}}
    ok = client.post("/api/v1/runs", body, format="json")
    assert ok.status_code == 201 and ok.json()["limits"] == {"max_tokens": 64, "deadline_s": 5.0}


def test_list_filters_are_validated_and_pages_bounded(api_tenant_a, program):
    """Malformed filters are a 400 in the error envelope, never a query that fails (a 500);
    a huge ``limit`` is capped instead of overflowing SQL's LIMIT (found by the schema fuzzer)."""
    client = api_tenant_a.key_client()
    run, _ = create_run(api_tenant_a.tenant, program, None, {}, {})
    listed = client.get(f"/api/v1/runs?program={program.pk}&status=queued").json()
    assert [r["id"] for r in listed["results"]] == [str(run.pk)]
    assert client.get("/api/v1/runs?status=succeeded").json()["count"] == 0
    assert client.get("/api/v1/runs?program=&status=").json()["count"] == 1
    for query in ("program=abc", f"program={10**20}", "program=0", "status=bogus"):
        response = client.get(f"/api/v1/runs?{query}")
        assert response.status_code == 400, (query, response.content)
        assert response.json()["error"]["code"] == "invalid", (query, response.json())
    page = client.get(f"/api/v1/runs?limit={10**20}")
    assert page.status_code == 200 and page.json()["count"] == 1
    assert client.get(f"/api/v1/programs?limit={10**20}&offset={10**20}").status_code == 200
    assert client.get("/api/v1/runs?limit=&offset=").status_code == 200


@pytest.mark.parametrize("query", ["limit=-1", "limit=0", "limit=abc", "limit=1.5", "offset=-1", "offset=x"])
def test_a_limit_or_offset_out_of_range_is_a_400_naming_it(api_tenant_a, query):
    """DRF alone answers these with its default page, as if the parameter had not been sent."""
    response = api_tenant_a.key_client().get(f"/api/v1/runs?{query}")
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["code"] == "invalid" and query.split("=")[0] in error["detail"], error


def test_nul_characters_in_api_json_are_a_400_not_a_database_error(api_tenant_a, program):
    """PostgreSQL's jsonb and text refuse U+0000: caught by the serializers with a clear message,
    for run args/limits and a program's default_args alike. OpenAI prompts are the exception
    (OpenAI and vLLM take them): tests/integration/test_openai_clients.py."""
    client = api_tenant_a.key_client()
    for body in (
        {"program": program.pk, "args": {"prompt": "a\u0000b"}},
        {"program": program.pk, "args": {"nested": [{"k\u0000": 1}]}},
        {"program": program.pk, "limits": {"allowed_hosts": ["x\u0000"]}},
    ):
        response = client.post("/api/v1/runs", body, format="json")
        assert response.status_code == 400, response.content
        assert response.json()["error"]["code"] == "invalid" and "NUL" in json.dumps(response.json()), body
    upload = client.post(
        "/api/v1/programs",
        {"name": "q", "default_args": json.dumps({"a": "\u0000"}), "file": _source_file()},
        format="multipart",
    )
    assert upload.status_code == 400 and "NUL" in json.dumps(upload.json()), upload.content
    image = [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}]
    chat = client.post(
        "/v1/chat/completions", {"model": "any", "messages": [{"role": "user", "content": image}]}, format="json"
    )
    assert chat.status_code == 400 and "only text content parts" in chat.json()["error"]["message"], chat.content
    assert Run.objects.count() == 0 and Program.objects.filter(name="q").count() == 0


def test_run_args_with_nul_characters_are_stored_and_given_back_exactly():
    """A prompt with U+0000 is kept as JSON text in the run row (jsonb cannot hold it) and is
    decoded to the very same value for the program and the API; arguments that name the
    envelope's key themselves round-trip too."""
    from api.services.run_args import ENVELOPE, program_args, storable_args

    for args in ({"messages": [{"role": "user", "content": "a\u0000b"}]}, {ENVELOPE: "x"}, {"plain": ["text"]}):
        stored = storable_args(args)
        assert "\u0000" not in json.dumps(stored, ensure_ascii=False)
        assert program_args(json.loads(json.dumps(stored))) == args
    assert storable_args({"plain": 1}) == {"plain": 1}


def test_json_postgresql_cannot_store_is_a_400_not_a_database_error(api_tenant_a, program):
    """NaN, numbers that overflow to infinity and lone surrogate escapes are read by Python's json
    module but refused by jsonb: each was a 500 at the insert (the last two found by the OpenAI
    fuzzer). JSON bodies are refused while parsing, form fields by the serializer."""
    client = api_tenant_a.key_client()
    for args in ('{"x": NaN}', '{"x": -Infinity}', '{"x": 1e400}', '{"x": [-1e999]}', '{"\\ud800": 1}', '["\\udfff"]'):
        body = f'{{"program": {program.pk}, "args": {args}}}'
        response = client.post("/api/v1/runs", body, content_type="application/json")
        assert response.status_code == 400, (args, response.content)
        assert response.json()["error"]["code"] == "parse_error", (args, response.json())
    for default_args, why in (('{"x": 1e400}', "finite"), ('{"s": "\\ud800"}', "surrogate")):
        upload = client.post(
            "/api/v1/programs", {"name": "q", "default_args": default_args, "file": _source_file()}, format="multipart"
        )
        assert upload.status_code == 400 and why in json.dumps(upload.json()), upload.content
    for body in (
        b'{"model": "m", "prompt": "p", "response_format": {"type": "json_schema", "json_schema": {"schema": '
        b'{"maximum": 1e400}}}}',
        b'{"model": "m", "prompt": "\\ud800"}',
        b'{"model": "m", "prompt": "p", "temperature": NaN}',
    ):
        response = client.post("/v1/completions", body, content_type="application/json")
        assert response.status_code == 400 and "not valid JSON" in response.json()["error"]["message"], body
    assert Run.objects.count() == 0 and Program.objects.filter(name="q").count() == 0


def test_a_programs_nan_and_lone_surrogates_do_not_lose_its_outcome(api_tenant_a, program):
    """The SDK refuses a NaN result, but the record comes from inside the sandbox: NaN and
    infinities are stored as null and lone surrogates as U+FFFD, with the status and usage."""
    run, _ = create_run(api_tenant_a.tenant, program, None, {}, {})
    start_run(str(run.pk), "local")
    result = {"nan": math.nan, "inf": [math.inf, -math.inf, 1.5], "\ud800key": "a\udfffb"}
    finish_run(str(run.pk), RunOutcome(status="succeeded", result=result, usage={"decode_tokens": 2}))
    run.refresh_from_db()
    assert run.status == "succeeded"
    assert run.result == {"nan": None, "inf": [None, None, 1.5], "\ufffdkey": "a\ufffdb"}
    assert UsageRecord.objects.get(run=run).decode_tokens == 2


def test_a_programs_nul_characters_do_not_lose_its_outcome(api_tenant_a, program):
    """A LIP's result, error and output are its own bytes: NUL is stored as U+FFFD, and the
    status, result and usage are recorded (before, the whole outcome was lost to a DataError)."""
    run, _ = create_run(api_tenant_a.tenant, program, None, {}, {})
    start_run(str(run.pk), "local")
    outcome = RunOutcome(
        status="succeeded",
        result={"text\u0000": ["a\u0000b", 1, None, {"deep": "\u0000"}]},
        error="half\u0000way",
        usage={"decode_tokens": 3},
        stdout="out\u0000put\n",
        stderr="err\u0000\n",
    )
    finish_run(str(run.pk), outcome)
    run.refresh_from_db()
    assert run.status == "succeeded" and run.error == "half\ufffdway"
    assert run.result == {"text\ufffd": ["a\ufffdb", 1, None, {"deep": "\ufffd"}]}
    assert (run.stdout, run.stderr) == ("out\ufffdput\n", "err\ufffd\n")
    assert UsageRecord.objects.get(run=run).decode_tokens == 3


def _source_file():
    from django.core.files.uploadedfile import SimpleUploadedFile

    return SimpleUploadedFile("q.py", b"def main(args):\n    return 1\n")


def test_logs_keep_the_tail_of_each_stream_and_only_for_the_runs_tenant(api_tenant_a, api_tenant_b, program, settings):
    settings.SYMPHONY_RUN_OUTPUT_KEEP_BYTES = 10
    run, _ = create_run(api_tenant_a.tenant, program, None, {}, {})
    start_run(str(run.pk), "local")
    finish_run(str(run.pk), RunOutcome(status="succeeded", stdout="line 1\nline 2 é\n", stderr="warn\n"))
    client = api_tenant_a.key_client()
    logs = client.get(f"/api/v1/runs/{run.pk}/logs").json()
    assert (logs["stdout"], logs["stderr"], logs["truncated"]) == ("line 2 é\n", "warn\n", True)
    assert (logs["id"], logs["status"]) == (str(run.pk), "succeeded")
    assert output_tail("aé", 1) == ("", True)  # never half a character (é is 2 bytes in UTF-8)
    listed = client.get("/api/v1/runs").json()["results"][0]
    assert "stdout" not in listed and "stdout" not in client.get(f"/api/v1/runs/{run.pk}").json()
    assert api_tenant_b.key_client().get(f"/api/v1/runs/{run.pk}/logs").status_code == 404


def test_finished_runs_streams_without_retention_get_it_and_running_ones_are_left(api_tenant_a, program):
    """The hourly sweep: a finished run's stream written before retention existed (or re-created
    by a late event) and a stream whose run is gone get the TTL; a running run's stream keeps
    none; ``finish_run`` sets it at once."""
    import uuid

    from api.services.runs import expire_finished_streams, publish_event
    from gpu_worker.contracts import TokenEvent

    r = redis.Redis.from_url(settings.REDIS_URL)
    finished, _ = create_run(api_tenant_a.tenant, program, None, {}, {})
    running, _ = create_run(api_tenant_a.tenant, program, None, {}, {})
    start_run(str(running.pk), "local")
    Run.objects.filter(pk=finished.pk).update(status="succeeded")  # ended before retention existed
    gone = uuid.uuid4()
    for run_id in (finished.pk, running.pk, gone):
        publish_event(str(run_id), TokenEvent("x"))
        assert r.ttl(f"run:{run_id}") == -1
    r.set("run:not-a-stream", "1")  # another type under the prefix is not touched

    assert expire_finished_streams() >= 2
    assert 0 < r.ttl(f"run:{finished.pk}") <= settings.SYMPHONY_RUN_EVENTS_RETENTION_S
    assert 0 < r.ttl(f"run:{gone}") <= settings.SYMPHONY_RUN_EVENTS_RETENTION_S
    assert r.ttl(f"run:{running.pk}") == -1 and r.ttl("run:not-a-stream") == -1
    finish_run(str(running.pk), RunOutcome(status="succeeded"))
    assert r.ttl(f"run:{running.pk}") > 0
    r.delete("run:not-a-stream")


def test_a_result_keeps_the_key_order_the_program_returned(api_tenant_a, program):
    """Stored as ``json``, not ``jsonb`` (which sorts keys, shorter first)."""
    run, _ = create_run(api_tenant_a.tenant, program, None, {}, {})
    start_run(str(run.pk), "local")
    result = {"zeta": 1, "a": {"yy": 2, "b": 3}, "mid": [{"z": 1, "aa": 2}]}
    finish_run(str(run.pk), RunOutcome(status="succeeded", result=result))
    body = api_tenant_a.key_client().get(f"/api/v1/runs/{run.pk}").content.decode()
    got = json.loads(body)["result"]
    assert list(got) == ["zeta", "a", "mid"] and list(got["a"]) == ["yy", "b"] and list(got["mid"][0]) == ["z", "aa"]
    end = redis.Redis.from_url(settings.REDIS_URL).xrange(f"run:{run.pk}")[-1][1][b"data"]
    assert list(json.loads(end)["result"]) == ["zeta", "a", "mid"]


def test_one_run_shows_its_usage_timings_and_cost_and_a_listing_does_not(api_tenant_a, program):
    run, _ = create_run(api_tenant_a.tenant, program, None, {}, {})
    client = api_tenant_a.key_client()
    queued = client.get(f"/api/v1/runs/{run.pk}").json()
    assert queued["usage"] is None and queued["timings"]["queue_wait_s"] is None
    start_run(str(run.pk), "local")
    run.refresh_from_db()
    first = run.started_at.timestamp() + 0.5
    usage = {
        "prefill_tokens": 1_000_000,
        "decode_tokens": 20,
        "pred_calls": 21,
        "page_seconds": 2.5,
        "sandbox_seconds": 1.25,
        "streamed_bytes": 300,
        "streamed_events": 20,
        "cached_tokens": 64,
        "forwards": 18,
        "first_stream_at": first,
    }
    finish_run(str(run.pk), RunOutcome(status="succeeded", result={"ok": True}, usage=usage))
    body = client.get(f"/api/v1/runs/{run.pk}").json()
    got = body["usage"]
    for key in ("prefill_tokens", "decode_tokens", "pred_calls", "streamed_events", "cached_tokens", "forwards"):
        assert got[key] == usage[key], key
    assert (got["page_seconds"], got["sandbox_seconds"], got["streamed_bytes"]) == (2.5, 1.25, 300)
    # 1M prefill tokens at USD 0.10 per million is the largest line of the cost.
    assert got["cost"]["currency"] == "USD" and got["cost"]["lines"]["prefill_tokens"] == "0.100000"
    assert float(got["cost"]["total"]) > 0.1
    timings = body["timings"]
    assert timings["queue_wait_s"] >= 0 and timings["run_s"] >= 0
    run.refresh_from_db()
    assert run.first_output_at.timestamp() == pytest.approx(first, abs=1e-3)
    assert timings["time_to_first_token_s"] == pytest.approx(timings["queue_wait_s"] + 0.5, abs=0.01)
    listed = client.get("/api/v1/runs").json()["results"][0]
    assert "usage" not in listed and "timings" not in listed
