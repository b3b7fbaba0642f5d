"""``kv_create(name, durable=False)``: KV a program can recompute (a /v1/responses conversation's)
is not written through to the store at every close, only once it has been idle ``lazy_write_s``
(``KVFS.write_idle``, the worker's tick), when it goes to the disk tier, when evicted, or at the
shutdown flush. Until written, this worker keeps its lease, so no other worker writes over it."""

from __future__ import annotations

import time

import pytest

from gpu_worker.kvfs import Exists, NotFound, Owner
from gpu_worker.kvfs.files import STORE_SUFFIX
from gpu_worker.kvfs.tiers import decode_header
from tests.kvfs.memio import BLOCK, append, make_fs, stored_blobs
from tests.kvfs.test_coherence import _worker

A = Owner("acme", "run-a")
B = Owner("acme", "run-b")
KEY = f"acme/chat{STORE_SUFFIX}"


def _turn(fs, io, owner, tokens, *, create=False):
    h = fs.create(owner, "chat", durable=False) if create else fs.open(owner, "chat", "w")
    append(fs, io, owner, h, tokens)
    fs.close(owner, h)


def test_a_lazy_files_close_writes_nothing_until_it_has_been_idle(tmp_path):
    fs, io = make_fs(tmp_path)
    fs.lazy_write_s = 60
    _turn(fs, io, A, [1, 2, 3], create=True)
    _turn(fs, io, A, [4, 5])
    assert stored_blobs(fs.store) == []
    # The next turn finds the KV where the last one left it, on this worker.
    h = fs.open(A, "chat", "r")
    assert fs.tokens(A, h) == [1, 2, 3, 4, 5]
    fs.close(A, h)
    assert fs.write_idle(now=time.time() + 30) == 0  # not idle long enough
    assert fs.write_idle(now=time.time() + 61) == 1
    assert stored_blobs(fs.store) == [KEY]
    meta = decode_header(fs.store.get(KEY))
    assert meta["tokens"] == "[1, 2, 3, 4, 5]" and meta["durable"] == "0"
    assert fs.write_idle(now=time.time() + 600) == 0  # clean now: nothing to write again


def test_a_durable_files_close_still_writes_it_through(tmp_path):
    fs, io = make_fs(tmp_path)
    h = fs.create(A, "chat")
    append(fs, io, A, h, [1, 2, 3])
    fs.close(A, h)
    assert stored_blobs(fs.store) == [KEY]
    assert decode_header(fs.store.get(KEY))["durable"] == "1"


def test_an_open_lazy_file_is_not_written_by_the_tick(tmp_path):
    fs, io = make_fs(tmp_path)
    fs.lazy_write_s = 0
    h = fs.create(A, "chat", durable=False)
    append(fs, io, A, h, [1, 2, 3])
    assert fs.write_idle() == 0
    fs.close(A, h)
    assert fs.write_idle() == 1


def test_the_tick_writes_a_bounded_number_longest_idle_first(tmp_path):
    fs, io = make_fs(tmp_path)
    fs.lazy_write_s = 0
    for name in ("a", "b", "c"):
        h = fs.create(A, name, durable=False)
        append(fs, io, A, h, [1, 2])
        fs.close(A, h)
        time.sleep(0.01)
    assert fs.write_idle(limit=2) == 2
    assert stored_blobs(fs.store) == [f"acme/a{STORE_SUFFIX}", f"acme/b{STORE_SUFFIX}"]
    assert fs.write_idle(limit=2) == 1


def test_a_lazy_file_is_written_when_it_leaves_memory_for_the_store(tmp_path):
    fs, io = make_fs(tmp_path)
    _turn(fs, io, A, list(range(1, 2 * BLOCK + 1)), create=True)
    fs.evict("acme", "chat")
    assert stored_blobs(fs.store) == [KEY]
    h = fs.open(A, "chat", "r")
    assert fs.tokens(A, h) == list(range(1, 2 * BLOCK + 1))


def test_the_shutdown_flush_writes_lazy_files(tmp_path):
    fs, io = make_fs(tmp_path)
    _turn(fs, io, A, [7, 8, 9], create=True)
    fs.flush()
    assert decode_header(fs.store.get(KEY))["tokens"] == "[7, 8, 9]"


def test_durability_is_kept_in_the_store_across_a_restart(tmp_path):
    fs, io = make_fs(tmp_path)
    _turn(fs, io, A, [1, 2], create=True)
    fs.flush()
    again, io2 = make_fs(tmp_path)
    again.lazy_write_s = 60
    assert again.load_index() == 1
    _turn(again, io2, A, [3])  # still lazy after the restart: nothing written at close
    assert decode_header(again.store.get(KEY))["tokens"] == "[1, 2]"


def test_another_worker_cannot_write_an_unwritten_lazy_file_until_it_is_written(kv_store):
    a, io_a = _worker(kv_store, "wa")
    b, _ = _worker(kv_store, "wb")
    a.lazy_write_s = 60
    _turn(a, io_a, A, [1, 2, 3], create=True)
    # Not flushed yet, so not visible elsewhere (readers see the latest flushed generation),
    # and its lease stays with worker a: b can neither find it nor create it over it.
    with pytest.raises(NotFound):
        b.open(B, "chat", "w")
    with pytest.raises(Exists):
        b.create(B, "chat", durable=False)
    a.write_idle(now=time.time() + 61)  # written and the lease given back
    h = b.open(B, "chat", "w")
    assert b.tokens(B, h) == [1, 2, 3]
    b.close(B, h)
