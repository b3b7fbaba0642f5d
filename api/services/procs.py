"""Run trees: a LIP's ``symphony.spawn`` creates a child run, which its parent's executor runs.

The LIP talks only to its worker; the worker relays ``spawn`` and ``child_cancel`` through Redis
(``gpu_worker/contracts.py``: ``ProcRequest`` / ``ProcReply``) to the executor of the parent run,
where a :class:`ProcessBroker` (started next to ``CancelWatch`` in api/services/execution.py)
serves them with the database:

* ``spawn`` checks the entry against the program's bundle and the limits like ``POST /runs``
  does, then, under the tenant's row lock, the plan: children per run (``max_children_per_run``,
  counted over the run's life, so a loop of spawns stops), tree depth (``max_spawn_depth``, so a
  recursive spawn stops) and the tree's live runs below its root (``max_children_per_run`` too).
  A tree counts **once** against the tenant's concurrent runs (its root does), so the documented
  patterns (a coordinator and its team) run on every plan. A spawn past any bound is **refused
  at once** (EDQUOT), never queued: a parent waiting on a child that waits for a slot the parent
  holds would deadlock the tree.
* The child runs **in a thread of the parent's executor** (``execute_run``, no Celery hop): it
  needs no executor slot, so it cannot wait for one, and it runs on the parent's worker by
  construction, where the parent's KV files and batches are. Its own sandbox and session, as
  any run.
* A child's deadline is never past its parent's remaining time, and when the parent ends, however
  it ends, its broker cancels its live children (who cancel theirs) before the parent's outcome is
  recorded. ``cancel_run`` cascades too (api/services/runs.py), for a parent cancelled over the API.
* ``child_wait`` is the worker's alone: it reads the child's event stream for its ``end`` event.
"""

from __future__ import annotations

import ast
import contextlib
import io
import keyword
import logging
import threading
import time
import zipfile
from collections.abc import Callable

import redis
from django.conf import settings
from django.db import close_old_connections, connection, transaction
from rest_framework import serializers as drf

from api import redis_client
from api.models import ProgramVersion, Run, Tenant
from api.services.quotas import PlanQuotaExceeded, check_can_start, live_descendants, plan_limits
from gpu_worker import contracts
from gpu_worker.protocol import ErrorCode

log = logging.getLogger(__name__)

#: How long a parent's executor waits for its cancelled children to record their outcomes.
CHILD_JOIN_S = 30.0
#: How long a broker's wake-up entry may outlive a broker that never read it.
WAKE_KEY_TTL_S = 60
#: A spawn with less time than this left to its parent is refused (the child could not start).
MIN_CHILD_SECONDS = 1.0
#: Entry words meaning "the program itself".
SELF_ENTRIES = ("", "self")


class SpawnRefused(Exception):
    """A spawn or cancel the control plane refuses; ``code`` is the protocol error the LIP gets."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


# ------------------------------------------------------------------------------- entries
def parse_entry(entry: object) -> tuple[str, str]:
    """``(module, function)`` of an entry: ``"pkg.agent"``, ``"pkg/agent.py"``, ``"agent.py:run"``,
    ``"self:helper"``; "" / "self" / None: the program's own ``main``."""
    if entry is None:
        entry = ""
    if not isinstance(entry, str):
        raise SpawnRefused(ErrorCode.BAD_ARGS, "entry must be a string")
    module, _, function = entry.strip().partition(":")
    module = module.strip()
    if module in SELF_ENTRIES:
        module = ""
    elif module.endswith(".py"):
        module = module[:-3].replace("/", ".")
    function = function.strip() or "main"
    parts = module.split(".") if module else []
    if any(not p.isidentifier() or keyword.iskeyword(p) for p in parts):
        raise SpawnRefused(ErrorCode.BAD_ARGS, f"entry {entry!r}: {module!r} is not a module name")
    if not function.isidentifier() or keyword.iskeyword(function):
        raise SpawnRefused(ErrorCode.BAD_ARGS, f"entry {entry!r}: {function!r} is not a function name")
    return module, function


