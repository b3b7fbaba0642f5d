"""Spilling to host and disk, reload, LRU eviction, pinning, budgets, swap, flush and index rebuild."""

from __future__ import annotations

import pytest
import torch

from gpu_worker.kvfs import KVFS, KVFSLimits, LocalKVStore, NoSpace, Owner, TenantQuota
from gpu_worker.kvfs.tiers import decode_data
from tests.kvfs.memio import BLOCK, PAGE_SHAPE, MemPageIO, append, expected_kv, make_fs, stored_blobs

A = Owner("acme", "s1")
B = Owner("bravo", "s1")


def _named(fs: KVFS, io: MemPageIO, owner: Owner, name: str, tokens: list[int]) -> None:
    h = fs.create(owner, name)
    append(fs, io, owner, h, tokens)
    fs.close(owner, h)


def _residency(fs: KVFS) -> dict[str, str]:
    return {f"{r.tenant}/{r.name}": r.residency for r in fs.list_files()}


def test_spill_to_host_then_disk_and_reload_is_byte_identical(tmp_path):
    fs, io = make_fs(tmp_path, host_pages=2)
    toks = list(range(1, 7))  # 2 pages
    _named(fs, io, A, "doc", toks)
    file_pages = list(fs._named[("acme", "doc")].pages)
    original = io.read_pages(file_pages)
    fs._spill(fs._named[("acme", "doc")])
    assert _residency(fs) == {"acme/doc": "host"} and fs.stats().used_pages == 0
    io.pages[file_pages] = -1.0  # the device pages are reused by someone else
    h = fs.open(A, "doc", "w")
    assert _residency(fs) == {"acme/doc": "device"}
    assert torch.equal(io.read_pages(fs._named[("acme", "doc")].pages), original)
    fs.close(A, h)
    fs.evict("acme", "doc")
    assert _residency(fs) == {"acme/doc": "disk"} and fs.stats().disk_pages == 2
    blob = (tmp_path / "kvstore" / "acme" / "doc.safetensors").read_bytes()
    assert torch.equal(decode_data(blob), original)
    r = fs.open(A, "doc")
    assert io.kv_of(fs, A, r) == expected_kv(toks)
    append(fs, io, A, r, [9])  # a reloaded file keeps working
    assert io.kv_of(fs, A, r) == expected_kv([*toks, 9])
    fs.close(A, r)
    fs.check()


def test_an_open_reports_what_it_brought_back_from_the_host_and_the_store(tmp_path):
    """For the run's trace: an open that reloads says from which tier and how many bytes; an
    open of a device-resident file moves nothing."""
    fs, io = make_fs(tmp_path, host_pages=2)
    _named(fs, io, A, "doc", list(range(1, 7)))  # 2 pages
    moves: list = []
    fs.close(A, fs.open(A, "doc", "r", moves))
    assert moves == []
    fs._spill(fs._named[("acme", "doc")])
    fs.close(A, fs.open(A, "doc", "r", moves))
    page_bytes = io.read_pages([1]).numel() * io.read_pages([1]).element_size()
    (host,) = moves
    assert (host.src, host.dst, host.nbytes) == ("host", "device", 2 * page_bytes) and host.end >= host.start
    fs.evict("acme", "doc")
    moves.clear()
    fs.close(A, fs.open(A, "doc", "w", moves))
    blob = (tmp_path / "kvstore" / "acme" / "doc.safetensors").read_bytes()
    assert [(m.src, m.dst, m.nbytes) for m in moves] == [("store", "device", len(blob))]
    fs.check()


def test_lru_eviction_under_pressure_skips_pinned_and_open_files(tmp_path):
    fs, io = make_fs(tmp_path, num_pages=7, host_pages=1)  # 6 usable pages
    _named(fs, io, A, "old", [1, 2, 3, 4])  # 1 page each
    _named(fs, io, B, "pinned", [5, 6, 7, 8])
    fs.pin("bravo", "pinned", True)
    _named(fs, io, A, "mid", [9, 10, 11, 12])
    _named(fs, io, B, "new", [13, 14, 15, 16])
    hold = fs.open(A, "mid", "w")  # open: never evicted
    fs.close(A, hold)
    fs._named[("acme", "mid")].use_seq = 0  # least recently used, but kept open below
    hold = fs.open(A, "mid", "w")
    h = fs.create(A)
    append(fs, io, A, h, list(range(100, 100 + 3 * BLOCK)))  # needs 3 pages, 2 free
    res = _residency(fs)
    assert res["acme/old"] == "host"  # least recently used idle file went first (to host)
    assert res["bravo/pinned"] == "device" and res["acme/mid"] == "device" and res["bravo/new"] == "device"
    append(fs, io, A, h, list(range(BLOCK)))  # one more page: host is full -> old moves to disk
    res = _residency(fs)
    assert res["acme/old"] == "disk" and res["bravo/new"] == "host" and res["bravo/pinned"] == "device"
    with pytest.raises(NoSpace):
        append(fs, io, A, h, list(range(2 * BLOCK)))  # only pinned/open files remain on device
    fs.close(A, hold)
    fs.close(A, h)
    r = fs.open(A, "old")
    assert io.kv_of(fs, A, r) == expected_kv([1, 2, 3, 4])
    fs.close(A, r)
    fs.check()


