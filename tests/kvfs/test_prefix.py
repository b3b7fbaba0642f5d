"""The automatic prefix cache (gpu_worker/kvfs/prefix.py) over a real in-memory PageIO: the
index, what a fresh file maps, LRU reclamation before anything else, tenant isolation, truncate
safety and ``cache=False``."""

from __future__ import annotations

import pytest

from gpu_worker.kvfs import InvalidArgument, NoSpace, Owner
from tests.kvfs.memio import BLOCK, append, expected_kv, make_fs

A = Owner("acme", "s1")
A2 = Owner("acme", "s2")
B = Owner("bravo", "s1")

PROMPT = list(range(100, 100 + 3 * BLOCK + 2))  # 3 full pages + 2 tokens


def _compute(fs, io, owner, tokens, cache=True):
    """A fresh file with ``tokens`` appended the way the scheduler does a first ``pred``:
    the cached prefix is mapped, the rest computed. Returns (handle, mapped tokens, plan)."""
    h = fs.create(owner, cache=cache)
    mapped = fs.map_cached_prefix(owner, h, tokens, len(tokens) - 1)
    plan = append(fs, io, owner, h, tokens[mapped:])
    return h, mapped, plan


def test_full_pages_are_indexed_and_a_second_file_maps_them(tmp_path):
    fs, io = make_fs(tmp_path, prefix_cache=True)
    h1, mapped, _ = _compute(fs, io, A, PROMPT)
    assert mapped == 0 and fs.stats().prefix_indexed_pages == 3  # the partial 4th page is not final
    h2, mapped, plan = _compute(fs, io, A2, PROMPT)
    assert mapped == 3 * BLOCK
    assert plan.num_computed_tokens == 3 * BLOCK and plan.run_token_ids == tuple(PROMPT[3 * BLOCK :])
    assert plan.page_ids[:3] == tuple(fs._handles.get(A, h1).file.pages[:3])  # shared, not copied
    assert io.kv_of(fs, A2, h2) == expected_kv(PROMPT) and fs.tokens(A2, h2) == PROMPT
    fs.check()


def test_mapping_leaves_the_position_the_caller_needs_logits_of(tmp_path):
    fs, io = make_fs(tmp_path, prefix_cache=True)
    exact = PROMPT[: 3 * BLOCK]  # exactly 3 full pages
    _compute(fs, io, A, exact)
    h = fs.create(A2)
    # The last token must be computed to get its logits: only 2 pages map.
    assert fs.map_cached_prefix(A2, h, exact, len(exact) - 1) == 2 * BLOCK
    h = fs.create(A2)
    assert fs.map_cached_prefix(A2, h, exact, BLOCK + 1) == BLOCK  # a row asked at position 5
    h = fs.create(A2)
    assert fs.map_cached_prefix(A2, h, exact, 0) == 0
    fs.check()


def test_only_a_fresh_file_maps_and_a_different_prefix_misses(tmp_path):
    fs, io = make_fs(tmp_path, prefix_cache=True)
    _compute(fs, io, A, PROMPT)
    other = [7, *PROMPT[1:]]  # first token differs: every chained key differs
    _, mapped, _ = _compute(fs, io, A2, other)
    assert mapped == 0
    h = fs.create(A2)
    append(fs, io, A2, h, [1])
    assert fs.map_cached_prefix(A2, h, PROMPT, len(PROMPT) - 1) == 0  # not fresh
    # A longer prompt sharing the first 2 pages maps those 2 only.
    longer = PROMPT[: 2 * BLOCK] + [5] * (2 * BLOCK)
    _, mapped, _ = _compute(fs, io, A2, longer)
    assert mapped == 2 * BLOCK
    fs.check()


def test_never_shared_across_tenants(tmp_path):
    fs, io = make_fs(tmp_path, prefix_cache=True)
    _compute(fs, io, A, PROMPT)
    hb, mapped, _ = _compute(fs, io, B, PROMPT)
    assert mapped == 0
    pages_a = {p for p in fs.prefix.pages() if fs.alloc.owner(p) == "acme"}
    assert not pages_a & set(fs._handles.get(B, hb).file.pages)
    assert fs.stats().prefix_indexed_pages == 6  # each tenant has its own copy
    fs.check()


def test_cache_false_neither_maps_nor_indexes(tmp_path):
    fs, io = make_fs(tmp_path, prefix_cache=True)
    h, _, _ = _compute(fs, io, A, PROMPT, cache=False)
    assert fs.stats().prefix_indexed_pages == 0
    fork = fs.fork(A, h)
    append(fs, io, A, fork, [1] * BLOCK)
    assert fs.stats().prefix_indexed_pages == 0  # forks inherit the opt-out
    _compute(fs, io, A, PROMPT)
    _, mapped, _ = _compute(fs, io, A2, PROMPT, cache=False)
    assert mapped == 0
    fs.check()


