"""KVFS semantics over a real in-memory PageIO: COW, rollback, extract/merge, tenancy, names."""

from __future__ import annotations

import pytest

from gpu_worker.kvfs import Busy, Exists, InvalidArgument, NoSpace, NotFound, Owner
from gpu_worker.ops.errors import wire_error
from gpu_worker.protocol import ErrorCode
from tests.kvfs.memio import BLOCK, append, expected_kv, make_fs, stored_blobs

A = Owner("acme", "s1")
A2 = Owner("acme", "s2")
B = Owner("bravo", "s1")


def test_append_allocates_pages_and_kv_matches(tmp_path):
    fs, io = make_fs(tmp_path)
    h = fs.create(A)
    plan = append(fs, io, A, h, [1, 2, 3, 4, 5])
    assert plan.num_computed_tokens == 0 and plan.n_pending == 0 and len(plan.page_ids) == 2
    assert 0 not in plan.page_ids
    append(fs, io, A, h, [6])
    assert fs.tokens(A, h) == [1, 2, 3, 4, 5, 6] and fs.length(A, h) == 6
    assert io.kv_of(fs, A, h) == expected_kv([1, 2, 3, 4, 5, 6])
    assert fs.session_usage(A) == 2
    fs.close(A, h)
    assert fs.stats().free_pages == fs.stats().total_pages
    fs.check()


def test_fork_shares_pages_and_cow_keeps_parent_intact(tmp_path):
    fs, io = make_fs(tmp_path)
    parent = fs.create(A)
    append(fs, io, A, parent, list(range(10, 16)))  # 6 tokens: 1 full page + partial page
    used = fs.stats().used_pages
    child = fs.fork(A, parent)
    assert fs.stats().used_pages == used  # fork copies no KV
    plan = append(fs, io, A, child, [99])
    assert len(plan.page_copies) == 1  # the partial last page was copied before writing
    src, dst = plan.page_copies[0]
    assert plan.page_ids[-1] == dst != src
    assert io.kv_of(fs, A, parent) == expected_kv(range(10, 16))
    assert io.kv_of(fs, A, child) == expected_kv([*range(10, 16), 99])
    # The parent writes too: it now owns its partial page alone, so no copy is needed.
    plan = append(fs, io, A, parent, [77])
    assert plan.page_copies == ()
    assert io.kv_of(fs, A, parent) == expected_kv([*range(10, 16), 77])
    assert io.kv_of(fs, A, child) == expected_kv([*range(10, 16), 99])
    fs.close(A, parent)
    fs.close(A, child)
    fs.check()
    assert fs.stats().used_pages == 0


def test_truncate_rolls_back_and_frees_whole_pages(tmp_path):
    fs, io = make_fs(tmp_path)
    h = fs.create(A)
    append(fs, io, A, h, list(range(1, 11)))  # 3 pages
    assert fs.stats().used_pages == 3
    fs.truncate(A, h, 4)
    assert fs.tokens(A, h) == [1, 2, 3, 4] and fs.stats().used_pages == 1
    append(fs, io, A, h, [50, 51])
    assert io.kv_of(fs, A, h) == expected_kv([1, 2, 3, 4, 50, 51])
    with pytest.raises(InvalidArgument):
        fs.truncate(A, h, 7)
    fs.close(A, h)
    fs.check()


def test_abort_append_loses_nothing(tmp_path):
    fs, io = make_fs(tmp_path)
    h = fs.create(A)
    append(fs, io, A, h, [1, 2, 3])
    child = fs.fork(A, h)
    before = fs.stats().used_pages
    plan = fs.plan_append(A, child, [4, 5, 6, 7])
    with pytest.raises(Busy):
        fs.plan_append(A, child, [8])
    fs.abort_append(plan)
    with pytest.raises(InvalidArgument):
        fs.commit_append(plan)
    assert fs.stats().used_pages == before
    assert fs.tokens(A, child) == [1, 2, 3]
    append(fs, io, A, child, [4])
    assert io.kv_of(fs, A, child) == expected_kv([1, 2, 3, 4])
    fs.close_session(A)
    fs.check()
    assert fs.stats().used_pages == 0


def test_extract_prefix_shares_pages_and_shifted_extract_is_pending(tmp_path):
    fs, io = make_fs(tmp_path)
    h = fs.create(A)
    toks = list(range(1, 11))
    append(fs, io, A, h, toks)
    used = fs.stats().used_pages
    pre = fs.extract(A, h, 0, 8)
    assert fs.stats().used_pages == used and io.kv_of(fs, A, pre) == expected_kv(toks[:8])
    mid = fs.extract(A, h, 3, 7)
    assert fs.tokens(A, mid) == toks[3:7]
    plan = fs.plan_append(A, mid, [42])
    assert plan.n_pending == 4 and plan.num_computed_tokens == 0
    assert plan.run_token_ids == (*toks[3:7], 42)
    io.run(plan)
    fs.commit_append(plan)
    assert io.kv_of(fs, A, mid) == expected_kv([*toks[3:7], 42])
    with pytest.raises(InvalidArgument):
        fs.extract(A, h, 5, 3)
    fs.close_session(A)
    fs.check()


