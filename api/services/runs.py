"""Run lifecycle: create (quota + idempotency), start (exactly once), cancel, finish (status,
result, usage record and stream events written together, never lost on failure)."""

from __future__ import annotations

import hashlib
import json
import logging
import math
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import redis
from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.db.models import Exists, OuterRef, Q, QuerySet
from django.utils import timezone

from api import dispatch, redis_client
from api.compiled_queries import CompiledQuery
from api.models import ApiKey, AuditLog, Program, ProgramVersion, Run, Tenant, UsageRecord
from api.services import (
    cancellation,
    otel_export,
    quota_alerts,
    routing,
    run_handoff,
    run_notices,
    run_traces,
    tool_hosts,
    trace_context,
)
from api.services.executor_liveness import TTL_S as EXECUTOR_TTL_S
from api.services.executor_liveness import executor_alive
from api.services.quotas import PlanLimits, check_can_start, lock_account, tokens_this_month_of
from api.services.run_args import default_run_name, storable_args
from api.validators import make_storable
from gpu_worker import contracts
from gpu_worker.contracts import EndEvent, RunEvent, StatusEvent

log = logging.getLogger(__name__)

USAGE_FIELDS = UsageRecord.METERED
#: Counters kept with a run's usage that are not billed (shown by ``GET /runs/<id>``).
USAGE_DETAILS = ("streamed_events", "forwards")


class RunConflict(Exception):
    """The requested state change is not allowed from the run's current state."""


class IdempotencyMismatch(Exception):
    """An ``Idempotency-Key`` reused with a request body other than the one it was first sent
    with: answering the first run would silently drop the new arguments."""


def _request_digest(program: Program, version: int | None, args: dict, limits: dict) -> str:
    """SHA-256 of the run request as the caller sent it (before ``default_args`` are merged)."""
    body = {"program": program.pk, "version": version, "args": args, "limits": limits}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _in_sent_order(args: dict, defaults: dict) -> dict:
    """The run's arguments with the client's first (in the order it sent them), then the
    program's defaults it did not override."""
    return {**args, **{key: value for key, value in defaults.items() if key not in args}}


def _replay(run: Run, key: str, digest: str) -> tuple[Run, bool]:
    """The earlier run of ``key``, provided it was created from the same request."""
    if run.idempotency_digest and run.idempotency_digest != digest:
        raise IdempotencyMismatch(
            f"Idempotency-Key {key!r} was first used for run {run.pk} with a different request body;"
            " send the same body to get that run again, or use a new key"
        )
    return run, False


@dataclass(frozen=True)
class RunOutcome:
    """What the executor reports when a run ends, whatever the way it ended."""

    status: str
    result: object = None
    error: str = ""
    exit_code: int | None = None
    usage: dict = field(default_factory=dict)
    #: What the program printed, as the sandbox captured it (capped by its output limit).
    stdout: str = ""
    stderr: str = ""
    #: Where the run's time went (``run_traces.recorded``); None: nothing was recorded.
    trace: dict | None = None


def output_tail(text: str, keep_bytes: int) -> tuple[str, bool]:
    """The last ``keep_bytes`` of ``text`` (UTF-8, never a split character) and whether it was
    cut: the end of a program's output is where its error or last progress line is."""
    data = text.encode("utf-8", "replace")
    if len(data) <= keep_bytes:
        return text, False
    return data[len(data) - keep_bytes :].decode("utf-8", "ignore"), True


def _redis() -> redis.Redis:
    return redis_client.shared(settings.REDIS_URL)


def publish_event(run_id: str, event: RunEvent) -> None:
    """XADD one event to the run's live stream (``gpu_worker/contracts.py``, as the worker's)."""
    key = contracts.run_stream_key(run_id)
    _redis().xadd(key, contracts.entry(event), maxlen=contracts.STREAM_MAXLEN, approximate=True)


