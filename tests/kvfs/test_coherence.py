"""Named KV files shared by two workers through one store (a directory, and S3 over HTTP): one
writer at a time by a store-side lease, readers at the latest flushed generation, no stale copy
ever served or flushed over a newer one (gpu_worker/kvfs/lease.py). Each worker is a KVFS with
its own pages, its own view of the store and its own worker id."""

from __future__ import annotations

import pytest

from gpu_worker.kvfs import KVFS, Busy, Exists, NotFound, Owner, store_from_location
from gpu_worker.kvfs.lease import StoreUnavailable, lease_key
from tests.kvfs.memio import BLOCK, MemPageIO, append, expected_kv

A = Owner("acme", "run-on-a")
B = Owner("acme", "run-on-b")


def _worker(kv_store, worker_id: str, lease_ttl_s: float = 30.0, host_pages: int = 8) -> tuple[KVFS, MemPageIO]:
    io = MemPageIO(32)
    store = store_from_location(kv_store.location)
    page_bytes = int(io.pages[0].nbytes)
    fs = KVFS(32, BLOCK, page_bytes, io, store, host_pages, worker_id=worker_id, lease_ttl_s=lease_ttl_s)
    return fs, io


def _write(fs: KVFS, io: MemPageIO, owner: Owner, name: str, tokens: list[int], *, create: bool = False) -> None:
    h = fs.create(owner, name) if create else fs.open(owner, name, "w")
    if not create:
        fs.truncate(owner, h, 0)
    append(fs, io, owner, h, tokens)
    fs.close(owner, h)


def _read(fs: KVFS, io: MemPageIO, owner: Owner, name: str) -> tuple[list[int], list[float]]:
    h = fs.open(owner, name, "r")
    try:
        return fs.tokens(owner, h), io.kv_of(fs, owner, h)
    finally:
        fs.close(owner, h)


@pytest.fixture
def two(kv_store):
    a, io_a = _worker(kv_store, "wa")
    b, io_b = _worker(kv_store, "wb")
    return a, io_a, b, io_b


def test_a_file_written_after_start_is_found_in_the_store(two):
    a, io_a, b, io_b = two
    assert b.load_index() == 0  # started before the file existed
    _write(a, io_a, A, "ctx", [5, 6, 7, 8, 9], create=True)
    assert _read(b, io_b, B, "ctx") == ([5, 6, 7, 8, 9], expected_kv([5, 6, 7, 8, 9]))


def test_a_reader_gets_the_latest_flushed_generation_not_its_cached_copy(two):
    a, io_a, b, io_b = two
    _write(a, io_a, A, "ctx", [1, 2, 3], create=True)
    assert _read(b, io_b, B, "ctx")[0] == [1, 2, 3]  # B now caches generation 1 on its device
    _write(a, io_a, A, "ctx", [7, 7, 7, 7, 7, 7])  # generation 2 on A
    assert _read(b, io_b, B, "ctx") == ([7, 7, 7, 7, 7, 7], expected_kv([7, 7, 7, 7, 7, 7]))
    b.check()


def test_one_writer_at_a_time_and_readers_see_only_flushed_data(two):
    a, io_a, b, io_b = two
    _write(a, io_a, A, "ctx", [1, 2, 3], create=True)
    h = a.open(A, "ctx", "w")
    append(a, io_a, A, h, [4])  # not flushed yet
    with pytest.raises(Busy, match="open for writing on worker 'wa'"):
        b.open(B, "ctx", "w")
    assert _read(b, io_b, B, "ctx")[0] == [1, 2, 3]  # the last flushed generation
    assert [(f.generation, f.leased) for f in a.list_files()] == [(1, True)]  # what kv_list reports
    a.close(A, h)  # flushed: generation 2, lease given back
    assert [(f.generation, f.leased) for f in a.list_files()] == [(2, False)]
    assert _read(b, io_b, B, "ctx")[0] == [1, 2, 3, 4]
    _write(b, io_b, B, "ctx", [9, 9])  # now B may write
    assert _read(a, io_a, A, "ctx")[0] == [9, 9]


def test_concurrent_writers_on_each_worker_never_lose_a_write(two):
    """Each worker appends its own marker under the lease, one after the other, many times:
    every append is in the final file, none shadowed by the other worker's stale copy."""
    a, io_a, b, io_b = two
    _write(a, io_a, A, "log", [0], create=True)
    expected = [0]
    for i in range(1, 9):
        fs, io, owner = (a, io_a, A) if i % 2 else (b, io_b, B)
        h = fs.open(owner, "log", "w")
        append(fs, io, owner, h, [i])
        fs.close(owner, h)
        expected.append(i)
    assert _read(a, io_a, A, "log")[0] == expected
    assert _read(b, io_b, B, "log") == (expected, expected_kv(expected))


