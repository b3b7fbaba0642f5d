"""KVFS exceptions; each carries the protocol ``ErrorCode`` the session server replies with."""

from __future__ import annotations

from gpu_worker.protocol import ErrorCode


class KVFSError(Exception):
    """Base class: ``code`` is a protocol error code, ``message`` is safe to show a tenant."""

    code: str = ErrorCode.INTERNAL

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class NotFound(KVFSError):
    code = ErrorCode.NOT_FOUND


class PermissionDenied(KVFSError):
    code = ErrorCode.PERMISSION


class NoSpace(KVFSError):
    code = ErrorCode.NO_SPACE


class StoreFull(NoSpace):
    """The KV store (disk) has no room for a file's bytes; the previous copy is left intact."""


class Exists(KVFSError):
    code = ErrorCode.EXISTS


class InvalidArgument(KVFSError):
    code = ErrorCode.BAD_ARGS


class Busy(KVFSError):
    code = ErrorCode.BUSY