def publish_end(run: Run) -> None:
    """The run's closing ``status`` and ``end`` events, and its stream set to expire
    ``SYMPHONY_RUN_EVENTS_RETENTION_S`` later: without that every run's events (up to 10,000
    entries) would stay in Redis for good. The run's row keeps its result and output tails;
    the event view answers a finished run whose stream is gone from that row (api/views/run_events.py).
    The tenant's ended-run notice (api/services/run_notices.py) goes out with them: what a
    ``/v1`` request queued behind the tenant's concurrent-run limit waits on."""
    key = contracts.run_stream_key(run.pk)
    pipe = _redis().pipeline(transaction=True)
    for event in closing_events(run):
        pipe.xadd(key, contracts.entry(event), maxlen=contracts.STREAM_MAXLEN, approximate=True)
    pipe.expire(key, settings.SYMPHONY_RUN_EVENTS_RETENTION_S)
    pipe.publish(run_notices.channel(run.tenant_id), str(run.pk))
    pipe.execute()


def closing_events(run: Run) -> tuple[StatusEvent, EndEvent]:
    """A finished run's last two events, from its row: what :func:`publish_end` writes and what
    the event view answers when the stream has expired."""
    return StatusEvent(run.status, run.error), EndEvent(run.status, run.result)


#: Stream keys looked at per SCAN step of :func:`expire_finished_streams`.
SWEEP_BATCH = 500


def expire_finished_streams() -> int:
    """Periodic (Celery beat): give a retention TTL to event streams that have none and whose
    run is finished or gone. :func:`publish_end` sets it when a run ends; this catches the rest:
    streams written before retention existed, and a worker's late event that re-created a
    stream after it expired. A running run's stream is left alone. Returns how many it set."""
    client = _redis()
    expired = 0
    batch: list[bytes] = []
    for key in client.scan_iter(match=contracts.RUN_STREAM_PREFIX + "*", count=SWEEP_BATCH, _type="stream"):
        batch.append(key)
        if len(batch) >= SWEEP_BATCH:
            expired += _expire_if_finished(client, batch)
            batch = []
    if batch:
        expired += _expire_if_finished(client, batch)
    if expired:
        log.info("run_streams_expiring count=%d retention_s=%d", expired, settings.SYMPHONY_RUN_EVENTS_RETENTION_S)
    return expired


def _run_id_of(key: bytes) -> uuid.UUID | None:
    try:
        return uuid.UUID(contracts.run_id_of(key))
    except ValueError:
        return None  # a key under run: that is not a run's stream


def _expire_if_finished(client: redis.Redis, keys: list[bytes]) -> int:
    pipe = client.pipeline(transaction=False)
    for key in keys:
        pipe.ttl(key)
    no_ttl = {key: _run_id_of(key) for key, ttl in zip(keys, pipe.execute(), strict=True) if ttl == -1}
    candidates = {key: run_id for key, run_id in no_ttl.items() if run_id is not None}
    running = set(
        Run.objects.filter(pk__in=candidates.values()).exclude(status__in=Run.TERMINAL).values_list("pk", flat=True)
    )
    finished = [key for key, run_id in candidates.items() if run_id not in running]
    for key in finished:
        pipe.expire(key, settings.SYMPHONY_RUN_EVENTS_RETENTION_S)
    pipe.execute()
    return len(finished)


