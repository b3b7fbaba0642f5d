"""Hypothesis state machine: random KVFS operations against a model of token lists.

After every step: allocator invariants hold, every page's refcount equals the references from
live files, each file's tokens match the model, and the KV in its pages is exactly what was
computed for those tokens at those positions (so writing to a fork never changed another
file's pages), and no tenant's pinned files hold more pages than its share of the device pool
(pins and appends past it fail with EDQUOT). At teardown everything is closed/removed and every
page is free again.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, invariant, precondition, rule

from gpu_worker.kvfs import Busy, KVQuotaExceeded, NoSpace, Owner
from tests.kvfs.memio import expected_kv, make_fs

OWNERS = [Owner("acme", "s1"), Owner("acme", "s2"), Owner("bravo", "s1")]
TOKENS = st.lists(st.integers(0, 50), min_size=1, max_size=9)


class KVFSMachine(RuleBasedStateMachine):
    handles = Bundle("handles")
    #: The prefix cache on (``PrefixKVFSMachine``): cached pages must never change any file's KV.
    PREFIX = False

    def __init__(self) -> None:
        super().__init__()
        self._tmp = tempfile.TemporaryDirectory()
        self.fs, self.io = make_fs(
            Path(self._tmp.name),
            num_pages=24,
            host_pages=4,
            prefix_cache=self.PREFIX,
            device_pages_per_tenant=16,
            pinned_device_share=0.25,
        )
        self.model: dict[int, tuple[Owner, list[int]]] = {}
        self.names: dict[tuple[str, str], list[int]] = {}

    def _add(self, owner: Owner, h: int, tokens: list[int]) -> tuple[Owner, int]:
        self.model[h] = (owner, list(tokens))
        return (owner, h)

    @rule(target=handles, owner=st.sampled_from(OWNERS))
    def create(self, owner):
        return self._add(owner, self.fs.create(owner), [])

    @rule(target=handles, owner=st.sampled_from(OWNERS), name=st.sampled_from(["p", "q"]))
    def create_named(self, owner, name):
        key = (owner.tenant, name)
        if key in self.names:
            return self.open_named(owner, name)
        h = self.fs.create(owner, name)
        self.names[key] = []
        return self._add(owner, h, [])

    def open_named(self, owner, name):
        # Readers get a private fork of the stored file.
        try:
            h = self.fs.open(owner, name, "r")
        except NoSpace:
            return self._add(owner, self.fs.create(owner), [])
        return self._add(owner, h, self.names[(owner.tenant, name)])

    @rule(
        target=handles,
        owner=st.sampled_from(OWNERS),
        head=st.sampled_from([[], [1, 2, 3, 4], [1, 2, 3, 4, 5, 6, 7, 8], [1, 2, 3, 4, 9, 9, 9, 9, 1, 2, 3, 4]]),
        tail=st.lists(st.integers(0, 9), min_size=1, max_size=6),
    )
    def create_and_first_pred(self, owner, head, tail):
        """What the scheduler does for a ``pred`` on a fresh file: map the cached whole-page
        prefix (a no-op with the cache off), compute the rest. Shared heads: many hits."""
        toks = head + tail
        h = self.fs.create(owner)
        ref = self._add(owner, h, [])
        mapped = self.fs.map_cached_prefix(owner, h, toks, len(toks) - 1)
        self.model[h][1].extend(toks[:mapped])
        self._append(ref, toks[mapped:], True)
        return ref

    @rule(target=handles, ref=handles)
    def fork(self, ref):
        owner, h = ref
        if h not in self.model:
            return ref
        try:
            child = self.fs.fork(owner, h)
        except NoSpace:  # the source was swapped out and cannot be reloaded now
            return ref
        return self._add(owner, child, self.model[h][1])

    @rule(ref=handles, toks=TOKENS, commit=st.booleans())
    def append(self, ref, toks, commit):
        self._append(ref, toks, commit)

    @rule(target=handles, ref=handles, a=TOKENS, b=TOKENS)
    def fork_then_both_append(self, ref, a, b):
        """The copy-on-write case: parent and child both write after sharing a partial page."""
        _, h = ref
        if h not in self.model:
            return ref
        child = self.fork(ref)
        self._append(child, a, True)
        self._append(ref, b, True)
        return child

    def _append(self, ref, toks, commit):
        owner, h = ref
        if h not in self.model:
            return
        try:
            plan = self.fs.plan_append(owner, h, toks)
        except (NoSpace, KVQuotaExceeded):
            return
        if not commit:
            self.fs.abort_append(plan)
            return
        self.io.run(plan)
        self.fs.commit_append(plan)
        self.model[h][1].extend(toks)
        self._sync_named(h)

    def _sync_named(self, h):
        file = self.fs._handles.get(self.model[h][0], h).file
        if file.name is not None:
            self.names[(file.tenant, file.name)] = list(self.model[h][1])

    @rule(ref=handles, data=st.data())
    def truncate(self, ref, data):
        owner, h = ref
        if h not in self.model:
            return
        n = data.draw(st.integers(0, len(self.model[h][1])))
        try:
            self.fs.truncate(owner, h, n)
        except NoSpace:
            return
        del self.model[h][1][n:]
        self._sync_named(h)

    @rule(target=handles, ref=handles, data=st.data())
    def extract(self, ref, data):
        owner, h = ref
        if h not in self.model:
            return ref
        toks = self.model[h][1]
        start = data.draw(st.integers(0, len(toks)))
        end = data.draw(st.integers(start, len(toks)))
        try:
            return self._add(owner, self.fs.extract(owner, h, start, end), toks[start:end])
        except NoSpace:
            return ref

    @rule(target=handles, a=handles, b=handles)
    def merge(self, a, b):
        if a[0] != b[0] or a[1] not in self.model or b[1] not in self.model:
            return a
        owner = a[0]
        try:
            merged = self.fs.merge(owner, a[1], b[1])
        except NoSpace:
            return a
        return self._add(owner, merged, self.model[a[1]][1] + self.model[b[1]][1])

    @rule(ref=consumes(handles))
    def close(self, ref):
        owner, h = ref
        if h in self.model:
            self.fs.close(owner, h)
            del self.model[h]

    @rule(owner=st.sampled_from(OWNERS), roll=st.integers(0, 3))
    def swap(self, owner, roll):
        # Swapping un-shares pages; doing it rarely leaves room for copy-on-write sequences.
        if roll:
            return
        self.fs.swap_out(owner)
        try:
            self.fs.swap_in(owner)
        except NoSpace:
            pass  # files stay on host; the next operation on them reloads

    @rule(tenant=st.sampled_from(["acme", "bravo"]), name=st.sampled_from(["p", "q"]))
    def evict(self, tenant, name):
        if (tenant, name) in self.names:
            try:
                self.fs.evict(tenant, name)
            except Busy:
                pass

    @precondition(lambda self: self.names)
    @rule(data=st.data(), pinned=st.booleans())
    def pin(self, data, pinned):
        key = data.draw(st.sampled_from(sorted(self.names)))
        before = self.fs._named[key].pinned
        try:
            self.fs.pin(*key, pinned)
        except KVQuotaExceeded:
            assert pinned and not before and not self.fs._named[key].pinned

    @precondition(lambda self: self.names)
    @rule(data=st.data())
    def remove(self, data):
        key = data.draw(st.sampled_from(sorted(self.names)))
        self.fs.remove(*key)
        del self.names[key]

    @invariant()
    def consistent(self):
        self.fs.check()
        for h, (owner, toks) in self.model.items():
            file = self.fs._handles.get(owner, h).file
            assert file.tokens == toks
            if file.residency == "device":
                assert self.io.kv_of(self.fs, owner, h) == expected_kv(toks[: file.computed])
        for (tenant, name), toks in self.names.items():
            assert self.fs._named[(tenant, name)].tokens == toks
        for tenant in ("acme", "bravo"):
            assert self.fs._pinned_pages(tenant) <= 23 // 4, tenant

    def teardown(self):
        for h, (owner, _) in list(self.model.items()):
            self.fs.close(owner, h)
        for key in list(self.names):
            self.fs.remove(*key)
        self.fs.check()
        stats = self.fs.stats()
        # Only pages the prefix cache alone holds are left (none with the cache off).
        assert stats.used_pages == stats.prefix_cached_pages and stats.host_pages == 0 and stats.open_handles == 0
        self._tmp.cleanup()


KVFSMachine.TestCase.settings = settings(
    max_examples=60, stateful_step_count=40, deadline=None, suppress_health_check=list(HealthCheck)
)
TestKVFSMachine = KVFSMachine.TestCase


class PrefixKVFSMachine(KVFSMachine):
    PREFIX = True


PrefixKVFSMachine.TestCase.settings = KVFSMachine.TestCase.settings
TestPrefixKVFSMachine = PrefixKVFSMachine.TestCase
