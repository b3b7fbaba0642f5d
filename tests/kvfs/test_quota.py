"""A tenant's plan shares of the KV tiers: pinned pages within its device share (EDQUOT past
it), host memory within its host share, a bounded count of named files, and unpinned named
files (of anyone) spilled before another tenant's request is refused."""

from __future__ import annotations

import pytest

from gpu_worker.kvfs import KVFS, KVQuotaExceeded, NoSpace, Owner, TenantQuota
from gpu_worker.ops.errors import wire_error
from gpu_worker.protocol import ErrorCode
from tests.kvfs.memio import BLOCK, MemPageIO, append, make_fs

A = Owner("acme", "s1")
B = Owner("bravo", "s1")
C = Owner("carol", "s1")


def _named(fs: KVFS, io: MemPageIO, owner: Owner, name: str, pages: int) -> None:
    h = fs.create(owner, name)
    append(fs, io, owner, h, list(range(pages * BLOCK)))
    fs.close(owner, h)


def _where(fs: KVFS) -> dict[str, str]:
    return {f"{r.tenant}/{r.name}": r.residency for r in fs.list_files()}


def test_pin_past_the_device_share_is_edquot_and_changes_nothing(tmp_path):
    fs, io = make_fs(tmp_path, num_pages=17, pinned_device_share=0.25)  # 16 usable: 4 pinned pages
    for name in ("a", "b", "c"):
        _named(fs, io, A, name, 2)
    fs.pin("acme", "a", True)
    fs.pin("acme", "b", True)
    with pytest.raises(KVQuotaExceeded) as refused:
        fs.pin("acme", "c", True)
    assert wire_error(refused.value, "kv", "s").code == ErrorCode.QUOTA == "EDQUOT"
    assert "share of the device pool (0.25 of 16 = 4 pages)" in refused.value.message
    assert {r.name: r.pinned for r in fs.list_files("acme")} == {"a": True, "b": True, "c": False}
    fs.pin("acme", "a", True)  # pinning again what is pinned costs nothing
    _named(fs, io, B, "b1", 4)
    fs.pin("bravo", "b1", True)  # the share is per tenant
    fs.pin("acme", "a", False)
    fs.pin("acme", "c", True)  # room again once one is unpinned
    fs.check()


def test_a_pinned_file_cannot_grow_past_the_share_and_a_spilled_one_still_counts(tmp_path):
    fs, io = make_fs(tmp_path, num_pages=17, pinned_device_share=0.25)
    _named(fs, io, A, "doc", 3)
    fs.pin("acme", "doc", True)
    h = fs.open(A, "doc", "w")
    append(fs, io, A, h, list(range(BLOCK)))  # 4 pages: at the share
    with pytest.raises(KVQuotaExceeded):
        fs.plan_append(A, h, [1])
    fs.close(A, h)
    fs.evict("acme", "doc")  # explicitly to disk: still pinned, still counted
    _named(fs, io, A, "more", 1)
    with pytest.raises(KVQuotaExceeded):
        fs.pin("acme", "more", True)
    fs.check()


def test_another_tenants_prefill_spills_unpinned_files_and_only_the_share_stays(tmp_path):
    """The attack of the issue on a 16-page pool: acme pins up to its share and fills the rest
    with unpinned files; bravo's prefill of everything but acme's share then succeeds."""
    fs, io = make_fs(tmp_path, num_pages=17, host_pages=4, pinned_device_share=0.25)
    pinned = 0
    for i in range(8):
        _named(fs, io, A, f"f{i}", 2)
        try:
            fs.pin("acme", f"f{i}", True)
            pinned += 2
        except KVQuotaExceeded:
            pass
    assert pinned == 4 and fs.stats().free_pages == 0
    h = fs.create(B)
    append(fs, io, B, h, list(range(12 * BLOCK)))  # 12 pages: every unpinned file spills
    where = _where(fs)
    assert [n for n, r in where.items() if r == "device"] == ["acme/f0", "acme/f1"]
    assert sorted(where.values()).count("disk") == 4 and sorted(where.values()).count("host") == 2
    with pytest.raises(NoSpace):  # past what acme's share leaves: the pool itself is full
        fs.plan_append(B, h, list(range(BLOCK)))
    fs.close(B, h)
    fs.check()