def create_run(
    tenant: Tenant,
    program: Program,
    version: int | None,
    args: dict,
    limits: dict,
    idempotency_key: str | None = None,
    api_key: ApiKey | None = None,
    send: Callable[[Run], object] | None = None,
    plan: PlanLimits | None = None,
    name: str = "",
    program_version: ProgramVersion | None = None,
    traceparent: str = "",
    tokens_used: int | None = None,
    start_on: str | None = None,
) -> tuple[Run, bool]:
    """Create a queued run (or return the earlier one with the same Idempotency-Key).

    Returns (run, created). The plan check and the insert happen under a lock on the tenant's
    row: counted apart, simultaneous requests each saw the same free slots and all started
    (24 at once made 9 runs against a limit of 2). The account's row is locked first, so the
    account-wide bound (across the tenants one person created) is counted the same way. The
    locks serialise one account's creations only; other accounts' requests never wait on them.
    The Celery task is enqueued only after the row is committed. Raises ``IdempotencyMismatch``
    when the key's run was created from other program, version, args or limits. ``send``: what
    sends the committed run to execution (default: its worker's Celery queue; the built-in
    OpenAI program's runs may be executed in process, api/services/trusted_runs.py). ``plan``:
    the tenant's plan as the caller's request already read it (read again here when not given).
    ``name``: what to call the run; empty, its program's name and first argument.
    ``program_version``: the row of ``version`` of ``program`` when the caller read it already.
    ``traceparent``: the client's W3C ``traceparent`` header as sent (kept only when valid,
    api/services/trace_context.py), written with the run's own insert. ``tokens_used``: the
    tenant's tokens this month as the caller's request read them already, for the monthly check
    (``quotas.check_can_start``; read there when not given). ``start_on``: create the run
    already ``running`` on this worker, for a caller that holds the thread that executes it
    (api/services/trusted_runs.py): ``start_run``'s own transaction is then one less on the
    path of the answer. ``send`` must execute it (nothing queues it), with ``month_tokens``
    set from ``tokens_used`` as ``start_run`` sets it.
    """
    digest = _request_digest(program, version, args, limits) if idempotency_key else ""
    if idempotency_key:
        existing = Run.objects.filter(tenant=tenant, idempotency_key=idempotency_key).first()
        if existing is not None:
            return _replay(existing, idempotency_key, digest)
    tool_hosts.check_run_hosts(tenant, limits)
    pv = program_version
    if pv is None:
        versions = program.versions.order_by("-number")
        pv = versions.filter(number=version).first() if version else versions.first()
    if pv is None:
        raise RunConflict(f"program {program.pk} has no version {version or '(any)'}")
    try:
        with transaction.atomic():
            lock_account(tenant)  # first: every tenant of the account locks in this order
            locked = TENANT_TO_LOCK.get(tenant.pk)
            if locked.closed_at is not None:  # read under the lock: a close may have just committed
                raise RunConflict("this tenant is closed")
            if idempotency_key:
                # The same key sent twice at once: the second waited on the lock for the first.
                existing = Run.objects.filter(tenant=tenant, idempotency_key=idempotency_key).first()
                if existing is not None:
                    return _replay(existing, idempotency_key, digest)
            check_can_start(locked, limits, plan, tokens_used=tokens_used)
            run = Run.objects.create(
                tenant=tenant,
                program_version=pv,
                name=name or default_run_name(program.name, _in_sent_order(args, program.default_args)),
                args=storable_args({**program.default_args, **args}),
                limits=limits,
                idempotency_key=idempotency_key or None,
                idempotency_digest=digest,
                api_key=api_key,
                traceparent=trace_context.kept(traceparent),
                **_started_on(start_on),
            )
    except IntegrityError:
        if not idempotency_key:
            raise
        return _replay(Run.objects.get(tenant=tenant, idempotency_key=idempotency_key), idempotency_key, digest)
    if start_on:
        run.month_tokens = tokens_used  # as start_run annotates it
    dispatch_run = send or enqueue
    transaction.on_commit(lambda: dispatch_run(run))
    log.info("run_created run=%s tenant=%s program=%s version=%s", run.pk, tenant.slug, program.pk, pv.number)
    return run, True


def _started_on(worker: str | None) -> dict[str, Any]:
    """The fields of a run created running on ``worker`` (none for a queued one)."""
    return {"status": "running", "worker": worker, "started_at": timezone.now()} if worker else {}


