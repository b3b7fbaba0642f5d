"""KVFS: KV-cache files over the engine's paged KV cache (docs/ARCHITECTURE.md §5).

Pure bookkeeping plus tiering; page contents move only through ``PageIO`` (the Engine).
Never imports Django or vLLM.
"""

from gpu_worker.kvfs.budgets import KVFSLimits
from gpu_worker.kvfs.errors import (
    Busy,
    Exists,
    InvalidArgument,
    KVFSError,
    KVQuotaExceeded,
    NoSpace,
    NotFound,
    PermissionDenied,
    PoolFull,
    StoreFull,
)
from gpu_worker.kvfs.files import Owner, validate_name
from gpu_worker.kvfs.fs import KVFS, AppendPlan
from gpu_worker.kvfs.quota import TenantQuota
from gpu_worker.kvfs.stats import KVFileInfo, KVStats
from gpu_worker.kvfs.store import KVStore, LocalKVStore, S3KVStore, store_from_location
from gpu_worker.kvfs.tiers import PageIO

__all__ = [
    "KVFS",
    "AppendPlan",
    "Busy",
    "Exists",
    "InvalidArgument",
    "KVFSError",
    "KVFSLimits",
    "KVFileInfo",
    "KVQuotaExceeded",
    "KVStats",
    "KVStore",
    "LocalKVStore",
    "NoSpace",
    "NotFound",
    "Owner",
    "PageIO",
    "PermissionDenied",
    "PoolFull",
    "S3KVStore",
    "StoreFull",
    "TenantQuota",
    "store_from_location",
    "validate_name",
]
