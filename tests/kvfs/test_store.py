"""KV stores: the local directory store and the S3 store, the same checks against a directory and
against a real S3 server over HTTP (tests/plugins/s3.py).

moto is never imported in this process: its in-process mode pulls in Flask, whose
``current_app`` proxy raises when vLLM (loaded later in the same test process) inspects every
loaded module."""

from __future__ import annotations

import pytest

from gpu_worker.kvfs import KVFS, KVStore, LocalKVStore, Owner, S3KVStore
from gpu_worker.kvfs.store import Conflict
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


def test_each_store_reads_writes_and_lists(kv_store):
    _exercise(kv_store)


def test_each_store_writes_conditionally(kv_store):
    """``put_if``: create only if absent, replace only the version read; a lost race is a
    Conflict and leaves the winner's bytes."""
    first = kv_store.put_if("acme/doc.lease", b"one", None)
    with pytest.raises(Conflict):
        kv_store.put_if("acme/doc.lease", b"again", None)  # exists already
    data, token = kv_store.get_versioned("acme/doc.lease")
    assert (data, token) == (b"one", first)
    second = kv_store.put_if("acme/doc.lease", b"two", token)
    with pytest.raises(Conflict):
        kv_store.put_if("acme/doc.lease", b"stale", token)  # the version it read is gone
    assert kv_store.get_versioned("acme/doc.lease") == (b"two", second)
    kv_store.delete("acme/doc.lease")
    if isinstance(kv_store, LocalKVStore):  # its flock file goes with the key
        assert not [p.name for p in kv_store.root.rglob(".lock-*")]
    with pytest.raises(Conflict):
        kv_store.put_if("acme/doc.lease", b"late", second)  # deleted meanwhile
    with pytest.raises(KeyError):
        kv_store.get_versioned("acme/doc.lease")


def test_kvfs_files_move_between_workers_through_each_store(kv_store):
    """Spilled on one worker, found and reloaded byte-identical by another with its own view
    of the store (a fresh client, as another host would have)."""
    from gpu_worker.kvfs import store_from_location

    io = MemPageIO(16)
    fs = KVFS(16, BLOCK, int(io.pages[0].nbytes), io, kv_store, host_pages=0)
    owner = Owner("acme", "s1")
    h = fs.create(owner, "doc")
    append(fs, io, owner, h, [3, 1, 4, 1, 5])
    fs.close(owner, h)
    fs.evict("acme", "doc")
    other_io = MemPageIO(16)
    other = KVFS(16, BLOCK, fs.page_bytes, other_io, store_from_location(kv_store.location))
    r = other.open(owner, "doc")  # not in its (empty) catalogue: found in the store
    assert other_io.kv_of(other, owner, r) == expected_kv([3, 1, 4, 1, 5])


@pytest.fixture
def s3_client(s3_bucket):
    """A boto3 client of the real S3 server, with an empty bucket named ``kvstore``'s stand-in."""
    return s3_bucket


def test_s3_store(s3_client):
    client, bucket = s3_client
    _exercise(S3KVStore(bucket, "symphony/kv", client))
    keys = [o["Key"] for o in client.list_objects_v2(Bucket=bucket)["Contents"]]
    assert keys == ["symphony/kv/bravo/b.safetensors"]


def test_kvfs_spills_to_s3_and_reloads(s3_client):
    client, bucket = s3_client
    io = MemPageIO(16)
    fs = KVFS(16, BLOCK, int(io.pages[0].nbytes), io, S3KVStore(bucket, "p", client), host_pages=0)
    owner = Owner("acme", "s1")
    h = fs.create(owner, "doc")
    append(fs, io, owner, h, [3, 1, 4, 1, 5])
    fs.close(owner, h)
    fs.evict("acme", "doc")
    assert [r.residency for r in fs.list_files()] == ["disk"]
    fs2_io = MemPageIO(16)
    fs2 = KVFS(16, BLOCK, fs.page_bytes, fs2_io, S3KVStore(bucket, "p", client))
    assert fs2.load_index() == 1
    r = fs2.open(owner, "doc")
    assert fs2_io.kv_of(fs2, owner, r) == expected_kv([3, 1, 4, 1, 5])


def test_store_location_picks_directory_or_s3(s3_client, tmp_path):
    from gpu_worker.kvfs import store_from_location

    client, bucket = s3_client
    assert isinstance(store_from_location(str(tmp_path / "kv")), LocalKVStore)
    s3 = store_from_location(f"s3://{bucket}/deploy/kv")  # endpoint from SYMPHONY_KV_S3_ENDPOINT_URL
    assert isinstance(s3, S3KVStore) and (s3.bucket, s3.prefix) == (bucket, "deploy/kv/")
    s3.put("acme/doc.safetensors", b"kv")
    assert client.get_object(Bucket=bucket, Key="deploy/kv/acme/doc.safetensors")["Body"].read() == b"kv"
    with pytest.raises(ValueError, match="no bucket"):
        store_from_location("s3:///x")