def test_without_shares_pinned_files_make_other_tenants_prefill_fail(tmp_path):
    """What the device share prevents (worker default: no share)."""
    fs, io = make_fs(tmp_path, num_pages=17, host_pages=4)
    for i in range(8):
        _named(fs, io, A, f"f{i}", 2)
        fs.pin("acme", f"f{i}", True)
    with pytest.raises(NoSpace):
        fs.plan_append(B, fs.create(B), list(range(BLOCK)))
    fs.close_session(B)
    fs.check()


def test_the_plan_share_overrides_the_worker_default_per_tenant(tmp_path):
    fs, io = make_fs(tmp_path, num_pages=17, pinned_device_share=0.125)  # 2 pages by default
    fs.set_tenant_quota("acme", TenantQuota(pinned_device_share=0.5))  # acme's plan: 8 pages
    _named(fs, io, A, "big", 6)
    fs.pin("acme", "big", True)
    _named(fs, io, B, "big", 3)
    with pytest.raises(KVQuotaExceeded):
        fs.pin("bravo", "big", True)
    fs.set_tenant_quota("acme", None)  # back to the default; the pin already made stays
    assert [r.pinned for r in fs.list_files("acme")] == [True]
    _named(fs, io, A, "small", 1)
    with pytest.raises(KVQuotaExceeded):
        fs.pin("acme", "small", True)
    fs.check()


def test_a_tenants_spills_past_its_host_share_push_its_own_files_to_disk(tmp_path):
    fs, io = make_fs(tmp_path, num_pages=13, host_pages=8, host_share=0.5)  # 4 host pages each
    _named(fs, io, B, "b1", 2)
    _named(fs, io, B, "b2", 2)
    for name in ("a1", "a2", "a3"):
        _named(fs, io, A, name, 2)
    h = fs.create(C)
    append(fs, io, C, h, list(range(12 * BLOCK)))  # spills all ten pages, oldest first
    assert _where(fs) == {
        "acme/a1": "disk",  # acme's own oldest made room for a3 within acme's share
        "acme/a2": "host",
        "acme/a3": "host",
        "bravo/b1": "host",  # without shares the oldest host file (b1) would have gone to disk
        "bravo/b2": "host",
    }
    fs.close(C, h)
    fs.check()


def test_named_files_per_tenant_are_bounded(tmp_path):
    fs, _io = make_fs(tmp_path, max_files_per_tenant=3)
    for name in ("a", "b", "c"):
        fs.close(A, fs.create(A, name))
    with pytest.raises(KVQuotaExceeded) as refused:
        fs.create(A, "d")
    assert wire_error(refused.value, "kv", "s").code == "EDQUOT"
    assert "3 named KV files (its plan allows 3)" in refused.value.message
    fs.close(A, fs.create(A))  # anonymous files are not stored and not counted
    fs.close(B, fs.create(B, "d"))  # the bound is per tenant
    fs.remove("acme", "a")
    fs.close(A, fs.create(A, "d"))
    fs.set_tenant_quota("acme", TenantQuota(max_files=10))
    fs.close(A, fs.create(A, "e"))
    assert [r.name for r in fs.list_files("acme")] == ["b", "c", "d", "e"]
    fs.check()


def test_reclaimable_pages_count_idle_unpinned_files_only(tmp_path):
    fs, io = make_fs(tmp_path, num_pages=9)  # 8 usable
    _named(fs, io, A, "idle", 2)
    _named(fs, io, A, "pinned", 2)
    fs.pin("acme", "pinned", True)
    h = fs.create(B, "open")
    append(fs, io, B, h, list(range(2 * BLOCK)))
    assert fs.stats().free_pages == 2
    assert fs.reclaimable_pages() == 4  # 2 free + the idle file's 2
    fs.close(B, h)
    assert fs.reclaimable_pages() == 6
    fs.check()


def test_the_pinned_files_of_all_tenants_together_stay_within_the_worker_bound(tmp_path):
    """Each tenant within its share, many tenants (one person may own several) still cannot pin
    the whole pool: the worker bounds everyone's pinned pages together."""
    fs, io = make_fs(tmp_path, num_pages=17, pinned_device_share=0.25, max_pinned_fraction=0.5)  # 4 and 8
    for tenant in ("t1", "t2"):
        _named(fs, io, Owner(tenant, "s"), "doc", 4)
        fs.pin(tenant, "doc", True)
    _named(fs, io, Owner("t3", "s"), "doc", 1)
    with pytest.raises(KVQuotaExceeded) as refused:
        fs.pin("t3", "doc", True)
    assert "pinned KV files of all tenants on this worker would hold 9 pages" in refused.value.message
    fs.pin("t1", "doc", False)
    fs.pin("t3", "doc", True)
    fs.check()
