"""What the worker and the control plane exchange through Redis: run event streams and worker
heartbeats, defined once for both sides.

* **Run events.** Each run has a Redis stream ``run:<run_id>`` of at most ~``STREAM_MAXLEN``
  entries, each entry two fields: ``type`` (one of :data:`EVENT_TYPES`) and ``data`` (the
  event's fields as JSON). The worker writes ``token``, ``message`` (a LIP's ``send_to_user``),
  ``channel`` (a message it sent to a run of its tree) and ``kv`` (its KV usage) through
  ``gpu_worker/events.py``; the control plane writes ``status`` and ``end``
  (``api/services/runs.py``) and reads every type (``api/views/run_events.py`` for Server-Sent
  Events, ``api/views/openai.py`` for OpenAI streaming). The SSE view passes ``data`` through as
  stored, so the JSON written here is what a browser or client parses.
* **Worker heartbeats.** Each worker SETs ``symphony:worker:<name>`` to its ``health`` answer
  (JSON) every couple of seconds with a ``HEARTBEAT_TTL_S`` expiry; the control plane's routing
  and metrics read them (``api/services/routing.py``). Before its first heartbeat a starting
  worker says so under ``symphony:worker-starting:<name>`` (:func:`starting_key`).

Like ``gpu_worker/protocol.py`` (the socket wire) this module is a contract, not worker
internals: the standard library only, no torch or Redis client, so the web process imports it
too. Records are frozen dataclasses rather than msgspec structs because the web image installs
only ``requirements/base.txt``, which does not carry msgspec.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

# ------------------------------------------------------------------------------ run events
RUN_STREAM_PREFIX = "run:"
#: Entries a run's stream keeps (approximately: Redis trims the oldest in whole nodes).
STREAM_MAXLEN = 10_000
#: The two fields of every stream entry.
TYPE_FIELD = "type"
DATA_FIELD = "data"


def run_stream_key(run_id: object) -> str:
    """The Redis stream of a run's events."""
    return f"{RUN_STREAM_PREFIX}{run_id}"


def run_id_of(key: str | bytes) -> str:
    """The run id a stream key names (the inverse of :func:`run_stream_key`)."""
    text = key.decode() if isinstance(key, bytes) else key
    return text.removeprefix(RUN_STREAM_PREFIX)


@dataclass(frozen=True)
class TokenEvent:
    """Text a LIP streamed to its user (``send_to_user`` with a string)."""

    TYPE: ClassVar[str] = "token"
    text: str

    def fields(self) -> dict[str, Any]:
        return {"text": self.text}


@dataclass(frozen=True)
class MessageEvent:
    """JSON data a LIP sent to its user (``send_to_user`` with anything but a string); the
    OpenAI-compatible LIP sends ``{"index", "delta"}`` here."""

    TYPE: ClassVar[str] = "message"
    data: Any

    def fields(self) -> dict[str, Any]:
        return {"data": self.data}


@dataclass(frozen=True)
class KvEvent:
    """The run's KV usage, published by the worker on a tick while it changes and once at the
    session's end: the device pages this run's files hold (what its page-seconds bill), its
    tenant's own pages on device and in host memory, and the tokens this run's files hold.
    Nothing of other tenants: worker-wide totals are for staff (the admin workers view, /metrics)."""

    TYPE: ClassVar[str] = "kv"
    run_pages: int
    tenant_device_pages: int
    tenant_host_pages: int
    tokens: int

    def fields(self) -> dict[str, Any]:
        return {
            "run_pages": self.run_pages,
            "tenant_device_pages": self.tenant_device_pages,
            "tenant_host_pages": self.tenant_host_pages,
            "tokens": self.tokens,
        }


@dataclass(frozen=True)
class StatusEvent:
    """The run's status changed (``running`` when an executor takes it, ``queued`` again with a
    ``reason`` when its worker was unreachable and it was re-routed, then its final one with the
    error text, empty when it succeeded). ``error`` and ``reason`` are left out when ``None``."""

    TYPE: ClassVar[str] = "status"
    status: str
    error: str | None = None
    reason: str | None = None

    def fields(self) -> dict[str, Any]:
        out: dict[str, Any] = {"status": self.status}
        if self.error is not None:
            out["error"] = self.error
        if self.reason is not None:
            out["reason"] = self.reason
        return out


@dataclass(frozen=True)
class EndEvent:
    """The last event of a run's stream: its final status and result. Readers stop here."""

    TYPE: ClassVar[str] = "end"
    status: str
    result: Any = None

    def fields(self) -> dict[str, Any]:
        return {"status": self.status, "result": self.result}