def test_closed_files_leave_cached_only_pages_that_the_next_file_reuses(tmp_path):
    fs, io = make_fs(tmp_path, prefix_cache=True)
    h, _, _ = _compute(fs, io, A, PROMPT)
    fs.close(A, h)
    st = fs.stats()
    assert st.used_pages == 3 and st.prefix_cached_pages == 3  # the partial page was freed
    h2, mapped, _ = _compute(fs, io, A2, PROMPT)
    assert mapped == 3 * BLOCK and io.kv_of(fs, A2, h2) == expected_kv(PROMPT)
    assert fs.stats().prefix_cached_pages == 0  # in use by a file again
    fs.check()


def test_truncate_and_rewrite_never_corrupt_an_indexed_page(tmp_path):
    fs, io = make_fs(tmp_path, prefix_cache=True)
    h, _, _ = _compute(fs, io, A, PROMPT)
    fs.truncate(A, h, BLOCK + 1)  # into the 2nd (indexed) page
    plan = append(fs, io, A, h, [9] * (2 * BLOCK))  # rewrite: the shared page is copied first
    assert len(plan.page_copies) == 1
    # The original prompt still maps its right KV; the rewritten prefix maps its own.
    h2, mapped, _ = _compute(fs, io, A2, PROMPT)
    assert mapped == 3 * BLOCK and io.kv_of(fs, A2, h2) == expected_kv(PROMPT)
    rewritten = fs.tokens(A, h)
    h3, mapped, _ = _compute(fs, io, A2, rewritten)
    assert mapped == 3 * BLOCK and io.kv_of(fs, A2, h3) == expected_kv(rewritten)  # its own 3 full pages
    fs.check()


def test_cached_only_pages_are_reclaimed_lru_first_before_named_files_spill(tmp_path):
    fs, io = make_fs(tmp_path, num_pages=9, prefix_cache=True)  # 8 usable pages
    named = fs.create(A, "doc", cache=False)
    append(fs, io, A, named, list(range(2 * BLOCK)))
    fs.close(A, named)  # idle named file: 2 device pages, spillable
    old, _, _ = _compute(fs, io, A, [1] * (2 * BLOCK) + [0])
    new, _, _ = _compute(fs, io, A, [2] * (2 * BLOCK) + [0])
    fs.close(A, old)
    fs.close(A, new)
    assert fs.stats().prefix_cached_pages == 4 and fs.stats().free_pages == 2
    h = fs.create(A2, cache=False)
    append(fs, io, A2, h, [3] * (4 * BLOCK))  # 4 pages: 2 free + the 2 oldest cached
    assert fs.stats().prefix_cached_pages == 2
    assert fs.list_files("acme")[0].residency == "device"  # the named file was not spilled
    again, mapped, _ = _compute(fs, io, A, [2] * (2 * BLOCK) + [0])
    assert mapped == 2 * BLOCK  # the newer entry survived
    fs.close(A, again)
    _, mapped, _ = _compute(fs, io, A2, [1] * (2 * BLOCK) + [0])
    assert mapped == 0  # the older one was reclaimed
    fs.check()


def test_cached_only_pages_never_make_a_tenant_hit_its_page_bound(tmp_path):
    fs, io = make_fs(tmp_path, num_pages=32, prefix_cache=True, device_pages_per_tenant=6)
    for i in range(3):
        h, _, _ = _compute(fs, io, A, [i + 1] * (2 * BLOCK) + [0])
        fs.close(A, h)
    # The third file needed a cached page back to stay within the bound: the oldest one went.
    assert fs.alloc.tenant_pages("acme") == 5 and fs.stats().prefix_cached_pages == 5
    h = fs.create(A2)
    append(fs, io, A2, h, [9] * (6 * BLOCK))  # the whole bound: every cached page reclaimed
    assert fs.alloc.tenant_pages("acme") == 6 and fs.stats().prefix_cached_pages == 0
    with pytest.raises(NoSpace):  # pages a file uses still count
        append(fs, io, A2, h, [9])
    fs.check()


def test_a_spilled_files_indexed_pages_become_reclaimable(tmp_path):
    fs, io = make_fs(tmp_path, num_pages=9, prefix_cache=True)
    named = fs.create(A, "doc")
    append(fs, io, A, named, list(range(4 * BLOCK)))
    fs.close(A, named)
    assert fs.stats().prefix_indexed_pages == 4
    h = fs.create(B)
    append(fs, io, B, h, [5] * (8 * BLOCK))  # the whole pool: the file spills, its pages are freed
    assert fs.list_files("acme")[0].residency != "device"
    assert fs.stats().prefix_indexed_pages == 8  # only bravo's
    fs.close(B, h)
    h = fs.open(A, "doc")  # reloads onto fresh pages with the right KV
    assert io.kv_of(fs, A, h) == expected_kv(range(4 * BLOCK))
    fs.check()


def test_removing_a_tenant_drops_its_cache(tmp_path):
    fs, io = make_fs(tmp_path, prefix_cache=True)
    h, _, _ = _compute(fs, io, A, PROMPT)
    fs.close(A, h)
    _compute(fs, io, B, PROMPT)
    fs.remove_tenant("acme")
    assert fs.stats().prefix_indexed_pages == 3  # bravo's stay
    fs.check()


