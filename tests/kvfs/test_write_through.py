"""The write-through of a closed named file runs without the KVFS lock (the engine thread takes
that lock to plan every forward, and a store write with its ``fsync`` takes ~100 ms), yet stays
as safe as a write under the lock: the lease is given back only once the blob is in, a write
that lands late never replaces a newer generation, and an unlinked file's write never brings its
blob back."""

from __future__ import annotations

import threading

import pytest

from gpu_worker.kvfs import Busy, Owner
from gpu_worker.kvfs.files import STORE_SUFFIX
from gpu_worker.kvfs.tiers import decode_header
from tests.kvfs.memio import append, make_fs, stored_blobs
from tests.kvfs.test_coherence import _worker

A = Owner("acme", "run-a")
B = Owner("acme", "run-b")
WAIT_S = 10


class HeldPuts:
    """Wraps a store's ``put`` so blob writes (not leases) wait until :meth:`release`."""

    def __init__(self, store) -> None:
        self.store, self.put = store, store.put
        self.entered, self.go = threading.Event(), threading.Event()
        store.put = self._put

    def _put(self, key: str, data: bytes) -> None:
        if key.endswith(STORE_SUFFIX):
            self.entered.set()
            assert self.go.wait(WAIT_S), "the test never released the write"
        self.put(key, data)

    def release(self) -> None:
        self.go.set()


def _close_in_thread(fs, owner, h) -> threading.Thread:
    thread = threading.Thread(target=fs.close, args=(owner, h), daemon=True)
    thread.start()
    return thread


def test_the_store_write_of_a_closed_file_does_not_hold_the_kvfs_lock(tmp_path):
    fs, io = make_fs(tmp_path)
    h = fs.create(A, "conversation")
    append(fs, io, A, h, list(range(1, 11)))
    held = HeldPuts(fs.store)
    closing = _close_in_thread(fs, A, h)
    assert held.entered.wait(WAIT_S)
    # While the blob is being written, every other KVFS call goes on (here: a session's whole
    # life: create, append, read, close); before, all of it waited for the write.
    other = fs.create(B)
    append(fs, io, B, other, [4, 5, 6])
    assert fs.tokens(B, other) == [4, 5, 6]
    fs.close(B, other)
    assert stored_blobs(fs.store) == []  # not in yet
    held.release()
    closing.join(WAIT_S)
    assert not closing.is_alive()
    assert stored_blobs(fs.store) == [f"acme/conversation{STORE_SUFFIX}"]


def test_the_lease_is_given_back_only_once_the_blob_is_in(kv_store):
    a, io_a = _worker(kv_store, "wa")
    b, _ = _worker(kv_store, "wb")
    h = a.create(A, "ctx")
    append(a, io_a, A, h, [1, 2, 3])
    a.close(A, h)  # generation 1 is in the store
    h = a.open(A, "ctx", "w")
    append(a, io_a, A, h, [4, 5])
    held = HeldPuts(a.store)
    closing = _close_in_thread(a, A, h)
    assert held.entered.wait(WAIT_S)
    with pytest.raises(Busy):  # another worker may not write it before generation 2 is in
        b.open(B, "ctx", "w")
    held.release()
    closing.join(WAIT_S)
    hb = b.open(B, "ctx", "w")  # the write is in and the lease free: the other worker may write
    assert b.tokens(B, hb) == [1, 2, 3, 4, 5]
    b.close(B, hb)


def test_a_write_that_lands_late_never_replaces_a_newer_generation(tmp_path):
    fs, io = make_fs(tmp_path)
    h = fs.create(A, "ctx")
    append(fs, io, A, h, [1, 2, 3])
    with fs._lock:  # the first close's snapshot, written later (a slow store, a descheduled thread)
        flush = fs._close(A, h)
    h = fs.open(A, "ctx", "w")
    append(fs, io, A, h, [4, 5])
    fs.close(A, h)  # the newer generation, written at once
    fs._write_through([flush])  # the older write arrives last: skipped
    meta = decode_header(fs.store.get(f"acme/ctx{STORE_SUFFIX}"))
    assert meta["tokens"] == "[1, 2, 3, 4, 5]" and int(meta["generation"]) == flush.generation + 1
    h = fs.open(A, "ctx", "r")
    assert fs.tokens(A, h) == [1, 2, 3, 4, 5]


def test_a_file_removed_while_its_write_is_in_flight_stays_removed(tmp_path):
    fs, io = make_fs(tmp_path)
    h = fs.create(A, "ctx")
    append(fs, io, A, h, [1, 2, 3])
    with fs._lock:
        flush = fs._close(A, h)
    fs.remove("acme", "ctx")
    fs._write_through([flush])
    assert stored_blobs(fs.store) == []