def test_merge_keeps_left_kv_and_recomputes_right(tmp_path):
    fs, io = make_fs(tmp_path)
    a = fs.create(A)
    b = fs.create(A)
    append(fs, io, A, a, [1, 2, 3, 4, 5])
    append(fs, io, A, b, [7, 8])
    m = fs.merge(A, a, b)
    assert fs.tokens(A, m) == [1, 2, 3, 4, 5, 7, 8]
    plan = fs.plan_append(A, m, [9])
    assert plan.num_computed_tokens == 5 and plan.n_pending == 2 and plan.run_token_ids == (7, 8, 9)
    assert plan.page_copies  # a's partial page is shared with a, so it is copied first
    io.run(plan)
    fs.commit_append(plan)
    assert io.kv_of(fs, A, m) == expected_kv([1, 2, 3, 4, 5, 7, 8, 9])
    assert io.kv_of(fs, A, a) == expected_kv([1, 2, 3, 4, 5])
    fs.close_session(A)
    fs.check()
    assert fs.stats().used_pages == 0


def test_handles_are_scoped_to_session_and_tenant(tmp_path):
    fs, io = make_fs(tmp_path)
    h = fs.create(A)
    append(fs, io, A, h, [1])
    for intruder in (A2, B):
        for call in (
            lambda o: fs.length(o, h),
            lambda o: fs.tokens(o, h),
            lambda o: fs.fork(o, h),
            lambda o: fs.plan_append(o, h, [2]),
            lambda o: fs.close(o, h),
        ):
            with pytest.raises(NotFound) as exc:
                call(intruder)
            assert wire_error(exc.value, "kv", "s").code == ErrorCode.NOT_FOUND
            assert str(h) in exc.value.message  # same answer as an id that never existed
    with pytest.raises(NotFound) as exc:
        fs.length(A, h + 1)
    with pytest.raises(InvalidArgument):
        fs.length(A, "1")
    assert fs.length(A, h) == 1


def test_names_are_per_tenant_and_validated(tmp_path):
    fs, io = make_fs(tmp_path)
    h = fs.create(A, "system-prompt.v1")
    append(fs, io, A, h, [1, 2, 3])
    fs.close(A, h)
    with pytest.raises(NotFound):
        fs.open(B, "system-prompt.v1")  # another tenant's namespace is simply another namespace
    hb = fs.create(B, "system-prompt.v1")
    assert fs.length(B, hb) == 0
    with pytest.raises(Exists) as exc:
        fs.create(A, "system-prompt.v1")
    assert wire_error(exc.value, "kv", "s").code == ErrorCode.EXISTS
    for bad in ["", "..", "a/../b", "../acme/x", "/etc", "a/b", ".hidden", "x" * 129, "a b", "ü", "a\x00"]:
        with pytest.raises(InvalidArgument) as exc:
            fs.create(A, bad)
        assert wire_error(exc.value, "kv", "s").code == ErrorCode.BAD_ARGS
    assert [(r.tenant, r.name, r.tokens) for r in fs.list_files()] == [
        ("acme", "system-prompt.v1", 3),
        ("bravo", "system-prompt.v1", 0),
    ]
    assert [r.tenant for r in fs.list_files("bravo")] == ["bravo"]


def test_open_reader_forks_and_writer_is_exclusive(tmp_path):
    fs, io = make_fs(tmp_path)
    w = fs.create(A, "doc")
    append(fs, io, A, w, [1, 2, 3, 4, 5, 6])
    with pytest.raises(Busy):
        fs.open(A2, "doc", "w")
    r = fs.open(A2, "doc", "r")
    append(fs, io, A2, r, [9])  # the reader's private fork
    fs.close(A, w)
    fs.close(A2, r)
    w2 = fs.open(A2, "doc", "w")
    assert fs.tokens(A2, w2) == [1, 2, 3, 4, 5, 6]
    assert io.kv_of(fs, A2, w2) == expected_kv([1, 2, 3, 4, 5, 6])
    with pytest.raises(InvalidArgument):
        fs.open(A2, "doc", "rw")
    fs.close(A2, w2)
    fs.remove("acme", "doc")
    with pytest.raises(NotFound):
        fs.open(A, "doc")
    fs.check()
    assert fs.stats().used_pages == 0


def test_remove_while_open_keeps_file_until_close(tmp_path):
    fs, io = make_fs(tmp_path)
    h = fs.create(A, "tmp")
    append(fs, io, A, h, [1, 2])
    fs.remove("acme", "tmp")
    assert fs.list_files() == []
    assert fs.tokens(A, h) == [1, 2]
    fs.close(A, h)
    assert fs.stats().used_pages == 0
    fs.check()


def test_empty_append_without_pending_is_rejected(tmp_path):
    fs, _io = make_fs(tmp_path)
    h = fs.create(A)
    for bad in ([], [-1], [True], [1.5]):
        with pytest.raises(InvalidArgument):
            fs.plan_append(A, h, bad)
    assert fs.stats().used_pages == 0