def test_cache_off_by_default_in_kvfs(tmp_path):
    fs, io = make_fs(tmp_path)
    _compute(fs, io, A, PROMPT)
    _, mapped, _ = _compute(fs, io, A2, PROMPT)
    assert mapped == 0 and fs.stats().prefix_indexed_pages == 0


def test_bad_token_ids_map_nothing_and_the_append_refuses_them(tmp_path):
    fs, _io = make_fs(tmp_path, prefix_cache=True)
    h = fs.create(A)
    assert fs.map_cached_prefix(A, h, [-1] * (2 * BLOCK), 2 * BLOCK - 1) == 0
    with pytest.raises(InvalidArgument):
        fs.plan_append(A, h, [-1] * (2 * BLOCK))
    fs.check()


def _conversation(fs, io, owner, name, own_tokens):
    """A named conversation file over the shared PROMPT's full pages plus its own tokens, closed."""
    h = fs.create(owner, name)
    tokens = PROMPT[: 3 * BLOCK] + own_tokens
    mapped = fs.map_cached_prefix(owner, h, tokens, len(tokens) - 1)
    append(fs, io, owner, h, tokens[mapped:])
    fs.close(owner, h)
    return tokens


def _counting_writes(io):
    written: list[int] = []
    write = io.write_pages

    def counted(page_ids, data):
        written.extend(page_ids)
        write(page_ids, data)

    io.write_pages = counted
    return written


def test_a_reloaded_file_maps_its_cached_leading_pages_instead_of_copying_them(tmp_path):
    fs, io = make_fs(tmp_path, num_pages=12, host_pages=16, prefix_cache=True)  # 11 usable pages
    one = _conversation(fs, io, A, "one", [7] * (2 * BLOCK))  # 3 shared + 2 own pages
    two = _conversation(fs, io, A, "two", [8] * (2 * BLOCK))
    assert fs.stats().free_pages == 4  # the system prompt's 3 pages are held once
    h = fs.create(A2, cache=False)
    append(fs, io, A2, h, [3] * (6 * BLOCK))  # spills "one" (the least recently used)
    assert [f.residency for f in fs.list_files("acme")] == ["host", "device"]
    fs.close(A2, h)
    written = _counting_writes(io)
    h1 = fs.open(A, "one", "w")
    h2 = fs.open(A, "two", "w")
    pages1 = fs._handles.get(A, h1).file.pages
    pages2 = fs._handles.get(A, h2).file.pages
    assert pages1[:3] == pages2[:3]  # shared again, as before it left
    assert len(written) == 2  # only its own pages were copied back
    assert io.kv_of(fs, A, h1) == expected_kv(one) and io.kv_of(fs, A, h2) == expected_kv(two)
    fs.check()


def test_a_reload_without_the_cached_pages_copies_them_and_indexes_them_again(tmp_path):
    fs, io = make_fs(tmp_path, num_pages=9, host_pages=16, prefix_cache=True)  # 8 usable pages
    one = _conversation(fs, io, A, "one", [7] * BLOCK)  # 3 shared + 1 own page
    h = fs.create(A2, cache=False)
    append(fs, io, A2, h, [3] * (8 * BLOCK))  # the whole pool: "one" spills, the cache is reclaimed
    assert fs.stats().prefix_indexed_pages == 0
    fs.close(A2, h)
    written = _counting_writes(io)
    h1 = fs.open(A, "one", "w")
    assert len(written) == 4 and io.kv_of(fs, A, h1) == expected_kv(one)
    assert fs.stats().prefix_indexed_pages == 4  # its full pages are cached again
    fs.close(A, h1)
    h2 = fs.create(A2)
    assert fs.map_cached_prefix(A2, h2, [*one, 1], len(one)) == len(one)
    fs.check()


def test_a_reload_that_does_not_fit_gives_its_cached_pages_back(tmp_path):
    fs, io = make_fs(tmp_path, num_pages=12, host_pages=16, prefix_cache=True, device_pages_per_tenant=6)
    _conversation(fs, io, A, "one", [7] * (2 * BLOCK))  # 3 shared + 2 own pages
    h = fs.create(A2, cache=False)
    append(fs, io, A2, h, [3] * (3 * BLOCK))  # within the bound only once "one" spills
    assert fs.list_files("acme")[0].residency == "host"
    with pytest.raises(NoSpace):
        fs.open(A, "one")  # its 2 own pages do not fit beside the 3 held and its 3 cached
    assert fs.list_files("acme")[0].residency == "host"
    fs.check()  # every reference is a file's or the index's: none leaked by the failed reload
    fs.close(A2, h)
    h1 = fs.open(A, "one")
    assert io.kv_of(fs, A, h1) == expected_kv(PROMPT[: 3 * BLOCK] + [7] * (2 * BLOCK))
    fs.check()