def test_tenant_device_budget_never_touches_other_tenants_pinned_files(tmp_path):
    fs, io = make_fs(tmp_path, num_pages=16, device_pages_per_tenant=3)
    _named(fs, io, B, "keep", list(range(12)))  # 3 pages of bravo
    fs.pin("bravo", "keep", True)
    _named(fs, io, A, "mine", [1, 2, 3, 4])  # 1 page of acme, unpinned
    h = fs.create(A)
    append(fs, io, A, h, list(range(8)))  # acme: 1 + 2 = 3 pages, at budget
    append(fs, io, A, h, [1])  # 4th page: acme's own idle unpinned file is spilled first
    assert _residency(fs) == {"acme/mine": "host", "bravo/keep": "device"}
    with pytest.raises(NoSpace) as exc:
        append(fs, io, A, h, list(range(BLOCK)))
    assert "device KV page budget of tenant exceeded" in exc.value.message
    assert _residency(fs)["bravo/keep"] == "device"
    assert fs.stats().pages_per_tenant == {"acme": 3, "bravo": 3}
    fs.close(A, h)
    fs.check()


def test_stored_bytes_budget(tmp_path):
    fs, io = make_fs(tmp_path)
    page_bytes = fs.page_bytes
    fs.limits = KVFSLimits(stored_bytes_per_tenant=2 * page_bytes)
    h = fs.create(A, "big")
    append(fs, io, A, h, list(range(2 * BLOCK)))
    with pytest.raises(NoSpace) as exc:
        fs.plan_append(A, h, [1])
    assert "stored KV budget" in exc.value.message
    anon = fs.create(A)  # anonymous files are not stored and not charged
    append(fs, io, A, anon, list(range(3 * BLOCK)))
    assert [r.bytes for r in fs.list_files("acme")] == [2 * page_bytes]
    fs.close_session(A)
    fs.check()


def test_plan_stored_bytes_budget_is_per_tenant_and_overrides_the_default(tmp_path):
    fs, io = make_fs(tmp_path)
    page_bytes = fs.page_bytes
    fs.limits = KVFSLimits(stored_bytes_per_tenant=page_bytes)
    fs.set_tenant_quota("acme", TenantQuota(stored_bytes=3 * page_bytes))  # acme's plan allows more
    h = fs.create(A, "doc")
    append(fs, io, A, h, list(range(3 * BLOCK)))
    with pytest.raises(NoSpace):
        fs.plan_append(A, h, [1])
    b = fs.create(B, "doc")
    with pytest.raises(NoSpace):  # bravo keeps the worker default of one page
        append(fs, io, B, b, list(range(2 * BLOCK)))
    fs.set_tenant_quota("acme", None)
    with pytest.raises(NoSpace):  # back to the default
        fs.plan_append(A, h, [1])
    fs.close_session(A)
    fs.close_session(B)
    fs.check()


def test_swap_out_and_in_keeps_private_kv(tmp_path):
    fs, io = make_fs(tmp_path)
    h = fs.create(A)
    append(fs, io, A, h, list(range(1, 10)))
    child = fs.fork(A, h)
    other = fs.create(B)
    append(fs, io, B, other, [5, 6])
    assert fs.session_usage(A) == 3
    a_pages = list(fs._handles.get(A, h).file.pages)
    freed = fs.swap_out(A)
    assert freed == 3 and fs.session_usage(A) == 0 and fs.stats().pages_per_tenant == {"bravo": 1}
    io.pages[a_pages] = -1.0  # the freed device pages get reused while A waits
    append(fs, io, B, other, [7, 8, 9])
    fs.swap_in(A)
    assert io.kv_of(fs, B, other) == expected_kv([5, 6, 7, 8, 9])
    assert io.kv_of(fs, A, h) == expected_kv(list(range(1, 10)))
    assert io.kv_of(fs, A, child) == expected_kv(list(range(1, 10)))
    fs.close_session(A)
    fs.close_session(B)
    fs.check()
    assert fs.stats().used_pages == 0 and fs.stats().host_pages == 0


