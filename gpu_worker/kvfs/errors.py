"""KVFS exceptions. KVFS knows nothing of the wire protocol: which error code a LIP or the control
plane reads for each is decided at the edge (``gpu_worker/ops/errors.py``)."""

from __future__ import annotations


class KVFSError(Exception):
    """Base class: ``message`` is safe to show a tenant."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class NotFound(KVFSError):
    """No such file or handle (in the caller's scope)."""


class PermissionDenied(KVFSError):
    """The file or handle belongs to another session or tenant, or is held by a writer."""


class NoSpace(KVFSError):
    """No room: device pages, a session's page cap, or host memory."""


class PoolFull(NoSpace):
    """The worker's device page pool gives no more pages to this account now: it holds its
    bound of the pool (gpu_worker/kvfs/accounts.py) or the pool is full. Unlike the run's own
    page cap or the model's context, it is about load, not the request: retrying later may work."""


class StoreFull(NoSpace):
    """The KV store (disk) has no room for a file's bytes; the previous copy is left intact."""


class KVQuotaExceeded(KVFSError):
    """A tenant's plan share of a tier (pinned pages, named files) would be exceeded. KVFS's
    error; a program sees it as EDQUOT, the SDK's ``symphony.QuotaExceeded``."""


class Exists(KVFSError):
    """A file of that name exists already."""


class InvalidArgument(KVFSError):
    """A bad name, range or mode."""


class Busy(KVFSError):
    """The file is being moved (swap, spill, reload); retried by the scheduler."""