def _defines(source: bytes, function: str) -> bool | None:
    """Whether ``source`` binds ``function`` at its top level; None when it cannot be parsed
    (the child will report why)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return None
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and node.name == function:
            return True
        if isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == function for t in targets):
                return True
        if isinstance(node, ast.Import | ast.ImportFrom):
            if any((a.asname or a.name.split(".")[0]) == function for a in node.names):
                return True
    return False


def resolve_entry(version: ProgramVersion, entry: object) -> str:
    """The entry checked against the program's bundle, as ``module:function`` (what the runner
    reads: sandbox/symphony/run.py). An unknown module or function is EINVAL now, not a child
    that fails to load."""
    module, function = parse_entry(entry)
    content = bytes(version.content)
    if version.kind != "zip":
        if module:
            raise SpawnRefused(
                ErrorCode.BAD_ARGS,
                f"unknown entry {entry!r}: a single-file program has no module {module!r}"
                " (spawn None for its main, or 'self:function' for another of its functions)",
            )
        source = content
    else:
        path = module.replace(".", "/") if module else "main"
        with zipfile.ZipFile(io.BytesIO(content)) as bundle:
            names = set(bundle.namelist())
            found = next((n for n in (f"{path}.py", f"{path}/__init__.py") if n in names), None)
            if found is None:
                raise SpawnRefused(
                    ErrorCode.BAD_ARGS, f"unknown entry {entry!r}: the program's bundle has no {path}.py or {path}/"
                )
            source = bundle.read(found)
    if _defines(source, function) is False:
        where = f"module {module}" if module else "the program"
        raise SpawnRefused(ErrorCode.BAD_ARGS, f"unknown entry {entry!r}: {where} defines no {function}(args)")
    # A single-file program's own function is stored as ``self:function``, as the author wrote it
    # (``:function`` read as a typo in listings); the runner reads ``self`` as the program itself.
    return f"{module or 'self'}:{function}" if (module or function != "main") else ""


# -------------------------------------------------------------------------------- spawning
def _clean_limits(tenant: Tenant, limits: object) -> dict:
    """A child's limits checked like ``POST /runs``'s (api/serializers/runs.py)."""
    from api.serializers.runs import RunLimitsSerializer
    from api.services import tool_hosts

    if limits is None:
        limits = {}
    ser = RunLimitsSerializer(data=limits, context={"plan": plan_limits(tenant)})
    if not ser.is_valid():
        detail = ser.errors if isinstance(ser.errors, dict) else {"limits": ser.errors}
        said = "; ".join(f"{k}: {' '.join(str(m) for m in v)}" for k, v in detail.items())
        raise SpawnRefused(ErrorCode.BAD_ARGS, f"spawn limits refused: {said}")
    clean = dict(ser.validated_data)
    try:
        tool_hosts.check_run_hosts(tenant, clean)
    except tool_hosts.ToolHostsInvalid as exc:
        raise SpawnRefused(ErrorCode.PERMISSION, str(exc)) from None
    return clean


def _clean_args(args: object) -> object:
    from api.validators import storable_json

    try:
        storable_json(args)
    except drf.ValidationError as exc:
        raise SpawnRefused(ErrorCode.BAD_ARGS, f"spawn args refused: {' '.join(map(str, exc.detail))}") from None
    return args


def create_child(parent_id: str, entry: object, args: object, limits: object, remaining_s: float) -> Run:
    """A queued child run of ``parent_id`` (not started: :class:`ProcessBroker` runs it), or
    :class:`SpawnRefused` naming the limit or the bad input."""
    parent = Run.objects.select_related("tenant", "program_version").get(pk=parent_id)
    canonical = resolve_entry(parent.program_version, entry)
    child_limits = _clean_limits(parent.tenant, limits)
    args = {} if args is None else _clean_args(args)  # like a run created without args
    if remaining_s < MIN_CHILD_SECONDS:
        raise SpawnRefused(ErrorCode.TIMEOUT, f"the run has {max(remaining_s, 0):.1f}s left: too little for a child")
    asked = child_limits.get("deadline_s")
    child_limits["deadline_s"] = round(min(float(asked) if asked else remaining_s, remaining_s), 3)
    with transaction.atomic():
        # No account lock: a child counts within its tree, not against the account's runs.
        tenant = Tenant.objects.select_for_update().get(pk=parent.tenant_id)
        if tenant.closed_at is not None:
            raise SpawnRefused(ErrorCode.PERMISSION, "this tenant is closed")
        status = Run.objects.filter(pk=parent.pk).values_list("status", flat=True).first()
        if status != "running":
            raise SpawnRefused(ErrorCode.PERMISSION, f"the spawning run is {status}, not running")
        plan = plan_limits(tenant)
        if parent.depth + 1 > plan.max_spawn_depth:
            raise SpawnRefused(
                ErrorCode.QUOTA,
                f"spawn refused: plan {tenant.plan} allows run trees {plan.max_spawn_depth} level(s) deep"
                f" (max_spawn_depth) and this run is at level {parent.depth}",
            )
        spawned = Run.objects.filter(parent=parent).count()
        if spawned >= plan.max_children_per_run:
            raise SpawnRefused(
                ErrorCode.QUOTA,
                f"spawn refused: plan {tenant.plan} allows {plan.max_children_per_run} children per run"
                f" (max_children_per_run) and this run has spawned {spawned}",
            )
        root = _root_of(parent)
        live = live_descendants(root, plan.max_spawn_depth)
        if live >= plan.max_children_per_run:
            raise SpawnRefused(
                ErrorCode.QUOTA,
                f"spawn refused: plan {tenant.plan} allows {plan.max_children_per_run} live runs below the root"
                f" of a run tree (max_children_per_run) and this tree has {live}; a spawn past a limit is"
                " refused, not queued, so a parent waiting on its children cannot deadlock its tree",
            )
        try:
            check_can_start(tenant, child_limits, plan, child=True)
        except PlanQuotaExceeded as exc:
            raise SpawnRefused(ErrorCode.QUOTA, f"spawn refused: {exc}") from None
        child = Run.objects.create(
            tenant=tenant,
            program_version=parent.program_version,
            api_key=parent.api_key,
            args=args,
            limits=child_limits,
            parent=parent,
            depth=parent.depth + 1,
            entry=canonical,
            worker=parent.worker,
        )
    log.info("run_spawned run=%s parent=%s tenant=%s entry=%s", child.pk, parent.pk, tenant.slug, canonical or "main")
    return child


def _root_of(run: Run) -> object:
    """The id of the root run of ``run``'s tree (a tree is as deep as its plan allows, a few
    levels: one query a level)."""
    node_id, parent_id = run.pk, run.parent_id
    while parent_id is not None:
        node_id, parent_id = parent_id, Run.objects.filter(pk=parent_id).values_list("parent_id", flat=True).first()
    return node_id


def cancel_child(parent_id: str, child_id: str) -> bool:
    """Cancel ``child_id`` (and its descendants) if it is ``parent_id``'s and still live."""
    from api.services.runs import RunConflict, cancel_run

    child = Run.objects.filter(pk=child_id, parent_id=parent_id).first()
    if child is None:
        raise SpawnRefused(ErrorCode.PERMISSION, f"run {child_id} is not a child of this run")
    try:
        cancel_run(child)
    except RunConflict:
        return False
    return True