@dataclass(frozen=True)
class ChannelEvent:
    """A message the run sent to the runs of its tree (gpu_worker/channels.py), on the sending
    run's stream: ``op`` is ``send`` (for one receiver) or ``publish`` (for every subscriber),
    ``bytes`` its size as JSON."""

    TYPE: ClassVar[str] = "channel"
    channel: str
    op: str
    data: Any
    bytes: int

    def fields(self) -> dict[str, Any]:
        return {"channel": self.channel, "op": self.op, "data": self.data, "bytes": self.bytes}


RunEvent = TokenEvent | MessageEvent | KvEvent | StatusEvent | EndEvent | ChannelEvent
EVENT_CLASSES: dict[str, type[RunEvent]] = {
    cls.TYPE: cls for cls in (TokenEvent, MessageEvent, KvEvent, StatusEvent, EndEvent, ChannelEvent)
}
EVENT_TYPES: tuple[str, ...] = tuple(EVENT_CLASSES)
END = EndEvent.TYPE


class EventDecodeError(ValueError):
    """A stream entry that is not one of the events above."""


def encode_data(fields: Mapping[str, Any]) -> str:
    """An event's fields as stored: JSON with non-ASCII characters as themselves (UTF-8 in
    Redis), not ``\\uXXXX`` escapes, which made non-ASCII text take six bytes a character."""
    return json.dumps(fields, ensure_ascii=False, default=str)


def encode(event: RunEvent) -> tuple[str, str]:
    """``(type, data)`` of one stream entry."""
    return event.TYPE, encode_data(event.fields())


def entry(event: RunEvent) -> dict[Any, Any]:
    """The fields of one XADD, ``{"type": str, "data": str}`` (typed loosely: redis-py's
    ``xadd`` wants a dict of its own invariant key and value union)."""
    type_, data = encode(event)
    return {TYPE_FIELD: type_, DATA_FIELD: data}


def entry_bytes(type_: str, data: str) -> int:
    """Bytes one event takes in its stream (its ``type`` and ``data`` values): what a run's
    stream budget counts."""
    return len(type_) + len(data.encode("utf-8"))


def entry_strings(fields: Mapping[bytes, bytes]) -> tuple[str, str]:
    """``(type, data)`` of an entry as read from Redis, unparsed; an entry missing a field (not
    written through this module) reads as an empty ``message``."""
    type_ = fields.get(TYPE_FIELD.encode(), b"message").decode()
    return type_, fields.get(DATA_FIELD.encode(), b"{}").decode()


def decode(type_: str, data: str | bytes) -> RunEvent:
    """The event of one stream entry; :class:`EventDecodeError` for an unknown type or fields
    that do not fit it."""
    cls = EVENT_CLASSES.get(type_)
    if cls is None:
        raise EventDecodeError(f"unknown run event type {type_!r}")
    try:
        fields = json.loads(data)
    except ValueError as exc:
        raise EventDecodeError(f"{type_} event data is not JSON: {exc}") from None
    if not isinstance(fields, dict):
        raise EventDecodeError(f"{type_} event data must be a JSON object")
    try:
        return cls(**fields)
    except TypeError as exc:
        raise EventDecodeError(f"{type_} event fields do not fit: {exc}") from None


# ------------------------------------------------------------- process relay (symphony.spawn)
# A LIP's ``spawn`` and ``child_cancel`` need the control plane (a run row, plan limits, an
# executor), which the worker must not import. The worker pushes a :class:`ProcRequest` as
# JSON onto the parent run's list ``symphony:procs:<run_id>`` and BLPOPs the reply list
# ``symphony:procs:reply:<request_id>``; the parent's executor serves its own run's list
# (``api/services/procs.py``) and pushes a :class:`ProcReply`. ``child_wait`` needs no relay:
# the worker reads the child's event stream for its ``end`` event.
PROC_REQUESTS_PREFIX = "symphony:procs:"
#: Requests and replies nobody took expire (a parent that ended, a worker that gave up).
PROC_KEY_TTL_S = 120
#: How long the worker waits for the executor's answer to a spawn or a cancel.
PROC_REPLY_TIMEOUT_S = 30.0


def proc_requests_key(run_id: object) -> str:
    """The list the executor of ``run_id`` serves its LIP's spawns and cancels from."""
    return f"{PROC_REQUESTS_PREFIX}{run_id}"


def proc_reply_key(request_id: str) -> str:
    return f"{PROC_REQUESTS_PREFIX}reply:{request_id}"