#: The advisory lock key that serialises routing decisions (any constant unique to routing).
ROUTING_LOCK = 0x5359_4D52_4F55_5445
#: The advisory lock key held by the one process re-routing stranded runs at a time.
REROUTE_LOCK = ROUTING_LOCK + 1


def _enqueue(
    run: Run,
    worker: str | None = None,
    *,
    attempt: int = 0,
    exclude: frozenset[str] = frozenset(),
    countdown: float = 0,
) -> str:
    """Send the run to a worker's queue (chosen by api/services/routing.py unless given);
    returns the worker. The task names its target, so a task left in another worker's queue
    after the run was re-routed (api/services/failover.py) is dropped by its executor.
    ``attempt`` counts re-routes of a run no worker has started yet."""
    if worker is None:
        with transaction.atomic():
            # One routing decision at a time: each one counts the runs the one before it sent.
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_xact_lock(%s)", [ROUTING_LOCK])
            worker = routing.choose_worker(run.tenant, exclude=exclude, files=routing.files_of(run))
            Run.objects.filter(pk=run.pk, status="queued").update(worker=worker)
    else:
        Run.objects.filter(pk=run.pk, status="queued").update(worker=worker)
    dispatch.task(dispatch.RUN_LIP).apply_async(
        args=[str(run.pk)], kwargs={"worker": worker, "attempt": attempt}, queue=f"worker.{worker}", countdown=countdown
    )
    log.info("run_enqueued run=%s tenant=%s worker=%s attempt=%d", run.pk, run.tenant.slug, worker, attempt)
    return worker


def enqueue(run: Run) -> str:
    """Send a new run to the Celery queue of the worker routing chooses; returns the worker."""
    return _enqueue(run)


def return_to_queue(run_id: str, worker: str) -> Run | None:
    """Undo :func:`start_run` for a run nothing of which has started on ``worker`` (its admin
    socket refused the session): ``running -> queued`` under the row lock. None when the run is
    not running on that worker any more (cancelled meanwhile, or reaped)."""
    with transaction.atomic():
        run = Run.objects.select_for_update().select_related("tenant").filter(pk=run_id).first()
        if run is None or run.status != "running" or run.worker != worker:
            return None
        run.status, run.started_at = "queued", None
        run.save(update_fields=["status", "started_at"])
    publish_event(str(run.pk), StatusEvent("queued", reason=f"worker {worker!r} unreachable; re-routed"))
    return run


def checkpointed_usage(run_id: str) -> dict:
    """The usage the run's worker last checkpointed for its session (gpu_worker/contracts.py,
    usage checkpoints): what a run that lost its executor or worker mid-session is billed.
    Empty when none was written or Redis cannot be read."""
    try:
        raw = _redis().get(contracts.usage_checkpoint_key(run_id))
    except redis.RedisError as exc:
        log.warning("usage_checkpoint_unread run=%s error=%s", run_id, exc)
        return {}
    return contracts.decode_usage_checkpoint(raw)


#: A run whose worker has not heartbeated is reaped only after this long (worker restarts and
#: Redis hiccups shorter than this leave runs alone).
ORPHAN_GRACE_S = 60
#: A running run whose executor heartbeat (api/services/executor_liveness.py) is missing is
#: reaped once it started at least this long ago (covers the start -> first heartbeat window).
EXECUTOR_GRACE_S = 2 * EXECUTOR_TTL_S


