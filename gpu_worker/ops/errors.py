"""Internal errors -> wire errors, at the edge: KVFS and the scheduler raise their own exception
types (they know nothing of the protocol); what a LIP or the control plane reads is decided here."""

from __future__ import annotations

import logging

from gpu_worker import kvfs, scheduler
from gpu_worker.kvfs.lease import LeaseLost, StoreUnavailable
from gpu_worker.protocol import ErrorCode, ErrorReason, ProtocolError

log = logging.getLogger(__name__)

#: Checked in order (the first class an error is an instance of): subclasses before bases.
_CODES: tuple[tuple[type[Exception], str], ...] = (
    (kvfs.NotFound, ErrorCode.NOT_FOUND),
    (kvfs.PermissionDenied, ErrorCode.PERMISSION),
    (kvfs.NoSpace, ErrorCode.NO_SPACE),
    (kvfs.KVQuotaExceeded, ErrorCode.QUOTA),
    (kvfs.Exists, ErrorCode.EXISTS),
    (kvfs.InvalidArgument, ErrorCode.BAD_ARGS),
    (kvfs.Busy, ErrorCode.BUSY),
    # The store's outage is the program's I/O failing (it may retry), not a worker bug.
    (StoreUnavailable, ErrorCode.IO),
    (LeaseLost, ErrorCode.IO),
    (kvfs.KVFSError, ErrorCode.INTERNAL),
    (scheduler.SessionEndedError, ErrorCode.TIMEOUT),
    (scheduler.ShuttingDown, ErrorCode.BUSY),
    (scheduler.ContextFull, ErrorCode.NO_SPACE),
    (scheduler.ForwardFailed, ErrorCode.INTERNAL),
)


def wire_error(exc: BaseException, op: str, session_id: str) -> ProtocolError:
    """The protocol error a failed op answers with. KVFS and scheduler errors keep their message
    (written to be shown to a tenant); an unexpected one is logged with its trace and answered as
    INTERNAL without details."""
    if isinstance(exc, ProtocolError):
        return exc
    if isinstance(exc, kvfs.PoolFull):
        return ProtocolError(ErrorCode.NO_SPACE, exc.message, ErrorReason.KV_POOL_FULL)
    for cls, code in _CODES:
        if isinstance(exc, cls):
            return ProtocolError(code, getattr(exc, "message", str(exc)))
    log.error("event=op_failed op=%s session=%s", op[:64], session_id, exc_info=exc)
    return ProtocolError(ErrorCode.INTERNAL, f"{op} failed: {type(exc).__name__}")