def test_pool_exhaustion_is_enospc(tmp_path):
    fs, io = make_fs(tmp_path, num_pages=4)  # 3 usable pages
    h = fs.create(A)
    append(fs, io, A, h, list(range(3 * BLOCK)))
    with pytest.raises(NoSpace) as exc:
        fs.plan_append(A, h, [1])
    assert wire_error(exc.value, "kv", "s").code == ErrorCode.NO_SPACE and "KV cache full" in exc.value.message
    assert fs.length(A, h) == 3 * BLOCK


def test_on_release_reports_dead_sequences(tmp_path):
    fs, io = make_fs(tmp_path)
    released: list[str] = []
    fs._on_release = released.append
    h = fs.create(A)
    plan = append(fs, io, A, h, [1, 2])
    named = fs.create(A, "keep")
    named_seq = fs.plan_append(A, named, [3])
    fs.close(A, named)  # an append is in flight: still in use
    assert released == []
    fs.abort_append(named_seq)
    fs.close(A, h)
    assert released == [named_seq.seq_id, plan.seq_id]
    assert [r.name for r in fs.list_files()] == ["keep"]  # released by the engine, kept by KVFS


def test_session_page_limit_and_snapshot(tmp_path):
    fs, io = make_fs(tmp_path)
    fs.set_session_limit(A, 2)
    h = fs.create(A)
    append(fs, io, A, h, list(range(2 * BLOCK)))
    with pytest.raises(NoSpace) as exc:
        fs.plan_append(A, h, [1])
    assert "session KV page limit" in exc.value.message
    other = fs.create(A2)  # another session of the same tenant is not limited by A's cap
    append(fs, io, A2, other, list(range(3 * BLOCK)))
    (event, pages), (_, other_pages) = fs.live_usage([A, A2])
    assert event == {"run_pages": 2, "tenant_device_pages": 5, "tenant_host_pages": 0, "tokens": 2 * BLOCK}
    assert (pages, other_pages) == (2, 3) and fs.live_usage([]) == []
    fs.close_session(A)
    h = fs.create(A)
    append(fs, io, A, h, list(range(3 * BLOCK)))  # the cap ended with the session
    fs.close_session(A)
    fs.close_session(A2)
    fs.check()


def test_admin_ops_are_scoped_by_tenant(tmp_path):
    fs, io = make_fs(tmp_path)
    h = fs.create(A, "doc")
    append(fs, io, A, h, [1, 2, 3])
    fs.close(A, h)
    ops = (lambda: fs.pin("bravo", "doc", True), lambda: fs.evict("bravo", "doc"), lambda: fs.remove("bravo", "doc"))
    for op in ops:
        with pytest.raises(NotFound):
            op()
    for bad_tenant in ("", "../acme", "acme/x", "a" * 65):
        with pytest.raises(InvalidArgument):
            fs.pin(bad_tenant, "doc", True)
    assert [(r.tenant, r.name, r.pinned, r.residency) for r in fs.list_files()] == [("acme", "doc", False, "device")]


def test_concurrent_appends_from_threads_keep_invariants(tmp_path):
    import threading

    fs, io = make_fs(tmp_path, num_pages=64)
    owners = [Owner("acme", f"t{i}") for i in range(4)]
    errors: list[BaseException] = []
    lock = threading.Lock()  # serialises only the in-memory "engine", as the real forward loop does

    def worker(owner: Owner) -> None:
        try:
            h = fs.create(owner)
            for step in range(20):
                plan = fs.plan_append(owner, h, [step])
                with lock:
                    io.run(plan)
                fs.commit_append(plan)
                child = fs.fork(owner, h)
                fs.close(owner, child)
            assert io.kv_of(fs, owner, h) == expected_kv(list(range(20)))
            fs.close_session(owner)
        except BaseException as exc:  # reported to the main thread below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(o,)) for o in owners]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    fs.check()
    assert fs.stats().used_pages == 0


def test_remove_tenant_deletes_its_files_even_those_another_worker_wrote_to_a_shared_store(tmp_path):
    """A closed tenant's purge (api/services/tenant_closure.py) on one live worker must also
    clear what a worker that is gone left in a store they shared (S3 in production)."""
    first, io1 = make_fs(tmp_path)
    for owner, name in ((A, "a"), (A, "b"), (B, "x"), (Owner("acme-2", "s1"), "y")):
        h = first.create(owner, name)
        append(first, io1, owner, h, [1, 2, 3])
        first.close(owner, h)
    second, _ = make_fs(tmp_path)  # same store directory, catalogue read at start
    second.load_index()
    h = first.create(A, "c")  # written after the second worker read the store: not in its catalogue
    append(first, io1, A, h, [4, 5])
    first.close(A, h)
    assert stored_blobs(second.store, "acme/") == ["acme/a.safetensors", "acme/b.safetensors", "acme/c.safetensors"]

    assert second.remove_tenant("acme") == ["a", "b", "c"]
    assert second.store.list("acme/") == [] and [f.name for f in second.list_files("acme")] == []
    assert stored_blobs(second.store) == ["acme-2/y.safetensors", "bravo/x.safetensors"]  # a prefix is not a tenant
    assert second.remove_tenant("acme") == []  # idempotent
    second.check()