def reap_orphaned_runs() -> dict[str, int]:
    """Fail running runs whose worker is gone or whose Celery executor died, and re-route queued
    ones waiting on a dead worker's queue. Idempotent (start/finish are row-locked), safe to run from several beats.
    Does nothing when worker liveness cannot be read (Redis down): never reap on no evidence."""
    try:
        _redis().ping()
    except redis.RedisError:
        return {"failed": 0, "rerouted": 0}
    live = {w.name for w in routing.live_workers() if w.ok}
    cutoff = timezone.now() - timezone.timedelta(seconds=ORPHAN_GRACE_S)
    failed = rerouted = 0
    for run in Run.objects.filter(status="running", started_at__lt=cutoff).exclude(worker__in=live):
        error = f"worker {run.worker!r} stopped heartbeating while the run was executing; the run was lost"
        finish_run(str(run.pk), RunOutcome(status="failed", error=error, usage=checkpointed_usage(str(run.pk))))
        failed += 1
    executor_cutoff = timezone.now() - timezone.timedelta(seconds=EXECUTOR_GRACE_S)
    for run in Run.objects.filter(status="running", started_at__lt=executor_cutoff, worker__in=live):
        if not executor_alive(str(run.pk)):
            error = "the Celery executor running this run died before it finished; the run was lost"
            finish_run(str(run.pk), RunOutcome(status="failed", error=error, usage=checkpointed_usage(str(run.pk))))
            failed += 1
    rerouted = reroute_stranded()
    if failed or rerouted:
        log.warning("runs_reaped failed=%d rerouted=%d live_workers=%s", failed, rerouted, sorted(live))
    return {"failed": failed, "rerouted": rerouted}


def reroute_stranded() -> int:
    """Re-route the queued runs of workers that cannot take runs now (no heartbeat, or no live
    executor consuming their queue) to ones that can; returns how many moved. Nothing moves
    while no worker can take a run (they wait where they are) or Redis cannot be read. Runs
    within ``REROUTE_BOUND_S`` of their worker's executor dying (api/services/executor_presence.py)."""
    if settings.SYMPHONY_ROUTING == "static":
        return 0  # every run goes to the one configured worker: nowhere else to move it
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_lock(%s)", [REROUTE_LOCK])
        if not cursor.fetchone()[0]:
            return 0  # another executor is at it now
        try:
            able = {c.worker.name for c in routing.candidates()}
            if not able:
                return 0
            moved = 0
            stranded = Run.objects.filter(status="queued").exclude(worker__in=able).exclude(worker="")
            for run in stranded.select_related("tenant"):
                target = _enqueue(run, exclude=frozenset({run.worker}))
                log.warning(
                    "run_rerouted run=%s from=%s to=%s reason=worker_cannot_take_runs", run.pk, run.worker, target
                )
                moved += 1
            return moved
        finally:
            cursor.execute("SELECT pg_advisory_unlock(%s)", [REROUTE_LOCK])


def start_run(run_id: str, worker: str, target: str | None = None) -> Run | None:
    """Move queued -> running exactly once (row lock); None when the run must not start.
    ``target``: the worker the task was sent to; a run re-routed elsewhere since is not started
    from this stale task (its new task is in the other worker's queue)."""
    with transaction.atomic():
        # Its tenant and program version in the same statement: the executor reads both next
        # (each a query on the path of every run), and the tenant's ``closed_at`` is read fresh
        # here (a close committed before this statement is seen; one committed after it cancels
        # the run it finds running, api/services/tenant_closure.py). The program's bytes are
        # left for the sandbox launcher to load; the in-process one never needs them. The
        # tenant's tokens this month too (``run.month_tokens``): the worker's token cap is what is
        # left of the allowance when the run starts, counting runs that ended since its check.
        run = (
            Run.objects.select_for_update(of=("self",))
            .select_related("tenant", "program_version")
            .defer("program_version__content")
            .annotate(month_tokens=tokens_this_month_of(OuterRef("tenant_id")))
            .filter(pk=run_id)
            .first()
        )
        if run is None or run.status != "queued":
            return None
        if target is not None and run.worker and run.worker != target:
            log.info("stale_task_dropped run=%s sent_to=%s now_on=%s", run_id, target, run.worker)
            return None
        if run.tenant.closed_at is not None:
            # Created in the moment its tenant closed (api/services/tenant_closure.py).
            run.status, run.finished_at = "cancelled", timezone.now()
            run.save(update_fields=["status", "finished_at"])
            closed = True
        else:
            closed = False
            run.status = "running"
            run.worker = worker
            run.started_at = timezone.now()
            run.save(update_fields=["status", "worker", "started_at"])
    if closed:
        publish_end(run)
        return None
    publish_event(str(run.pk), StatusEvent("running"))
    return run


