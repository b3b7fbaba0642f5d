"""Byte stores for spilled KV files: a local directory (default) or an S3 bucket.

Keys are ``<tenant>/<name>.safetensors``; callers validate tenant and name before building a
key, and the stores re-check that a key cannot escape their root.
"""

from __future__ import annotations

import errno
import os
import re
import tempfile
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any

from gpu_worker.kvfs.errors import StoreFull

_KEY = re.compile(r"^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*$")


def check_key(key: str) -> str:
    if not _KEY.match(key) or any(part in ("", ".", "..") for part in key.split("/")):
        raise ValueError(f"invalid store key {key!r}")
    return key


class KVStore(ABC):
    """Flat key -> bytes store."""

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

    def delete(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)

    def list(self, prefix: str = "") -> list[str]:
        keys = []
        for path in self.root.rglob("*"):
            if path.is_file() and not path.name.startswith(".tmp-"):
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
        try:
            obj = self.client.get_object(Bucket=self.bucket, Key=self._key(key))
        except Exception as exc:
            if self._missing(exc):
                raise KeyError(key) from None
            raise
        return obj["Body"].read()

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