@pytest.mark.parametrize("prefix_cache", [False, True])
def test_swap_out_leaves_forks_of_a_stored_context_shared(tmp_path, prefix_cache):
    """Agents waiting on a channel hold forks of one pinned context: swapping a fork out would
    free only its own pages and bring it back as a private copy of the whole context."""
    fs, io = make_fs(tmp_path, num_pages=12, prefix_cache=prefix_cache)  # 11 usable pages
    context = list(range(1, 4 * BLOCK + 2))  # 5 pages, the last one partial
    _named(fs, io, A, "ctx", context)
    fs.pin("acme", "ctx", True)
    agents = [Owner("acme", f"agent{i}") for i in range(3)]
    forks = {}
    for i, agent in enumerate(agents):
        opened = fs.open(agent, "ctx")
        forks[agent] = fs.fork(agent, opened)
        fs.close(agent, opened)
        append(fs, io, agent, forks[agent], [100 + i])  # its turn: a copy of the partial page
    used = fs.stats().used_pages
    assert used == 5 + 3
    for agent in agents:  # each waits for its next message
        assert fs.swap_out(agent) == 0
        fs.swap_in(agent)
    assert fs.stats().used_pages == used and fs.stats().host_pages == 0
    for i, agent in enumerate(agents):
        append(fs, io, agent, forks[agent], [200 + i])
        assert io.kv_of(fs, agent, forks[agent]) == expected_kv([*context, 100 + i, 200 + i])
        fs.close_session(agent)
    fs.check()


def test_flush_and_load_index_survive_a_restart(tmp_path):
    fs, io = make_fs(tmp_path)
    _named(fs, io, A, "sys", [1, 2, 3, 4, 5])
    _named(fs, io, B, "sys", [9, 8])
    fs.pin("bravo", "sys", True)
    fs.flush()
    io2 = MemPageIO(32)
    fs2 = KVFS(32, BLOCK, fs.page_bytes, io2, LocalKVStore(tmp_path / "kvstore"), host_pages=4)
    assert fs2.load_index() == 2
    rows = {(r.tenant, r.name): r for r in fs2.list_files()}
    assert rows[("acme", "sys")].residency == "disk" and rows[("acme", "sys")].tokens == 5
    assert rows[("bravo", "sys")].pinned
    h = fs2.open(A, "sys")
    assert io2.kv_of(fs2, A, h) == expected_kv([1, 2, 3, 4, 5])
    fs2.close(A, h)
    fs2.remove("bravo", "sys")
    assert not (tmp_path / "kvstore" / "bravo" / "sys.safetensors").exists()
    fs2.check()


def test_page_bytes_match_page_shape(tmp_path):
    fs, _io = make_fs(tmp_path)
    assert fs.page_bytes == torch.zeros(PAGE_SHAPE).nbytes


def test_named_file_is_written_through_when_its_last_handle_closes(tmp_path):
    fs, io = make_fs(tmp_path)
    h = fs.create(A, "doc")
    append(fs, io, A, h, [3, 1, 4, 1, 5])
    assert stored_blobs(fs.store) == []
    reader = fs.fork(A, h)
    fs.close(A, h)  # the file itself has no handle left: persisted now, still on device
    assert stored_blobs(fs.store) == ["acme/doc.safetensors"]
    assert _residency(fs)["acme/doc"] == "device"
    fs.close(A, reader)
    again = fs.open(A, "doc", "r")
    fs.close(A, again)  # unchanged: not written again
    fs.check()


class FullStore(LocalKVStore):
    """A store whose disk is full."""

    def put(self, key: str, data: bytes) -> None:
        raise OSError(28, "No space left on device")


def test_full_store_on_close_loses_nothing_and_is_retried(tmp_path):
    fs, io = make_fs(tmp_path)
    real_store = fs.store
    fs.store = fs.tiers.store = FullStore(tmp_path / "full")
    h = fs.create(A, "doc")
    append(fs, io, A, h, list(range(2 * BLOCK + 1)))
    fs.close(A, h)  # logged, not raised: the run keeps going
    assert _residency(fs)["acme/doc"] == "device"
    fs.store = fs.tiers.store = real_store
    fs.flush()
    r = fs.open(A, "doc", "r")
    assert fs.tokens(A, r) == list(range(2 * BLOCK + 1))
    assert stored_blobs(real_store) == ["acme/doc.safetensors"]
    fs.close(A, r)
    fs.check()