#: A cancelled run that started but has not recorded its usage is waited for until its deadline
#: has passed by this much (its sandbox has been killed by then, so its executor died).
SETTLE_GRACE_S = 120


def unsettled(runs: QuerySet[Run], max_run_seconds: float) -> QuerySet[Run]:
    """The runs among ``runs`` whose executor may still record an outcome: not finished, or
    cancelled after they started and without their usage yet, unless their deadline is long
    past. Deleting one of these would lose its usage (finish_run needs the row)."""
    horizon = timezone.now() - timezone.timedelta(seconds=max_run_seconds + SETTLE_GRACE_S)
    billed = Exists(UsageRecord.objects.filter(run=OuterRef("pk")))
    return runs.filter(~Q(status__in=Run.TERMINAL) | (Q(started_at__isnull=False, started_at__gt=horizon) & ~billed))


def delete_runs(runs: QuerySet[Run]) -> int:
    """Delete finished runs (arguments, results, output) and their event streams; their usage
    records stay, unlinked, so what they consumed is still billed. Callers check
    :func:`unsettled` first."""
    run_ids = [str(pk) for pk in runs.values_list("pk", flat=True)]
    deleted = runs.delete()[1].get("api.Run", 0)
    if run_ids:
        transaction.on_commit(lambda: _delete_event_streams(run_ids))
    return deleted


def _delete_event_streams(run_ids: list[str]) -> None:
    """Drop the runs' Redis event streams (they would expire with their retention anyway)."""
    try:
        client = _redis()
        for start in range(0, len(run_ids), 500):
            client.delete(*(contracts.run_stream_key(run_id) for run_id in run_ids[start : start + 500]))
    except redis.RedisError as exc:
        log.warning("run_streams_left count=%d error=%s (they expire with their retention)", len(run_ids), exc)


def cancel_run(run: Run, actor=None, api_key: ApiKey | None = None) -> Run:
    """Cancel a queued or running run (a running one's program is stopped by its executor) and
    its live descendants; terminal runs raise RunConflict. ``actor`` (the person signed in) or
    ``api_key`` (the key the request came with): who asked, kept as a ``run.cancel`` audit entry
    so the run's page can say who stopped it (a cascade has neither)."""
    with transaction.atomic():
        locked = Run.objects.select_for_update().get(pk=run.pk)
        if locked.status in Run.TERMINAL:
            raise RunConflict(f"run is already {locked.status}")
        locked.status = "cancelled"
        locked.finished_at = timezone.now()
        locked.save(update_fields=["status", "finished_at"])
        if actor is not None or api_key is not None:
            AuditLog.objects.create(
                actor=actor,
                tenant_id=locked.tenant_id,
                action="run.cancel",
                target=str(locked.pk),
                detail={"api_key": api_key.prefix} if api_key is not None else {},
            )
    # A running run's executor sees this and stops the program (api/services/cancellation.py).
    cancellation.request_stop(str(locked.pk))
    publish_end(locked)
    # Its spawned runs end with it (api/services/procs.py), each cascading to its own.
    for child in Run.objects.filter(parent_id=locked.pk).exclude(status__in=Run.TERMINAL):
        try:
            cancel_run(child)
        except RunConflict:
            pass  # it ended meanwhile
    return locked