def test_a_stale_copy_is_never_flushed_over_a_newer_generation(kv_store):
    a, io_a = _worker(kv_store, "wa")
    b, io_b = _worker(kv_store, "wb", host_pages=0)  # its spills go straight to the store
    _write(a, io_a, A, "ctx", [1, 2, 3], create=True)
    _read(b, io_b, B, "ctx")  # B caches generation 1 on its device
    _write(a, io_a, A, "ctx", [4, 5])  # generation 2
    b._spill(b._named[("acme", "ctx")])  # memory pressure on B: must not write B's stale copy back
    b.flush()  # nor may graceful shutdown
    fresh, io_f = _worker(kv_store, "wc")  # no cache: reads what the store holds
    assert _read(fresh, io_f, A, "ctx") == ([4, 5], expected_kv([4, 5]))
    assert _read(b, io_b, B, "ctx")[0] == [4, 5]


def test_creating_a_name_another_worker_holds_fails(two):
    a, io_a, b, _io_b = two
    h = a.create(A, "ctx")  # not flushed yet: only the lease says it exists
    with pytest.raises(Exists):
        b.create(B, "ctx")
    append(a, io_a, A, h, [1])
    a.close(A, h)
    with pytest.raises(Exists):
        b.create(B, "ctx")


def test_a_file_deleted_on_one_worker_is_gone_on_the_other(two):
    a, io_a, b, io_b = two
    _write(a, io_a, A, "ctx", [1, 2, 3], create=True)
    _read(b, io_b, B, "ctx")
    a.remove("acme", "ctx")
    with pytest.raises(NotFound):
        b.open(B, "ctx", "r")
    assert [f.name for f in b.list_files()] == []
    b.check()


def test_a_file_deleted_while_open_for_writing_elsewhere_is_not_resurrected(two):
    a, io_a, b, io_b = two
    _write(a, io_a, A, "ctx", [1, 2, 3], create=True)
    h = b.open(B, "ctx", "w")
    append(b, io_b, B, h, [4])
    a.remove("acme", "ctx")  # deletion wins
    b.close(B, h)  # the write-through finds its lease gone: nothing is written back
    with pytest.raises(NotFound):
        a.open(A, "ctx", "r")
    assert not [k for k in a.store.list("acme/") if k.endswith(".safetensors")]
    b.check()


def test_a_lease_held_by_a_dead_worker_expires(kv_store):
    dead, io_d = _worker(kv_store, "dead", lease_ttl_s=0.3)
    alive, _io = _worker(kv_store, "alive")
    _write(dead, io_d, A, "ctx", [1, 2], create=True)
    h = dead.open(A, "ctx", "w")  # then the worker is SIGKILLed: the lease is never released
    append(dead, io_d, A, h, [3])  # unflushed: lost with the worker
    with pytest.raises(Busy, match="'dead'"):
        alive.open(B, "ctx", "w")
    import time

    time.sleep(0.4)
    h2 = alive.open(B, "ctx", "w")  # the dead worker's lease has expired
    assert alive.tokens(B, h2) == [1, 2]
    alive.close(B, h2)


def test_a_store_that_cannot_be_read_is_a_clear_error_not_a_stale_copy(two):
    a, io_a, b, io_b = two
    _write(a, io_a, A, "ctx", [1, 2, 3], create=True)
    _read(b, io_b, B, "ctx")

    def down(*_args, **_kwargs):
        raise ConnectionError("store unreachable")

    b.store.get_versioned = down  # type: ignore[method-assign]
    with pytest.raises(StoreUnavailable, match="unreachable") as outage:
        b.open(B, "ctx", "r")
    # A LIP reads the outage as its I/O failing (EIO: symphony.IOFailed, an OSError it may
    # retry), not as a worker bug (EINTERNAL).
    from gpu_worker.ops.errors import wire_error
    from gpu_worker.protocol import ErrorCode

    error = wire_error(outage.value, "kv_open", "s1")
    assert error.code == ErrorCode.IO and "unreachable" in error.message


def test_the_lease_sits_next_to_the_blob(two):
    a, io_a, _b, _io_b = two
    _write(a, io_a, A, "ctx", [1], create=True)
    keys = a.store.list("acme/")
    assert keys == sorted(["acme/ctx.safetensors", lease_key("acme", "ctx")])


def test_writers_racing_on_two_workers_each_get_every_append_in(two):
    """Two threads, one per worker, each appending its own markers as fast as it can take the
    lease (EBUSY: try again): every append of both is in the final file, in some order."""
    import threading

    a, io_a, b, io_b = two
    _write(a, io_a, A, "log", [0], create=True)
    errors: list[BaseException] = []

    def writer(fs: KVFS, io: MemPageIO, owner: Owner, markers: list[int]) -> None:
        try:
            for marker in markers:
                while True:
                    try:
                        h = fs.open(owner, "log", "w")
                        break
                    except Busy:
                        continue
                append(fs, io, owner, h, [marker])
                fs.close(owner, h)
        except BaseException as exc:  # reported by the test thread
            errors.append(exc)

    threads = [
        threading.Thread(target=writer, args=(a, io_a, A, [100 + i for i in range(6)])),
        threading.Thread(target=writer, args=(b, io_b, B, [200 + i for i in range(6)])),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    tokens, kv = _read(a, io_a, A, "log")
    assert sorted(tokens) == [0, *range(100, 106), *range(200, 206)]
    assert kv == expected_kv(tokens)
    assert _read(b, io_b, B, "log")[0] == tokens
