"""KV stores: the local directory store and the S3 store (against moto's in-process S3)."""

from __future__ import annotations

import boto3
import pytest
from moto import mock_aws

from gpu_worker.kvfs import KVFS, KVStore, LocalKVStore, Owner, S3KVStore
from tests.kvfs.memio import BLOCK, MemPageIO, append, expected_kv


def _exercise(store: KVStore) -> None:
    store.put("acme/a.safetensors", b"one")
    store.put("acme/a.safetensors", b"two!")  # overwrite
    store.put("bravo/b.safetensors", b"x" * 10)
    assert store.get("acme/a.safetensors") == b"two!"
    assert store.size("bravo/b.safetensors") == 10
    assert store.list() == ["acme/a.safetensors", "bravo/b.safetensors"]
    assert store.list("acme/") == ["acme/a.safetensors"]
    store.delete("acme/a.safetensors")
    store.delete("acme/a.safetensors")  # idempotent
    with pytest.raises(KeyError):
        store.get("acme/a.safetensors")
    with pytest.raises(KeyError):
        store.size("acme/a.safetensors")
    for bad in ("../x", "a/../../x", "/abs", "a//b", ""):
        with pytest.raises(ValueError):
            store.put(bad, b"")


def test_local_store(tmp_path):
    store = LocalKVStore(tmp_path / "s")
    _exercise(store)
    assert not list((tmp_path / "s").rglob(".tmp-*"))  # atomic writes leave no temp files


@pytest.fixture
def s3_client(monkeypatch):
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(var, "testing")
    with mock_aws():
        client = boto3.client("s3", region_name="us-east-1")
        client.create_bucket(Bucket="kvstore")
        yield client


def test_s3_store(s3_client):
    _exercise(S3KVStore("kvstore", "symphony/kv", s3_client))
    keys = [o["Key"] for o in s3_client.list_objects_v2(Bucket="kvstore")["Contents"]]
    assert keys == ["symphony/kv/bravo/b.safetensors"]


def test_kvfs_spills_to_s3_and_reloads(s3_client):
    io = MemPageIO(16)
    fs = KVFS(16, BLOCK, int(io.pages[0].nbytes), io, S3KVStore("kvstore", "p", s3_client), host_pages=0)
    owner = Owner("acme", "s1")
    h = fs.create(owner, "doc")
    append(fs, io, owner, h, [3, 1, 4, 1, 5])
    fs.close(owner, h)
    fs.evict("acme", "doc")
    assert [r.residency for r in fs.list_files()] == ["disk"]
    fs2_io = MemPageIO(16)
    fs2 = KVFS(16, BLOCK, fs.page_bytes, fs2_io, S3KVStore("kvstore", "p", s3_client))
    assert fs2.load_index() == 1
    r = fs2.open(owner, "doc")
    assert fs2_io.kv_of(fs2, owner, r) == expected_kv([3, 1, 4, 1, 5])


def test_store_location_picks_directory_or_s3(s3_client, tmp_path, monkeypatch):
    from gpu_worker.kvfs import store_from_location

    assert isinstance(store_from_location(str(tmp_path / "kv")), LocalKVStore)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    s3 = store_from_location("s3://kvstore/deploy/kv")
    assert isinstance(s3, S3KVStore) and (s3.bucket, s3.prefix) == ("kvstore", "deploy/kv/")
    s3.put("acme/doc.safetensors", b"kv")
    assert s3_client.get_object(Bucket="kvstore", Key="deploy/kv/acme/doc.safetensors")["Body"].read() == b"kv"
    with pytest.raises(ValueError, match="no bucket"):
        store_from_location("s3:///x")