#: The tenant a run is created in, locked (after its account, ``quotas.lock_account``): on the
#: path of every run creation, so compiled once a process (api/compiled_queries.py), at its first
#: call, inside ``create_run``'s transaction.
TENANT_TO_LOCK: CompiledQuery[Tenant] = CompiledQuery(
    lambda tenant_id: Tenant.objects.select_for_update().filter(pk=tenant_id)[:1],
    markers=(-7_000_000_003,),
)
#: The run ``finish_run`` records, locked, with its tenant: on the path of every run's answer,
#: so compiled once a process (api/compiled_queries.py). Compiled at its first call, which is
#: inside ``finish_run``'s transaction, as a locking read must be.
RUN_TO_FINISH: CompiledQuery[Run] = CompiledQuery(
    lambda run_id: Run.objects.select_for_update(of=("self",)).select_related("tenant").filter(pk=run_id)[:1],
    markers=(uuid.UUID(int=0x5EED),),
)
#: What ``finish_run`` writes of the run row (the rest is as the lock read it).
FINISHED_FIELDS = (
    "status",
    "result",
    "error",
    "exit_code",
    "stdout",
    "stderr",
    "output_truncated",
    "finished_at",
    "first_output_at",
)


def finish_run(run_id: str, outcome: RunOutcome, plan: PlanLimits | None = None) -> Run:
    """Record the end of a run and its usage in one transaction, then publish status/end.

    A run cancelled meanwhile keeps its status but still gets its usage billed. ``plan``: the
    tenant's plan as the request that created the run read it, for the quota notices.
    """
    with transaction.atomic():
        run = RUN_TO_FINISH.get(Run._meta.pk.to_python(run_id))
        if run.status not in Run.TERMINAL:
            run.status = outcome.status
        # The program's own bytes: PostgreSQL cannot store U+0000, and refusing them would lose
        # the outcome and its usage, so they are kept with U+FFFD instead.
        # django-stubs types a JSONField subclass's attribute as the field itself, not its value.
        run.result = make_storable(outcome.result)  # type: ignore[assignment]
        run.error = make_storable(outcome.error)
        run.exit_code = outcome.exit_code
        keep = settings.SYMPHONY_RUN_OUTPUT_KEEP_BYTES
        run.stdout, cut_out = output_tail(make_storable(outcome.stdout), keep)
        run.stderr, cut_err = output_tail(make_storable(outcome.stderr), keep)
        run.output_truncated = cut_out or cut_err
        run.finished_at = run.finished_at or timezone.now()
        run.first_output_at = _first_output_at(outcome.usage)
        run.save(update_fields=FINISHED_FIELDS)
        usage = {k: outcome.usage.get(k, 0) or 0 for k in USAGE_FIELDS + USAGE_DETAILS}
        record = _record_usage(run, usage)
        if outcome.trace is not None:
            run_traces.store(run, outcome.trace)
    run_handoff.offer(run, record)  # before its end event: the request waiting on it takes it then
    publish_end(run)
    quota_alerts.after_usage(run.tenant, plan)
    log.info("run_finished run=%s tenant=%s status=%s", run.pk, run.tenant.slug, run.status)
    if otel_export.enabled():  # after the commit and the run's end event; sent from the SDK's thread
        otel_export.export(run)
    return run


def _record_usage(run: Run, usage: dict) -> UsageRecord:
    """The run's usage row, written or (a second ``finish_run`` of the same run: a redelivered
    task, a settle after a crash) overwritten in one ``INSERT ... ON CONFLICT DO UPDATE``:
    ``update_or_create`` took six statements (two savepoints, a select, the insert) on the
    path of every run's answer. ``save()`` is bypassed, so ``from_run`` is set here."""
    record = UsageRecord(run=run, tenant=run.tenant, from_run=True, **usage)
    UsageRecord.objects.bulk_create(
        [record], update_conflicts=True, unique_fields=["run"], update_fields=["tenant", "from_run", *usage]
    )
    return record


def _first_output_at(usage: dict) -> datetime | None:
    """The worker's Unix time of the run's first ``send_to_user`` (0 or absent: none)."""
    at = usage.get("first_stream_at")
    if not isinstance(at, int | float) or isinstance(at, bool) or not math.isfinite(at) or at <= 0:
        return None
    return datetime.fromtimestamp(at, tz=UTC)