def cancel_live_children(run_id: str) -> int:
    """Cancel every child of ``run_id`` still queued or running (each cascades to its own)."""
    from api.services.runs import RunConflict, cancel_run

    cancelled = 0
    for child in Run.objects.filter(parent_id=run_id).exclude(status__in=Run.TERMINAL):
        try:
            cancel_run(child)
            cancelled += 1
        except RunConflict:
            pass
    return cancelled


def _execute_child(execute: Callable[[str], object], child_id: str) -> None:
    try:
        execute(child_id)
    except Exception:
        log.exception("child_run_failed run=%s", child_id)
    finally:
        connection.close()  # this thread's own connection


# ---------------------------------------------------------------------------------- broker
class ProcessBroker:
    """``with ProcessBroker(run_id, deadline_s, execute_run):`` around a run's sandbox: serves its LIP's spawns
    and cancels (relayed by the worker), runs its children in threads of this process, and on
    exit cancels the children still live and waits (``CHILD_JOIN_S``) for them to finish."""

    def __init__(self, run_id: str, deadline_s: float, execute: Callable[[str], object]) -> None:
        """``execute``: how a child run is executed (``execution.execute_run``, passed in by it)."""
        self.run_id = str(run_id)
        self._execute = execute
        self._until = time.monotonic() + float(deadline_s)
        self._stop = threading.Event()
        self._children: dict[str, threading.Thread] = {}
        self._thread = threading.Thread(target=self._serve, name=f"proc-broker-{run_id}", daemon=True)

    def remaining(self) -> float:
        return self._until - time.monotonic()

    def __enter__(self) -> ProcessBroker:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._wake()
        self._thread.join(timeout=CHILD_JOIN_S)  # a spawn being served finishes first
        if not self._thread.is_alive():
            self._forget_wake()  # the thread may have ended on its own before the wake landed
        if not self._children:
            return
        try:
            close_old_connections()
            ended = cancel_live_children(self.run_id)
        except Exception:
            log.exception("children_cancel_failed run=%s", self.run_id)
            ended = 0
        give_up = time.monotonic() + CHILD_JOIN_S
        for child_id, thread in self._children.items():
            thread.join(timeout=max(0.0, give_up - time.monotonic()))
            if thread.is_alive():
                log.warning("child_still_running run=%s child=%s", self.run_id, child_id)
        log.info("children_ended run=%s children=%d cancelled=%d", self.run_id, len(self._children), ended)

    def _wake_key(self) -> str:
        return f"{contracts.proc_requests_key(self.run_id)}:wake"

    def _wake(self) -> None:
        """Wake the serving thread out of its blocking pop. Without it the run's end waited for
        the pop's timeout: every sandboxed run ended on the next whole second after its start
        (a run whose program took 1.1 s finished after 2 s), and any slowdown of a run was
        rounded up to a whole second more. On a Redis error the pop's timeout still ends it."""
        try:
            client = redis_client.shared(settings.REDIS_URL)
            pipe = client.pipeline(transaction=True)
            pipe.rpush(self._wake_key(), "1")
            pipe.expire(self._wake_key(), WAKE_KEY_TTL_S)
            pipe.execute()
        except redis.RedisError as exc:
            log.warning("proc_broker_wake_failed run=%s error=%s", self.run_id, exc)

    def _forget_wake(self) -> None:
        with contextlib.suppress(redis.RedisError):
            redis_client.shared(settings.REDIS_URL).delete(self._wake_key())

    def _serve(self) -> None:
        client = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=10, socket_connect_timeout=2)
        key = contracts.proc_requests_key(self.run_id)
        try:
            while not self._stop.is_set():
                try:
                    got = client.blpop([key, self._wake_key()], timeout=1)
                except redis.RedisError as exc:
                    log.warning("proc_broker_redis run=%s error=%s", self.run_id, exc)
                    self._stop.wait(1)
                    continue
                if got is None or got[0] not in (key, key.encode()):
                    continue  # the pop's timeout, or ``_wake``: the loop checks ``_stop``
                try:
                    request = contracts.ProcRequest.decode(got[1])
                except ValueError as exc:
                    log.warning("proc_request_unreadable run=%s error=%s", self.run_id, exc)
                    continue
                reply = self.handle(request)
                try:
                    pipe = client.pipeline(transaction=True)
                    pipe.rpush(contracts.proc_reply_key(request.id), reply.encode())
                    pipe.expire(contracts.proc_reply_key(request.id), contracts.PROC_KEY_TTL_S)
                    pipe.execute()
                except redis.RedisError as exc:
                    log.warning("proc_reply_lost run=%s request=%s error=%s", self.run_id, request.id, exc)
        finally:
            with contextlib.suppress(redis.RedisError):
                client.delete(self._wake_key())
            client.close()
            connection.close()

    def handle(self, request: contracts.ProcRequest) -> contracts.ProcReply:
        """One relayed request -> its reply (never raises: the LIP must get an answer)."""
        close_old_connections()
        try:
            if request.parent != self.run_id:
                raise SpawnRefused(ErrorCode.PERMISSION, "request for another run")
            if request.op == "spawn":
                child = create_child(self.run_id, request.entry, request.args, request.limits, self.remaining())
                self.start(str(child.pk))
                return contracts.ProcReply(request.id, True, child=str(child.pk))
            return contracts.ProcReply(request.id, True, cancelled=cancel_child(self.run_id, request.child))
        except SpawnRefused as exc:
            log.info("spawn_refused run=%s op=%s reason=%s", self.run_id, request.op, exc.message)
            return contracts.ProcReply(request.id, False, code=exc.code, message=exc.message)
        except Exception as exc:
            log.exception("proc_request_failed run=%s op=%s", self.run_id, request.op)
            return contracts.ProcReply(
                request.id, False, code=ErrorCode.INTERNAL, message=f"{request.op} failed: {type(exc).__name__}"
            )

    def start(self, child_id: str) -> None:
        """Execute the child in a thread of this process (see the module docstring); a child
        created while the parent was ending is cancelled instead: nobody would end it."""
        if self._stop.is_set():
            cancel_live_children(self.run_id)
            return
        thread = threading.Thread(
            target=_execute_child, args=(self._execute, child_id), name=f"child-{child_id}", daemon=True
        )
        self._children[child_id] = thread
        thread.start()
