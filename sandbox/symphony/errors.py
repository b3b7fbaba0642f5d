"""Exceptions a LIP sees. Every worker error reply carries a protocol ``ErrorCode``; the SDK
raises the subclass registered for that code so programs can ``except KVNotFound`` instead of
parsing messages."""

from __future__ import annotations

from symphony.wire import protocol

ErrorCode = protocol.ErrorCode


class SymphonyError(Exception):
    """Base of every SDK error; ``code`` is the protocol error code, ``op`` the failed call."""

    code: str = ErrorCode.INTERNAL

    def __init__(self, message: str, *, code: str | None = None, op: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        self.op = op

    def __str__(self) -> str:
        where = f" ({self.op})" if self.op else ""
        return f"{self.code}{where}: {self.message}"


class BadFrame(SymphonyError):
    code = ErrorCode.BAD_FRAME


class InvalidArgument(SymphonyError, ValueError):
    code = ErrorCode.BAD_ARGS


class UnknownOp(SymphonyError):
    code = ErrorCode.UNKNOWN_OP


class NotAuthenticated(SymphonyError):
    code = ErrorCode.NOT_AUTHENTICATED


class PermissionDenied(SymphonyError, PermissionError):
    code = ErrorCode.PERMISSION


class KVNotFound(SymphonyError, LookupError):
    code = ErrorCode.NOT_FOUND


class KVExists(SymphonyError):
    code = ErrorCode.EXISTS


class NoSpace(SymphonyError):
    code = ErrorCode.NO_SPACE


class QuotaExceeded(SymphonyError):
    code = ErrorCode.QUOTA


class Busy(SymphonyError):
    code = ErrorCode.BUSY


class DeadlineExceeded(SymphonyError, TimeoutError):
    code = ErrorCode.TIMEOUT


class IOFailed(SymphonyError, OSError):
    code = ErrorCode.IO


class InternalError(SymphonyError):
    code = ErrorCode.INTERNAL


class ChannelFull(NoSpace):
    """A channel's queue (or a subscriber's) holds its bound of unread messages, or the tenant's
    unread channel bytes are at theirs: receivers must read some first (``reason``: ``channel_full``)."""

    code = ErrorCode.CHANNEL_FULL
    reason = "channel_full"


class KVPoolFull(NoSpace):
    """The worker's device KV pool gives this account no more pages now: it holds its bound of
    the pool, or the pool is full (``kv_pool_full``). Load, not the request: retry later."""

    code = ErrorCode.NO_SPACE
    reason = protocol.ErrorReason.KV_POOL_FULL


class MessageTooLarge(InvalidArgument):
    """One channel message over ``MAX_CHANNEL_MESSAGE_BYTES`` as JSON (``message_too_large``)."""

    code = ErrorCode.MESSAGE_TOO_LARGE
    reason = "message_too_large"


class TooManyChannels(NoSpace):
    """The run tree's channels, or this run's subscriptions, are at their bound (``too_many_channels``)."""

    code = ErrorCode.TOO_MANY_CHANNELS
    reason = "too_many_channels"


class ChannelClosed(SymphonyError):
    """The channel was closed (and is drained), the subscription dropped, or the run's session or
    tree ended (``channel_closed``)."""

    code = ErrorCode.CHANNEL_CLOSED
    reason = "channel_closed"


class SendersGone(ChannelClosed):
    """A ``recv`` (or a subscription's) that waited on an empty channel while every run that
    could send on it ended: every child this run spawned has ended (failed, cancelled, timed
    out or finished) and no other run of the tree is left (``senders_gone``). The message names
    each child's outcome; ``Child.wait()`` gives one child's result or :class:`ChildFailed`."""

    reason = protocol.ErrorReason.SENDERS_GONE


class ChannelTimeout(SymphonyError, TimeoutError):
    """``recv(timeout=...)`` passed with no message (``channel_timeout``). The run's own deadline
    passing while it waits raises :class:`DeadlineExceeded` instead."""

    code = ErrorCode.CHANNEL_TIMEOUT
    reason = "channel_timeout"


class ConnectionLost(SymphonyError, ConnectionError):
    """The session socket closed (the worker ended the session, or the connection failed)."""

    code = "ECONNLOST"


class ChildFailed(SymphonyError):
    """``Child.wait()`` on a child run that did not succeed: ``status`` is its final status
    (``failed``, ``timed_out``, ``cancelled``) and ``error`` the error it ended with."""

    code = "ECHILD"

    def __init__(self, child: str, status: str, error: str = "") -> None:
        said = f": {error}" if error else ""
        super().__init__(f"child run {child} {status}{said}", op="child_wait")
        self.child, self.status, self.error = child, status, error


_BY_CODE: dict[str, type[SymphonyError]] = {
    cls.code: cls
    for cls in (
        BadFrame,
        InvalidArgument,
        UnknownOp,
        NotAuthenticated,
        PermissionDenied,
        KVNotFound,
        KVExists,
        NoSpace,
        QuotaExceeded,
        Busy,
        DeadlineExceeded,
        IOFailed,
        InternalError,
        ChannelFull,
        MessageTooLarge,
        TooManyChannels,
        ChannelClosed,
        ChannelTimeout,
    )
}


#: Cases of a code a program handles apart (``err.reason``), each a subclass of the code's class.
_BY_REASON: dict[tuple[str, str], type[SymphonyError]] = {
    (KVPoolFull.code, KVPoolFull.reason): KVPoolFull,
    (SendersGone.code, SendersGone.reason): SendersGone,
}


def from_wire(code: str, message: str, op: str | None = None, reason: str | None = None) -> SymphonyError:
    """The exception for an error reply; unknown codes become a plain :class:`SymphonyError`."""
    cls = _BY_REASON.get((code, reason or "")) or _BY_CODE.get(code)
    if cls is None:
        return SymphonyError(message, code=code, op=op)
    return cls(message, op=op)
