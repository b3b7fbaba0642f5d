"""Byte stores for spilled KV files: a local directory (default) or an S3 bucket.

Keys are ``<tenant>/<name>.safetensors`` (and the file's lease, ``<tenant>/<name>.lease``:
gpu_worker/kvfs/lease.py); callers validate tenant and name before building a key, and the stores
re-check that a key cannot escape their root.

Both stores offer one conditional write (:meth:`KVStore.put_if`), which is all the lease needs
to give each named file one writer across workers: the directory store holds an ``flock`` on a
lock file next to the key while it compares and replaces, S3 uses ``If-Match`` /
``If-None-Match`` on ``PutObject``.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import re
import tempfile
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any

from gpu_worker.kvfs.errors import StoreFull

#: Matched with ``fullmatch`` (``$`` would let a trailing newline through).
_KEY = re.compile(r"[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*")


def check_key(key: str) -> str:
    if not _KEY.fullmatch(key) or any(part in ("", ".", "..") for part in key.split("/")):
        raise ValueError(f"invalid store key {key!r}")
    return key


class Conflict(Exception):
    """A conditional write lost: the object changed (or appeared) since it was read."""


class KVStore(ABC):
    """Flat key -> bytes store."""

    @abstractmethod
    def get_versioned(self, key: str) -> tuple[bytes, str]:
        """The bytes and a version token for :meth:`put_if`; ``KeyError`` when absent."""

    @abstractmethod
    def put_if(self, key: str, data: bytes, expect: str | None) -> str:
        """Write only if the key is still at version ``expect`` (``None``: only if absent);
        returns the new version token, raises :class:`Conflict` otherwise."""

    @abstractmethod
    def put(self, key: str, data: bytes) -> None: ...

    @abstractmethod
    def get(self, key: str) -> bytes:
        """Raises ``KeyError`` when the key is absent."""

    @abstractmethod
    def delete(self, key: str) -> None:
        """Idempotent."""

    @abstractmethod
    def list(self, prefix: str = "") -> list[str]: ...

    @abstractmethod
    def size(self, key: str) -> int:
        """Raises ``KeyError`` when the key is absent."""


class LocalKVStore(KVStore):
    """Files under ``root``; writes are atomic (temp file + fsync + rename)."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    def _path(self, key: str) -> Path:
        return self.root / check_key(key)

    def put(self, key: str, data: bytes) -> None:
        path = self._path(key)
        tmp = None
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException as exc:
            if tmp is not None:
                Path(tmp).unlink(missing_ok=True)
            if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise StoreFull(f"the KV store is full: {len(data)} bytes for {key} do not fit") from exc
            raise

    def get(self, key: str) -> bytes:
        try:
            return self._path(key).read_bytes()
        except FileNotFoundError:
            raise KeyError(key) from None

    def get_versioned(self, key: str) -> tuple[bytes, str]:
        data = self.get(key)
        return data, hashlib.sha256(data).hexdigest()

    def put_if(self, key: str, data: bytes, expect: str | None) -> str:
        """Compare and replace under an exclusive ``flock`` on ``.lock-<name>`` next to the key,
        which every process on this host (and NFS clients with working locks) respects."""
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path.parent / f".lock-{path.name}", "a+b") as lock:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
            try:
                current: str | None = self.get_versioned(key)[1]
            except KeyError:
                current = None
            if current != expect:
                raise Conflict(f"{key} changed since it was read")
            self.put(key, data)
        return hashlib.sha256(data).hexdigest()

    def delete(self, key: str) -> None:
        """Idempotent; also removes the key's ``put_if`` lock file, so deleting a tenant's keys
        leaves nothing of it behind (a writer racing the delete may re-create it)."""
        path = self._path(key)
        path.unlink(missing_ok=True)
        (path.parent / f".lock-{path.name}").unlink(missing_ok=True)

    def list(self, prefix: str = "") -> list[str]:
        keys = []
        for path in self.root.rglob("*"):
            if path.is_file() and not path.name.startswith("."):
                key = path.relative_to(self.root).as_posix()
                if key.startswith(prefix):
                    keys.append(key)
        return sorted(keys)

    def size(self, key: str) -> int:
        try:
            return self._path(key).stat().st_size
        except FileNotFoundError:
            raise KeyError(key) from None


class S3KVStore(KVStore):
    """Objects under ``s3://bucket/prefix``; ``client`` is a boto3 S3 client (PUT is atomic)."""

    def __init__(self, bucket: str, prefix: str, client: Any) -> None:
        self.bucket = bucket
        self.prefix = prefix.strip("/") + "/" if prefix.strip("/") else ""
        self.client = client

    def _key(self, key: str) -> str:
        return self.prefix + check_key(key)

    def _missing(self, exc: Exception) -> bool:
        code = getattr(exc, "response", {}).get("Error", {}).get("Code", "")
        return code in ("404", "NoSuchKey", "NotFound")

    def put(self, key: str, data: bytes) -> None:
        self.client.put_object(Bucket=self.bucket, Key=self._key(key), Body=data)

    def get(self, key: str) -> bytes:
        return self.get_versioned(key)[0]

    def get_versioned(self, key: str) -> tuple[bytes, str]:
        try:
            obj = self.client.get_object(Bucket=self.bucket, Key=self._key(key))
        except Exception as exc:
            if self._missing(exc):
                raise KeyError(key) from None
            raise
        return obj["Body"].read(), obj["ETag"]

    def put_if(self, key: str, data: bytes, expect: str | None) -> str:
        """S3 conditional writes: ``If-None-Match: *`` to create, ``If-Match: <etag>`` to replace."""
        condition = {"IfNoneMatch": "*"} if expect is None else {"IfMatch": expect}
        try:
            out = self.client.put_object(Bucket=self.bucket, Key=self._key(key), Body=data, **condition)
        except Exception as exc:
            code = getattr(exc, "response", {}).get("Error", {}).get("Code", "")
            if code in ("PreconditionFailed", "ConditionalRequestConflict", "412", "409") or self._missing(exc):
                raise Conflict(f"{key} changed since it was read") from exc
            raise
        return out["ETag"]

    def delete(self, key: str) -> None:
        self.client.delete_object(Bucket=self.bucket, Key=self._key(key))

    def list(self, prefix: str = "") -> list[str]:
        keys = []
        paginator = self.client.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=self.bucket, Prefix=self.prefix + prefix):
            for obj in page.get("Contents", []):
                keys.append(obj["Key"][len(self.prefix) :])
        return sorted(keys)

    def size(self, key: str) -> int:
        try:
            head = self.client.head_object(Bucket=self.bucket, Key=self._key(key))
        except Exception as exc:
            if self._missing(exc):
                raise KeyError(key) from None
            raise
        return int(head["ContentLength"])


def store_from_location(location: str) -> KVStore:
    """``s3://bucket/prefix`` -> :class:`S3KVStore` (boto3 with the standard credential chain;
    ``SYMPHONY_KV_S3_ENDPOINT_URL`` for S3-compatible stores); anything else is a directory."""
    if not location.startswith("s3://"):
        return LocalKVStore(location)
    import os

    import boto3

    bucket, _, prefix = location.removeprefix("s3://").partition("/")
    if not bucket:
        raise ValueError(f"KV store location {location!r} names no bucket")
    endpoint = os.environ.get("SYMPHONY_KV_S3_ENDPOINT_URL") or None
    return S3KVStore(bucket, prefix, boto3.client("s3", endpoint_url=endpoint))