@dataclass(frozen=True)
class ProcRequest:
    """One ``spawn`` (``entry``, ``args``, ``limits``) or ``cancel`` (``child``) of run ``parent``."""

    OPS: ClassVar[tuple[str, ...]] = ("spawn", "cancel")
    id: str
    op: str
    parent: str
    entry: str = ""
    args: Any = None
    limits: dict[str, Any] | None = None
    child: str = ""

    def encode(self) -> str:
        return json.dumps(
            {k: getattr(self, k) for k in ("id", "op", "parent", "entry", "args", "limits", "child")},
            separators=(",", ":"),
        )

    @classmethod
    def decode(cls, raw: str | bytes) -> ProcRequest:
        """Raises ``ValueError`` for anything but a request written by :meth:`encode`."""
        fields = json.loads(raw)
        if not isinstance(fields, dict) or fields.get("op") not in cls.OPS:
            raise ValueError("not a process request")
        try:
            return cls(**fields)
        except TypeError as exc:
            raise ValueError(f"process request fields do not fit: {exc}") from None


@dataclass(frozen=True)
class ProcReply:
    """The executor's answer: ``ok`` with the child's id (spawn) or whether it was cancelled,
    else the protocol error ``code`` (``gpu_worker.protocol.ErrorCode``) and its ``message``."""

    id: str
    ok: bool
    child: str = ""
    cancelled: bool = False
    code: str = ""
    message: str = ""

    def encode(self) -> str:
        return json.dumps(
            {k: getattr(self, k) for k in ("id", "ok", "child", "cancelled", "code", "message")},
            separators=(",", ":"),
        )

    @classmethod
    def decode(cls, raw: str | bytes) -> ProcReply:
        fields = json.loads(raw)
        if not isinstance(fields, dict):
            raise ValueError("not a process reply")
        try:
            return cls(**fields)
        except TypeError as exc:
            raise ValueError(f"process reply fields do not fit: {exc}") from None


# ------------------------------------------------------------------------- heartbeats
#: Workers announce themselves under ``symphony:worker:<name>``; the key expires when they stop.
HEARTBEAT_PREFIX = "symphony:worker:"
HEARTBEAT_TTL_S = 10


def heartbeat_key(worker_name: str) -> str:
    return HEARTBEAT_PREFIX + worker_name


#: While a worker process starts (loading the model; a first start on a machine also compiles
#: it, minutes on a CPU) it SETs ``symphony:worker-starting:<name>`` to the Unix time it began,
#: every ``STARTING_EVERY_S`` with a ``HEARTBEAT_TTL_S`` expiry, and deletes it once it answers
#: on its admin socket. An executor that finds no admin socket then lets its runs wait for the
#: worker instead of failing them over as if it were dead (``api/services/worker_start.py``).
STARTING_PREFIX = "symphony:worker-starting:"
STARTING_EVERY_S = 2.0


def starting_key(worker_name: str) -> str:
    return STARTING_PREFIX + worker_name


@dataclass(frozen=True)
class WorkerHeartbeat:
    """What the control plane routes on, read from a worker's heartbeat; ``health`` is the
    whole answer (device, model, scheduler metrics) as the worker's ``health`` op gives it."""

    name: str
    ok: bool
    pages_free: int
    pages_total: int
    sessions: int
    health: dict[str, Any] = field(default_factory=dict, compare=False)


def encode_heartbeat(health: Mapping[str, Any]) -> str:
    """A heartbeat's value: the worker's ``health`` answer (it carries ``name``) as JSON."""
    if "name" not in health:
        raise ValueError("a heartbeat names its worker")
    return json.dumps(health, default=str)


# ------------------------------------------------------------------- usage checkpoints
#: While a session runs, its worker keeps its usage so far under ``symphony:usage:<run_id>``
#: (JSON, the ``SessionEnded.usage`` fields), rewritten when it changes: a run whose worker or
#: executor dies before the session's end is billed for what it used up to then.
USAGE_CHECKPOINT_PREFIX = "symphony:usage:"
USAGE_CHECKPOINT_TTL_S = 2 * 3600  # rewritten every 5 s while the session lives


def usage_checkpoint_key(run_id: str) -> str:
    return USAGE_CHECKPOINT_PREFIX + str(run_id)


def decode_usage_checkpoint(raw: str | bytes | None) -> dict[str, Any]:
    """A checkpoint as read back: its numeric fields (empty when none was written)."""
    if not raw:
        return {}
    try:
        info = json.loads(raw)
    except ValueError:
        return {}
    if not isinstance(info, dict):
        return {}
    return {k: v for k, v in info.items() if isinstance(v, int | float) and not isinstance(v, bool)}


def decode_heartbeat(raw: str | bytes) -> WorkerHeartbeat:
    """A heartbeat as read back; a field the worker left out reads as 0 / not ok."""
    info = json.loads(raw)
    return WorkerHeartbeat(
        name=str(info["name"]),
        ok=bool(info.get("ok", False)),
        pages_free=int(info.get("pages_free", 0)),
        pages_total=int(info.get("pages_total", 0)),
        sessions=int(info.get("sessions", 0)),
        health=info,
    )