class CountingPageIO(MemPageIO):
    """Counts the pages read off the device (what a spill to host copies)."""

    def __init__(self, num_pages: int) -> None:
        super().__init__(num_pages)
        self.pages_read = 0

    def read_pages(self, page_ids):
        self.pages_read += len(page_ids)
        return super().read_pages(page_ids)


def _counting_fs(tmp_path, num_pages: int = 32, host_pages: int = 8) -> tuple[KVFS, CountingPageIO]:
    io = CountingPageIO(num_pages)
    fs = KVFS(num_pages, BLOCK, int(torch.zeros(PAGE_SHAPE).nbytes), io, LocalKVStore(tmp_path / "kv"), host_pages)
    return fs, io


def test_a_reloaded_file_keeps_a_clean_host_copy_so_spilling_it_again_copies_nothing(tmp_path):
    fs, io = _counting_fs(tmp_path)
    toks = list(range(1, 9))  # 2 full pages
    _named(fs, io, A, "doc", toks)
    doc = fs._named[("acme", "doc")]
    fs._spill(doc)
    assert io.pages_read == 2 + 2  # the write-through on close, then the spill
    r = fs.open(A, "doc", "r")  # reload: the host tensor stays as a clean copy
    assert fs.stats().host_pages == 2 and _residency(fs) == {"acme/doc": "device"}
    assert fs.stats().host_clean_pages == 2  # held, but free to drop (admission counts it as room)
    fs.close(A, r)
    io.pages[doc.pages] = -1.0  # scribbled on after the fact: the copy must not be re-read
    fs._spill(doc)
    assert io.pages_read == 4, "a clean file went back to host without a copy"
    assert _residency(fs) == {"acme/doc": "host"} and fs.stats().host_pages == 2
    assert fs.stats().host_clean_pages == 0
    io.pages[:] = -2.0
    r = fs.open(A, "doc", "r")
    assert io.kv_of(fs, A, r) == expected_kv(toks)
    fs.close(A, r)
    fs.check()


def test_writing_a_reloaded_file_drops_its_clean_copy(tmp_path):
    fs, io = _counting_fs(tmp_path)
    toks = list(range(1, 7))  # 1.5 pages
    _named(fs, io, A, "doc", toks)
    fs._spill(fs._named[("acme", "doc")])
    w = fs.open(A, "doc", "w")
    append(fs, io, A, w, [7, 8, 9])  # writes the reloaded pages: the host copy is stale now
    assert fs.stats().host_pages == 0
    fs.close(A, w)
    fs._spill(fs._named[("acme", "doc")])
    io.pages[:] = -1.0
    r = fs.open(A, "doc", "r")
    assert io.kv_of(fs, A, r) == expected_kv([*toks, 7, 8, 9])
    fs.close(A, r)
    w = fs.open(A, "doc", "w")
    fs.truncate(A, w, 4)  # a truncate drops it too
    assert fs.stats().host_pages == 0
    fs.close(A, w)
    fs._spill(fs._named[("acme", "doc")])
    r = fs.open(A, "doc", "r")
    assert io.kv_of(fs, A, r) == expected_kv(toks[:4])
    fs.close(A, r)
    fs.check()


def test_clean_copies_give_way_before_host_files_go_to_disk(tmp_path):
    fs, io = _counting_fs(tmp_path, host_pages=2)
    _named(fs, io, A, "a", [1, 2, 3, 4])  # 1 page each
    _named(fs, io, A, "b", [5, 6, 7, 8])
    _named(fs, io, A, "c", [9, 10, 11, 12])
    fs._spill(fs._named[("acme", "a")])
    fs._spill(fs._named[("acme", "b")])
    fs.close(A, fs.open(A, "a"))  # a: device, with its clean copy; host holds a's copy and b
    assert fs.stats().host_pages == 2
    fs._spill(fs._named[("acme", "c")])  # host is full: a's copy goes, b stays on host
    assert _residency(fs) == {"acme/a": "device", "acme/b": "host", "acme/c": "host"}
    assert fs.stats().host_pages == 2 and fs.stats().disk_pages == 0
    for name, toks in (("a", [1, 2, 3, 4]), ("b", [5, 6, 7, 8]), ("c", [9, 10, 11, 12])):
        r = fs.open(A, name)
        assert io.kv_of(fs, A, r) == expected_kv(toks)
        fs.close(A, r)
    fs.check()
