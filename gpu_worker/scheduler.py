"""Two-level scheduler (docs/ARCHITECTURE.md §6).

*LIP level*: pending ``pred`` calls wait in per-tenant queues; :class:`FairQueue` picks the
next batch by deficit round robin on tokens across tenants (weighted), decode calls first,
contended decode seats to the least-served tenant.
*Batch level*: one engine thread (the engine is not thread-safe) forms a batch of every
runnable call under the token budget, chunking long prefills, after waiting a bounded time
(a fraction of one forward) for a fuller batch; plans appends with KVFS, runs ``Engine.forward``,
commits or aborts, and completes each call's future. The asyncio loop never touches the engine.
A failed call's future carries a KVFS error or one of the :class:`PredError` kinds below, never a
wire code: the op layer maps them (``gpu_worker/ops/errors.py``).
"""

from __future__ import annotations

import collections
import concurrent.futures
import functools
import logging
import queue as stdlib_queue
import threading
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from gpu_worker.batch import Batch, SeqWork
from gpu_worker.config import SchedulerConfig
from gpu_worker.engine import cpu_threads
from gpu_worker.engine_clock import EngineClock
from gpu_worker.engine_timeline import EngineTimeline, ForwardRecord
from gpu_worker.kvfs import KVFS, AppendPlan, Busy, KVFSError, Owner
from gpu_worker.resource_model import Pool, PoolName
from gpu_worker.stop_strings import StopWatch
from gpu_worker.text_stream import TextStream
from gpu_worker.tracing import SessionTrace
from gpu_worker.usage import Usage

log = logging.getLogger(__name__)

#: An engine idle for longer than this between two forwards had no work; shorter gaps count
#: in ``Metrics.gap_s_total`` (time the program-driven loop costs a busy engine).
BUSY_GAP_S = 1.0


class PredError(Exception):
    """Why the scheduler failed a ``pred`` call; the op layer maps each kind to a wire code
    (``gpu_worker/ops/errors.py``). KVFS errors from planning a call fail it as they are."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class SessionEndedError(PredError):
    """The call's session ended while the call was queued (not ``protocol.SessionEnded``, the
    ``end_session`` reply)."""


class ShuttingDown(PredError):
    """The worker is stopping: no new call is taken, queued ones are failed."""


class ContextFull(PredError):
    """The call would take its KV file past the model's context length."""


class ForwardFailed(PredError):
    """The engine raised during the forward that carried the call."""


class PendingReleases:
    """Engine sequences whose KV files were released, dropped by the engine thread before its
    next forward. Made before both KVFS (whose ``on_release`` adds to it) and the scheduler
    (which drains it), so neither needs the other to exist first."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ids: list[str] = []

    def add(self, seq_id: str) -> None:
        with self._lock:
            self._ids.append(seq_id)

    def take(self) -> list[str]:
        with self._lock:
            ids, self._ids = self._ids, []
        return ids


class Forward(Protocol):
    def forward(self, batch: Batch) -> list[torch.Tensor]: ...

    def release(self, seq_id: str) -> None: ...

    def claim_forward_thread(self) -> None: ...


class SessionView(Protocol):
    """What the scheduler needs of a session (see sessions.WorkerSession)."""

    session_id: str
    tenant: str
    run_id: str
    owner: Owner
    weight: float
    swapped: bool
    #: The run's counters; the scheduler adds the forwards the session took part in.
    usage: Usage
    #: The run's trace; the scheduler adds the KV moves back to the device it makes.
    trace: SessionTrace

    @property
    def account(self) -> str:
        """The person behind the tenant: the per-step token budget is shared per account."""
        ...

    def on_tokens(self, n: int, prefill: bool | None = None) -> None: ...

    def on_cached_tokens(self, n: int) -> None: ...

    def unreserve_tokens(self, n: int) -> None: ...


@dataclass(eq=False)
class PredCall:
    """One ``pred``: append ``tokens`` to KV handle ``kv``; logits at caller offsets ``rows``."""

    session: SessionView
    kv: int
    tokens: tuple[int, ...]
    rows: tuple[int, ...]
    future: concurrent.futures.Future = field(default_factory=concurrent.futures.Future)
    enqueued: float = field(default_factory=time.monotonic)
    done: int = 0  # caller tokens already appended (chunked prefill)
    logits: dict[int, torch.Tensor] = field(default_factory=dict)
    started: float | None = None
    #: ``pred(..., then=...)``: turns each logits row into a token id on the engine thread, right
    #: after the forward, so the future carries token ids (see ``Scheduler._resolve``); what it
    #: raises fails the call as it is. Its second argument is the step (tokens chosen so far).
    choose: Callable[[torch.Tensor, int], int] | None = None
    #: Every chunk ran through a forward (its tokens were computed and metered).
    ran: bool = False
    #: ``pred(..., steps=k)``: tokens ``choose`` may pick, each appended by the next forward (the
    #: call goes back to the queue after each one, see ``Scheduler._next_step``); it ends early
    #: at a token of ``stop``. The future then carries every chosen token.
    steps: int = 1
    stop: frozenset[int] = frozenset()
    #: ``pred(..., stop_strings=...)``: the text of the chosen tokens, watched after each step;
    #: the call ends at the token that makes it contain one of them (``watch.matched``).
    watch: StopWatch | None = None
    #: Told each chosen token the call goes on past (engine thread; ``pred`` with ``stream``).
    on_token: Callable[[int], None] | None = None
    #: ``pred(..., send_text=...)``: the chosen tokens' text for the run's user (its ``watch``
    #: detokenises them), each delta handed to ``on_text`` on the engine thread to send.
    text_stream: TextStream | None = None
    on_text: Callable[[str], None] | None = None
    #: Tokens chosen so far by a multi-step call.
    chosen: list[int] = field(default_factory=list)
    #: Its session ended while it was in a forward: it takes no further step.
    cut: bool = False
    #: Tokens admitted against the session's budget for this call (``ops.pred.admit``), given
    #: back when it ends: its own tokens plus the ones its steps may append.
    reserved: int = 0
    #: For the run's trace (gpu_worker/tracing.py), written by the engine thread: the forwards
    #: the call rode in, their summed time, the call's share of it (its tokens over the
    #: forward's), the widest forward (calls in it), the tokens of all of them and of them the
    #: call's own (``batch_tokens - own_tokens`` are other calls' tokens it waited for: another
    #: tenant's long prefill shows as a ``pred`` whose batches were mostly not its own).
    forwards: int = 0
    forward_s: float = 0.0
    forward_share_s: float = 0.0
    batch_size: int = 0
    batch_tokens: int = 0
    own_tokens: int = 0

    @property
    def remaining(self) -> int:
        return len(self.tokens) - self.done

    @property
    def tenant(self) -> str:
        return self.session.tenant

    @property
    def account(self) -> str:
        return self.session.account


#: A prefill chunk bound that never binds (no tenant was left out of the forward).
UNBOUNDED = 2**62

#: A forward of at least this share of the token budget is a sample of the per-token cost (a
#: smaller one is mostly its fixed cost, and the difference would be noise).
PREFILL_SAMPLE_FRACTION = 1 / 32
#: The contended step is sized from the fastest of this many recent samples of each cost.
COST_SAMPLES = 32
#: A derived contended step (``Scheduler.contended_step_tokens``) as a share of the token budget:
#: before the forward cost is measured, and its floor once it is (a prompt still advances where
#: one token costs more than a decode-only forward).
CONTENDED_STEP_DEFAULT_FRACTION = 1 / 8
CONTENDED_STEP_FLOOR_FRACTION = 1 / 128


class FairQueue:
    """Per-tenant FIFO queues served by deficit round robin on tokens.

    Decode calls (one token left) go first; prefill calls share the remaining token budget by
    DRR: each round a backlogged tenant earns ``quantum * weight`` tokens of credit and spends
    it on (chunks of) its calls. A tenant whose queue empties loses its credit, as in classic
    DRR, so idle tenants cannot bank service.

    When more decode calls are queued than the batch has seats, seats go one at a time to the
    tenant that has been served the fewest tokens per unit of weight (a virtual token counter,
    as in VTC, Sheng et al., "Fairness in Serving Large Language Models", OSDI '24): a tenant
    decoding many short sequences is not crowded out by tenants whose seats also carry long
    prefills. A tenant coming back after ``idle_reset_s`` without queued calls starts at the
    lowest counter of the tenants queued now, so idling banks no priority either; one coming
    back to a worker nobody else is using restarts every counter at zero.

    A tenant seated for a prefill chunk while others' decodes are left out gets a chunk that
    takes its counter at most ``prefill_slack`` tokens above the lowest counter of the other
    contending tenants (``None``: no bound). Without it one chunk of a few hundred tokens lands
    in a forward whose other seats carry one token each: its tenant jumps that far ahead of the
    others at once (and that forward is slower for every tenant in it); with it, a contended
    prompt is served in small chunks over several forwards, the way VTC charges token by token.

    While another account has queued a call within ``idle_reset_s``, one account (all its
    tenants together) takes no more seats of a forward than the widest other such account
    (calls queued, or seats in its last forward), and at least ``contended_seats`` (``None``: no
    cap). Every tenant's next token waits for the forward in progress, and on CPU a forward
    costs about the same per sequence: a LIP with 64 threads of one-token calls otherwise filled
    every forward, and another tenant's small completion waited for 64 sequences at each of its
    steps (3.4x slower). Per account, because two tenants of one person 16 calls wide each
    otherwise justified each other's width and took 32 seats beside a 1-wide canary. Accounts of
    similar width still fill the batch together, and an account alone fills it.

    While more than one *account* (the person behind tenants: ``SessionView.account``) has
    queued a call within ``idle_reset_s``, the forward is *contended*: ``select`` is given a
    contended step budget and each account's prefill tokens in the forward are at most its fair
    share of it (``Pool.fair_share`` over the active accounts' weights; an account weighs as its
    heaviest active tenant, so creating tenants adds no weight). The rest of a long prompt stays
    queued with its position advanced. Without it hundreds of tokens of one account's long
    prompts rode in every forward another tenant's next token waited for (an 8-token call took
    11-15x its idle time); two tenants of one account share the one budget. The queues, DRR
    and decode seats stay per tenant; an account alone gets the whole step (work-conserving).
    """

    def __init__(
        self,
        quantum: int,
        idle_reset_s: float = 1.0,
        prefill_slack: float | None = None,
        contended_seats: int | None = None,
    ) -> None:
        self.quantum = quantum
        self.idle_reset_s = idle_reset_s
        self.prefill_slack = prefill_slack
        self.contended_seats = contended_seats
        #: Seats each tenant took in the last forward it was in (its width, for ``seat_caps``).
        self.last_seats: dict[str, int] = {}
        self.queues: collections.OrderedDict[str, collections.deque[PredCall]] = collections.OrderedDict()
        self.deficit: dict[str, float] = collections.defaultdict(float)
        #: Tokens served per unit of weight (the VTC counter, lifted on return from idle), the
        #: same without the lifts (what the tenant was actually given: stats), and when each
        #: tenant last had calls queued.
        self.served: dict[str, float] = {}
        self.charged: dict[str, float] = collections.defaultdict(float)
        self.last_queued: dict[str, float] = {}
        #: Each tenant's account and the weight of its last queued call (``active_accounts``).
        self.account_of: dict[str, str] = {}
        self.tenant_weight: dict[str, float] = {}

    def __len__(self) -> int:
        return sum(len(q) for q in self.queues.values())

    def push(self, call: PredCall, front: bool = False) -> None:
        tenant, now = call.tenant, time.monotonic()
        if tenant not in self.queues and now - self.last_queued.get(tenant, float("-inf")) > self.idle_reset_s:
            # Start at the lowest counter of the tenants being served now, including those whose
            # calls are all in the running forward (queued within ``idle_reset_s``), never at 0.
            recent = [
                self.served[t]
                for t in self.served
                if t != tenant and (t in self.queues or now - self.last_queued.get(t, 0.0) <= self.idle_reset_s)
            ]
            if not recent:
                # Nobody else is being served: every counter is history from a busy period that
                # has ended, and whatever a tenant got then, it got while the others did not ask.
                # All restart level; otherwise a tenant served alone at the end of the last busy
                # period keeps its lead and loses every contended seat in the next (B7's mix).
                self.served.clear()
            self.served[tenant] = max(self.served.get(tenant, 0.0), min(recent, default=0.0))
        self.last_queued[tenant] = now
        self.account_of[tenant] = call.account
        self.tenant_weight[tenant] = self._weight(call)
        queue = self.queues.setdefault(tenant, collections.deque())
        if front:
            queue.appendleft(call)
        else:
            queue.append(call)

    def remove_if(self, pred: Callable[[PredCall], bool]) -> list[PredCall]:
        removed: list[PredCall] = []
        for tenant, queue in list(self.queues.items()):
            keep = collections.deque(c for c in queue if not pred(c))
            removed.extend(c for c in queue if pred(c))
            self.queues[tenant] = keep
        self._drop_empty()
        return removed

    def _drop_empty(self) -> None:
        now = time.monotonic()
        for tenant in [t for t, q in self.queues.items() if not q]:
            del self.queues[tenant]
            self.deficit.pop(tenant, None)
            self.last_queued[tenant] = now
        # Forget long-idle tenants. Every tenant ever queued has a ``last_queued`` entry, also
        # after an idle worker cleared ``served``: walk that, so ``charged`` is forgotten too.
        if len(self.last_queued) > 2 * len(self.queues) + 64:
            for tenant in [t for t in self.last_queued if t not in self.queues]:
                if now - self.last_queued[tenant] > 60 * self.idle_reset_s:
                    del self.last_queued[tenant]
                    self.last_seats.pop(tenant, None)
                    self.served.pop(tenant, None)
                    self.charged.pop(tenant, None)
                    self.account_of.pop(tenant, None)
                    self.tenant_weight.pop(tenant, None)

    @staticmethod
    def _weight(call: PredCall) -> float:
        """The session's scheduling weight, floored so a zero weight cannot divide by zero."""
        return max(call.session.weight, 0.01)

    def _charge(self, call: PredCall, tokens: int) -> None:
        weighted = tokens / self._weight(call)
        self.served[call.tenant] = self.served.get(call.tenant, 0.0) + weighted
        self.charged[call.tenant] += weighted

    def _decode_seats(
        self, tenants: list[str], seats: int, skip: Callable[[PredCall], bool], caps: dict[str, int] | None = None
    ) -> tuple[list[PredCall], dict[str, int]]:
        """The decode calls to run, and the tenants given a seat for a prefill chunk, each with
        the most prefill tokens it may take in this forward (see ``prefill_slack``).

        All decodes run if they fit. Otherwise seats go one at a time to the least-served tenant
        (lowest virtual token counter, as in VTC): a decode seat adds one token to its counter;
        a tenant with only prefill calls runnable takes one seat for its chunk (the DRR pass
        fills it) and leaves the contest, since the chunk will raise its counter far more.
        Without that seat, decodes that fill every seat would starve a least-served tenant whose
        only runnable call is its prompt (as in B7's mix of tenants)."""
        decodes = {t: [c for c in self.queues[t] if c.remaining == 1 and not skip(c)] for t in tenants}
        for account, cap in (caps or {}).items():
            mine = [t for t in tenants if self.account_of.get(t, t) == account]
            self._cap_account_decodes(mine, decodes, cap, skip)
        if sum(len(v) for v in decodes.values()) <= seats:
            return [c for t in tenants for c in decodes[t]], {}
        prefill_only = {
            t for t in tenants if not decodes[t] and any(c.remaining > 1 and not skip(c) for c in self.queues[t])
        }
        counters = {t: self.served.get(t, 0.0) for t in tenants if decodes[t] or t in prefill_only}
        rank = {t: i for i, t in enumerate(tenants)}  # ties go in rotation order
        chosen: list[PredCall] = []
        reserved: list[str] = []
        while len(chosen) + len(reserved) < seats and counters:
            tenant = min(counters, key=lambda t: (counters[t], rank[t]))
            if tenant in prefill_only:
                reserved.append(tenant)
                del counters[tenant]
                continue
            call = decodes[tenant].pop(0)
            chosen.append(call)
            counters[tenant] += 1 / self._weight(call)
            if not decodes[tenant]:
                del counters[tenant]
        # ``counters`` now holds the tenants left with runnable calls unseated, at their
        # counters after this forward's seats: a seated prefill is bounded against them.
        return chosen, {t: self._contended_chunk(t, counters) for t in reserved}

    def _cap_account_decodes(
        self, tenants: list[str], decodes: dict[str, list[PredCall]], cap: int, skip: Callable[[PredCall], bool]
    ) -> None:
        """Cut the decode calls of one account's ``tenants`` to its ``cap`` of seats, less the
        seats its oldest runnable calls need for prefill chunks, taken one per tenant in turn so
        the account's tenants share its seats. Which kind gets the seats goes by age (the
        ``cap`` oldest runnable calls of the account): decodes first would starve the account's
        own prompts while it has ``cap`` decodes queued (16 threads of one-token calls beside a
        long prompt, capped at one seat, never ran the prompt)."""
        runnable = [c for t in tenants for c in self.queues[t] if not skip(c)]
        if len(runnable) <= cap:
            return
        oldest = sorted(runnable, key=lambda c: c.enqueued)[:cap]
        left = cap - sum(1 for c in oldest if c.remaining > 1)
        kept = dict.fromkeys(tenants, 0)
        while left > 0:
            before = left
            for t in tenants:
                if left > 0 and kept[t] < len(decodes[t]):
                    kept[t] += 1
                    left -= 1
            if left == before:
                break
        for t in tenants:
            del decodes[t][kept[t] :]

    def _contended_chunk(self, tenant: str, left_out: dict[str, float]) -> int:
        """Most prefill tokens ``tenant`` may take in this forward: enough to bring its counter
        to ``prefill_slack`` above the lowest counter of the tenants left out, at least one."""
        if self.prefill_slack is None or not left_out:
            return UNBOUNDED
        weight = self._weight(self.queues[tenant][0])
        room = (min(left_out.values()) + self.prefill_slack - self.served.get(tenant, 0.0)) * weight
        return max(1, int(room))

    def active_accounts(self) -> dict[str, float]:
        """Accounts with a call queued now or within ``idle_reset_s`` (whose next call may be a
        round trip away while its last one is in the forward), each with its weight: the
        heaviest of its active tenants."""
        recent = time.monotonic() - self.idle_reset_s
        weights: dict[str, float] = {}
        for tenant, at in self.last_queued.items():
            if (at >= recent or tenant in self.queues) and tenant in self.account_of:
                account = self.account_of[tenant]
                weights[account] = max(weights.get(account, 0.0), self.tenant_weight[tenant])
        return weights

    def contended(self) -> bool:
        """Whether more than one account is active (see ``active_accounts``)."""
        return len(self.active_accounts()) > 1

    def account_prefill_room(self, budget: int, step_tokens: int | None) -> dict[str, int]:
        """Most prefill tokens each active account may take in the next forward: its fair share
        of the contended step (``step_tokens``, at most ``budget``) while the forward is
        contended; empty (no bound beyond ``budget``) when one account is alone or
        ``step_tokens`` is ``None``."""
        accounts = self.active_accounts()
        if step_tokens is None or len(accounts) < 2:
            return {}
        step = Pool(PoolName.ENGINE_TOKENS_PER_STEP, max(1, min(budget, step_tokens)))
        total = sum(accounts.values())
        return {account: step.fair_share(weight, total) for account, weight in accounts.items()}

    def oldest(self) -> float | None:
        heads = [q[0].enqueued for q in self.queues.values() if q]
        return min(heads) if heads else None

    def queued_tokens(self) -> int:
        return sum(c.remaining for q in self.queues.values() for c in q)

    def seat_caps(self, tenants: list[str]) -> dict[str, int]:
        """Most seats each *account* of ``tenants`` may take in the next forward, all its tenants
        together (see ``contended_seats``): the widest other active account's width, at least
        ``contended_seats``. Per account, so one person's tenants cannot justify each other's
        width: two tenants of one account, 16 calls wide each, otherwise took 32 seats of every
        forward beside a 1-wide tenant of another account."""
        if self.contended_seats is None:
            return {}
        recent = time.monotonic() - self.idle_reset_s
        active = {t for t, at in self.last_queued.items() if at >= recent} | set(tenants)
        # A tenant's width: calls queued now, or seats it took in its last forward (its next
        # calls may not be back yet); an account's: its active tenants' together.
        width: dict[str, int] = collections.defaultdict(int)
        for t in active:
            width[self.account_of.get(t, t)] += max(len(self.queues.get(t, ())), self.last_seats.get(t, 0))
        caps = {}
        for account in {self.account_of.get(t, t) for t in tenants}:
            others = [w for a, w in width.items() if a != account]
            if others:
                caps[account] = max(self.contended_seats, max(others))
        return caps

    def _queued_per_account(self) -> dict[str, int]:
        queued: dict[str, int] = collections.defaultdict(int)
        for tenant, q in self.queues.items():
            queued[self.account_of.get(tenant, tenant)] += len(q)
        return queued

    def seatable(self, max_seqs: int) -> int:
        """How many queued calls the next forward could seat (each account up to its cap)."""
        caps = self.seat_caps(list(self.queues))
        return sum(min(n, caps.get(a, max_seqs)) for a, n in self._queued_per_account().items())

    def capped_backlog(self) -> bool:
        """Whether an account has more calls queued than its cap lets into the next forward."""
        caps = self.seat_caps(list(self.queues))
        queued = self._queued_per_account()
        return any(queued[a] > cap for a, cap in caps.items())

    def select(
        self, budget: int, max_seqs: int, skip: Callable[[PredCall], bool], step_tokens: int | None = None
    ) -> list[tuple[PredCall, int]]:
        """Remove and return ``(call, n_tokens)`` pairs for one batch; the caller re-queues
        leftovers. ``step_tokens``: the contended step budget (see the class docstring)."""
        picked: list[tuple[PredCall, int]] = []
        taken: set[int] = set()
        room = self.account_prefill_room(budget, step_tokens)
        tenants = list(self.queues)
        caps = self.seat_caps(tenants)
        seats_left = {self.account_of.get(t, t): caps.get(self.account_of.get(t, t), max_seqs) for t in tenants}
        seats_taken: dict[str, int] = collections.defaultdict(int)

        def seatless(c: PredCall) -> bool:
            return skip(c) or seats_left[c.account] <= 0

        # Decode first: latency-bound, one token each.
        decode_calls, prefill_seats = self._decode_seats(tenants, min(max_seqs, budget), skip, caps)
        # Tenants given a prefill seat go first in the DRR pass, so another tenant's prefill
        # cannot take their seat.
        tenants = list(prefill_seats) + [t for t in tenants if t not in prefill_seats]
        for call in decode_calls:
            picked.append((call, 1))
            taken.add(id(call))
            seats_left[call.account] -= 1
            seats_taken[call.tenant] += 1
            budget -= 1
            self.deficit[call.tenant] -= 1
            self._charge(call, 1)
        # Prefill by DRR. A prompt of the only tenant with prefill waiting goes whole when the
        # forward holds it (``whole``): chunking it shares the forward with nobody, and each
        # chunk pays the model's fixed cost again (on CPU, streaming the weights once more; a
        # 542-token prompt took three forwards). A longer prompt is still served a quantum a
        # round: each forward of a long prefill stays short for a tenant whose first call
        # arrives meanwhile (no contended step bounds the forward it waits for).
        whole = len([t for t in tenants if any(id(c) not in taken and not seatless(c) for c in self.queues[t])]) == 1
        progress = True
        while budget > 0 and len(picked) < max_seqs and progress:
            progress = False
            for tenant in tenants:
                waiting = [c for c in self.queues[tenant] if id(c) not in taken and not seatless(c)]
                if not waiting or room.get(waiting[0].account, 1) <= 0:
                    continue  # an account that spent its room banks no credit either
                self.deficit[tenant] += self.quantum * self._weight(waiting[0])
                for call in waiting:
                    fits = min(budget, prefill_seats.get(tenant, UNBOUNDED), room.get(call.account, UNBOUNDED))
                    n = min(call.remaining, fits, int(self.deficit[tenant]))
                    if whole and call.remaining <= fits:
                        n = call.remaining
                    if n <= 0 or len(picked) >= max_seqs or seats_left[call.account] <= 0:
                        break
                    picked.append((call, n))
                    taken.add(id(call))
                    seats_left[call.account] -= 1
                    seats_taken[tenant] += 1
                    budget -= n
                    self.deficit[tenant] -= n
                    if call.account in room:
                        room[call.account] -= n
                    if tenant in prefill_seats:
                        prefill_seats[tenant] -= n
                    self._charge(call, n)
                    progress = True
                    if n < call.remaining:
                        break
        for tenant in tenants:
            if self.contended_seats is not None:
                self.last_seats[tenant] = seats_taken[tenant]
            self.queues[tenant] = collections.deque(c for c in self.queues[tenant] if id(c) not in taken)
            if not self.queues[tenant]:
                self.deficit[tenant] = 0.0
        self._drop_empty()
        # Rotate so the next batch starts with another tenant.
        if self.queues:
            self.queues.move_to_end(next(iter(self.queues)))
        return picked


@dataclass
class Metrics:
    """Scheduler counters exposed by ``stats`` and ``health``."""

    forwards: int = 0
    items: int = 0
    tokens: int = 0
    multi_session_forwards: int = 0
    max_sessions_in_forward: int = 0
    forward_s_total: float = 0.0
    forward_s_ema: float = 0.0
    #: The longest forward: a call queued just after it started waited at least this long.
    forward_s_max: float = 0.0
    queue_wait_s_total: float = 0.0
    queue_wait_s_max: float = 0.0
    #: Engine idle time between back-to-back forwards (gaps under ``BUSY_GAP_S``; longer ones
    #: are a lack of work): the LIPs' round trip plus the scheduler's own time, which on a busy
    #: worker is throughput lost to the program-driven loop.
    gap_s_total: float = 0.0
    gaps: int = 0
    #: The engine thread's own time around each forward, the parts of the gap that are not the
    #: programs' round trip nor the batch wait: from the end of the batch wait to the forward's
    #: start (engine tasks, selection, KVFS planning, inputs) and from the forward's end to its
    #: calls settled (commits, copies to host, picking tokens, re-queueing steps).
    plan_s_total: float = 0.0
    results_s_total: float = 0.0
    #: The longest wait of a one-token (decode) call. Prefills can wait behind each other by
    #: design (a token budget per forward); a long decode wait means a starved sequence.
    queue_wait_s_max_decode: float = 0.0
    calls: int = 0
    failed_calls: int = 0
    #: Cumulative over the worker's life, like every counter here, so these two per-tenant maps
    #: keep one entry per tenant the worker has served. Tenants come from the control plane
    #: (sessions are created on the admin socket, never by a LIP), so they are bounded by the
    #: tenants of the service, not by runs; the fair-share state (``FairQueue``) does forget
    #: idle tenants, because it would otherwise hold their old service against them.
    tokens_per_tenant: dict[str, int] = field(default_factory=lambda: collections.defaultdict(int))
    #: Why each batch stopped waiting for more calls (see ``Scheduler._wait_for_fuller_batch``):
    #: an operator reading "bound" most of the time knows batches launch part-full.
    launch_reasons: collections.Counter[str] = field(default_factory=collections.Counter)
    #: Forwards that left runnable calls queued because the batch hit ``max_num_seqs`` /
    #: ``max_num_batched_tokens``: demand above the cap, not a scheduling gap.
    forwards_seq_capped: int = 0
    forwards_token_capped: int = 0
    #: Per tenant: forwards that left some of its runnable calls queued. A tenant that is
    #: never passed over got all it asked for (its share is limited by its own demand).
    passed_over_per_tenant: dict[str, int] = field(default_factory=lambda: collections.defaultdict(int))
    #: Prompt tokens mapped from the prefix cache instead of computed (gpu_worker/kvfs/prefix.py).
    prefix_cached_tokens: int = 0
    #: Measured forward cost (moving averages, shown in stats): a forward whose every item is
    #: one token, and the time each token adds above it in forwards of at least
    #: ``PREFILL_SAMPLE_FRACTION`` of the token budget.
    decode_forward_s_ema: float = 0.0
    token_s_ema: float = 0.0
    #: The same costs' recent samples, what ``contended_step_tokens`` sizes from (their low
    #: end: ``decode_floor``, ``token_cost``). A forward is only ever slowed by what shares the
    #: machine with it, so the fastest recent samples are the cost itself; the averages swung
    #: 14-134 us a token and 4-18 ms a decode forward under the account soak's load, and the
    #: step with them from 35 to 784 tokens (a 3,800-token prompt then took 293 forwards).
    decode_forward_samples: collections.deque[float] = field(
        default_factory=lambda: collections.deque(maxlen=COST_SAMPLES)
    )
    #: Large forwards as (tokens, seconds), priced per token only when read (``token_cost``),
    #: against the decode floor *then*: priced when recorded, a prompt chunk measured against
    #: the first, slow decode forwards of a new worker came out at a few microseconds a token,
    #: and that stale minimum grew the step to 500-680 tokens (a contended forward then lasted
    #: about four decode forwards, not two).
    prefill_samples: collections.deque[tuple[int, float]] = field(
        default_factory=lambda: collections.deque(maxlen=COST_SAMPLES)
    )
    #: Per tenant: seconds its settled calls spent in the worker from queued to settled (queue
    #: waits plus the forwards they rode in), and the forwards they rode in. Read against the
    #: tenant's end-to-end time, they say how much of it the engine took.
    pred_s_per_tenant: dict[str, float] = field(default_factory=lambda: collections.defaultdict(float))
    forwards_per_tenant: dict[str, int] = field(default_factory=lambda: collections.defaultdict(int))

    def decode_floor(self) -> float:
        """The fastest recent decode-only forward, in seconds (0: none yet)."""
        return min(self.decode_forward_samples, default=0.0)

    def token_cost(self) -> float:
        """The time a prompt token adds above the decode floor, in seconds (0: not measured
        yet): the first quartile of the recent large forwards' prices. Not their minimum, as
        for the decode floor: a price is a difference over a count, and its minimum was the
        one cheap outlier (a 2,008-token chunk at its fastest gave 6 us where most gave 10-17,
        and the step 290 tokens where the others gave 100-150); the quartile still ignores the
        forwards slowed by what shared the machine with them."""
        floor = self.decode_floor()
        if floor <= 0:
            return 0.0
        costs = sorted((elapsed - floor) / tokens for tokens, elapsed in self.prefill_samples if elapsed > floor)
        return costs[len(costs) // 4] if costs else 0.0

    def to_dict(self, max_num_batched_tokens: int) -> dict[str, Any]:
        f = max(self.forwards, 1)
        return {
            "forwards": self.forwards,
            "items": self.items,
            "tokens": self.tokens,
            "calls": self.calls,
            "failed_calls": self.failed_calls,
            "multi_session_forwards": self.multi_session_forwards,
            "max_sessions_in_forward": self.max_sessions_in_forward,
            "avg_items_per_forward": self.items / f,
            "batch_occupancy": self.tokens / (f * max_num_batched_tokens),
            "forward_ms_avg": 1000 * self.forward_s_total / f,
            "forward_ms_ema": 1000 * self.forward_s_ema,
            "forward_ms_max": 1000 * self.forward_s_max,
            "queue_wait_ms_avg": 1000 * self.queue_wait_s_total / max(self.calls, 1),
            "queue_wait_ms_max": 1000 * self.queue_wait_s_max,
            "queue_wait_ms_max_decode": 1000 * self.queue_wait_s_max_decode,
            "gap_ms_avg": 1000 * self.gap_s_total / max(self.gaps, 1),
            "plan_ms_avg": 1000 * self.plan_s_total / f,
            "results_ms_avg": 1000 * self.results_s_total / f,
            "tokens_per_tenant": dict(self.tokens_per_tenant),
            "launch_reasons": dict(self.launch_reasons),
            "forwards_seq_capped": self.forwards_seq_capped,
            "forwards_token_capped": self.forwards_token_capped,
            "passed_over_per_tenant": dict(self.passed_over_per_tenant),
            "prefix_cached_tokens": self.prefix_cached_tokens,
            "decode_forward_ms_ema": 1000 * self.decode_forward_s_ema,
            "token_us_ema": 1e6 * self.token_s_ema,
            "decode_forward_ms_floor": 1000 * self.decode_floor(),
            "token_us_floor": 1e6 * self.token_cost(),
            "pred_s_per_tenant": {t: round(v, 4) for t, v in self.pred_s_per_tenant.items()},
            "forwards_per_tenant": dict(self.forwards_per_tenant),
        }


class EngineThread:
    """One daemon thread that runs the functions given to :meth:`submit` in order.

    The worker builds the engine here and the scheduler's loop then runs here for good: vLLM's
    CPU backend sets up its threads for the thread that builds the engine. Daemon, unlike a
    ``ThreadPoolExecutor``'s thread, so a worker that fails mid-start still exits."""

    def __init__(self, name: str = "engine") -> None:
        self._calls: stdlib_queue.SimpleQueue[tuple[Callable[[], Any], concurrent.futures.Future]] = (
            stdlib_queue.SimpleQueue()
        )
        threading.Thread(target=self._run, name=name, daemon=True).start()

    def submit(self, fn: Callable[..., Any], *args: Any) -> concurrent.futures.Future:
        fut: concurrent.futures.Future = concurrent.futures.Future()
        self._calls.put((functools.partial(fn, *args), fut))
        return fut

    def _run(self) -> None:
        while True:
            run_task(*self._calls.get())


def run_task(fn: Callable[[], Any], fut: concurrent.futures.Future) -> None:
    """Run ``fn`` for ``fut``'s waiter, its result or exception handed over; skipped when the
    waiter went away first (cancelled: ``asyncio.wrap_future`` cancels with its coroutine), as
    settling a cancelled future raises, and on the engine thread would end its loop."""
    if fut.set_running_or_notify_cancel():
        try:
            fut.set_result(fn())
        except BaseException as exc:  # handed to whoever waits on the future
            fut.set_exception(exc)


class Scheduler:
    """Owns the engine thread; everything that runs ``forward`` goes through here."""

    def __init__(
        self,
        engine: Forward,
        kvfs: KVFS,
        config: SchedulerConfig,
        max_model_len: int,
        engine_thread: EngineThread | None = None,
        releases: PendingReleases | None = None,
        active_sessions: Callable[[], Collection[str]] = lambda: (),
        timeline: EngineTimeline | None = None,
    ) -> None:
        """``engine_thread``: where to run the loop, the thread that built the engine (vLLM's
        CPU backend runs forwards 20-25% faster there); ``None`` starts a thread of its own.
        ``releases``: what KVFS's ``on_release`` collects (``None``: a queue of its own).
        ``active_sessions``: ids of the sessions currently able to issue a pred (connected, not
        blocked in brokered I/O, not ended): a session of the last forward that went into I/O
        or ended is not waited for. ``timeline``: where each forward is recorded (None: a ring
        of its own, ``protocol.MAX_TIMELINE_FORWARDS`` long)."""
        self.engine = engine
        self.timeline = timeline if timeline is not None else EngineTimeline()
        self.kvfs = kvfs
        self.config = config
        self.max_model_len = max_model_len
        self.queue = FairQueue(
            config.drr_quantum,
            prefill_slack=config.contended_prefill_slack,
            contended_seats=config.contended_seats_per_tenant,
        )
        self.metrics = Metrics()
        #: The engine's wall time split into busy / idle with work queued / idle and empty
        #: (``stats``); every transition is made with ``_cond`` held.
        self.clock = EngineClock()
        self._cond = threading.Condition()
        self._tasks: collections.deque[tuple[Callable[[], Any], concurrent.futures.Future]] = collections.deque()
        self.releases = releases if releases is not None else PendingReleases()
        self._running: list[PredCall] = []
        #: The sessions of the last forward and their "width" (calls they had in it plus calls
        #: they queued during it): what the next batch's bounded wait expects back.
        self._width: dict[str, int] = {}
        #: When the last forward ended (``time.monotonic``): the start of a batch's bounded wait.
        self._engine_free_since = 0.0
        #: When the engine thread stopped waiting and began to form the next batch.
        self._plan_began = 0.0
        self._stop = False
        self.active_sessions = active_sessions
        self._engine_thread = engine_thread
        self._loop_done: concurrent.futures.Future | None = None

    def alive(self) -> bool:
        return self._loop_done is not None and not self._loop_done.done() and not self._stop

    def start(self) -> None:
        self._loop_done = (self._engine_thread or EngineThread()).submit(self._loop)

    def stop(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        if self._loop_done is not None:
            concurrent.futures.wait([self._loop_done], timeout=30)

    # -------------------------------------------------------------- called from other threads
    def submit(self, call: PredCall) -> concurrent.futures.Future:
        """Queue ``call``; wake the engine thread only when that can launch a batch.

        The engine waits for work, then for the batch to fill (``_wait_for_fuller_batch``). The
        caller (the event loop) checks whether the batch is ready and wakes the engine only for
        the first call and for the one that fills the batch: woken for every call, the engine
        would re-check the batch 32 times in the gap of a 32-wide forward, taking the GIL from
        the loop that is relaying those very calls."""
        with self._cond:
            if self._stop:
                raise ShuttingDown("worker is shutting down")
            idle = not len(self.queue)
            self.queue.push(call)
            self.clock.work_arrived()
            if idle or self._batch_ready() is not None:
                self._cond.notify_all()
        return call.future

    def run_on_engine(self, fn: Callable[[], Any]) -> concurrent.futures.Future:
        """Run ``fn`` on the engine thread between forwards (page moves, swaps)."""
        fut: concurrent.futures.Future = concurrent.futures.Future()
        with self._cond:
            self._tasks.append((fn, fut))
            self._cond.notify_all()
        return fut

    def cancel_session(self, session_id: str) -> int:
        """Fail the session's queued calls; returns how many. Running calls finish their forward
        normally and a multi-step one among them takes no further step."""
        with self._cond:
            removed = self.queue.remove_if(lambda c: c.session.session_id == session_id)
            self._width.pop(session_id, None)
            for call in self._running:
                if call.session.session_id == session_id:
                    call.cut = True
        for call in removed:
            self._fail(call, SessionEndedError("session ended"))
        return len(removed)

    def session_busy(self, session_id: str) -> bool:
        with self._cond:
            return any(c.session.session_id == session_id for c in self._running)

    def snapshot(self) -> dict[str, Any]:
        with self._cond:
            out = self.metrics.to_dict(self.config.max_num_batched_tokens)
            out["queued_calls"] = len(self.queue)
            out["queued_tokens"] = self.queue.queued_tokens()
            # Per tenant: calls waiting now, tokens scheduled per unit of weight (counted when a
            # batch is picked, as ``passed_over_per_tenant`` is), and the virtual token counter
            # the contended-seat rule compares (the same plus the lifts on return from idle).
            out["queued_calls_per_tenant"] = {t: len(q) for t, q in self.queue.queues.items()}
            out["served_per_tenant"] = {t: round(v, 3) for t, v in self.queue.charged.items()}
            out["vtc_counter_per_tenant"] = {t: round(v, 3) for t, v in self.queue.served.items()}
            out["active_accounts"] = len(self.queue.active_accounts())
            out["contended_step_tokens"] = self.contended_step_tokens()
            out.update(self.clock.to_dict())
        return out

    # -------------------------------------------------------------------- engine thread
    def _loop(self) -> None:
        self.engine.claim_forward_thread()
        while True:
            with self._cond:
                while not self._stop and not self._tasks and not len(self.queue):
                    self.clock.to("empty")
                    self._cond.wait()
                if self._stop:
                    break
                reason = self._wait_for_fuller_batch()
                if reason:
                    self.metrics.launch_reasons[reason] += 1
                self._plan_began = time.monotonic()
                tasks = list(self._tasks)
                self._tasks.clear()
                releases = self.releases.take()
            for seq_id in releases:
                self.engine.release(seq_id)
            for fn, fut in tasks:
                run_task(fn, fut)
            with self._cond:
                self.queue.remove_if(lambda c: c.future.done())
                picked = self.queue.select(
                    self.config.max_num_batched_tokens,
                    self.config.max_num_seqs,
                    skip=lambda c: c.future.done(),
                    step_tokens=self.contended_step_tokens(),
                )
                if not picked and not len(self.queue):
                    self.clock.to("empty")
                if picked and len(self.queue):  # ``select`` removed what it picked
                    for tenant in self.queue.queues:
                        self.metrics.passed_over_per_tenant[tenant] += 1
                    if len(picked) >= self.config.max_num_seqs:
                        self.metrics.forwards_seq_capped += 1
                    elif sum(n for _, n in picked) >= self.config.max_num_batched_tokens:
                        self.metrics.forwards_token_capped += 1
            if picked:
                self._run_batch(picked)
        with self._cond:
            leftover = self.queue.remove_if(lambda c: True)
        for call in leftover:
            self._fail(call, ShuttingDown("worker is shutting down"))

    def _wait_for_fuller_batch(self) -> str | None:
        """Bounded wait while the batch could grow: ``batch_wait_fraction`` of a forward's time,
        at most ``max_batch_wait_s``.

        Proportional because the cost of waiting is relative: holding a 200 ms CPU forward for
        50 ms to fill it from 8 to 16 items pays, holding a 10 ms GPU forward for 50 ms does not.
        Returns why it stopped waiting (``None``: nothing queued), counted in the metrics."""
        if self._tasks:
            return "engine_task"
        wait = self.config.batch_wait_fraction * self.metrics.forward_s_ema
        if self.queue.capped_backlog():
            # A capped tenant's backlog would otherwise start a forward while a narrower
            # tenant's next call is a sandbox round trip away, and that call would wait it out:
            # wait up to a forward for the last forward's sessions (at the backlog's expense).
            wait = max(wait, self.metrics.forward_s_ema)
        bound = min(self.config.max_batch_wait_s, max(wait, 0.001))
        oldest = self.queue.oldest()
        if oldest is None:
            return None
        # The wait counts from when the engine became free, not from the oldest call's arrival:
        # calls queued during the previous forward could not have run earlier anyway, and
        # counting their time in the queue would launch at once, splitting a LIP's width into
        # alternating part-full forwards.
        oldest = max(oldest, self._engine_free_since)
        began = time.monotonic()
        try:
            while not self._stop:
                ready = self._batch_ready()
                if ready is not None:
                    return ready
                left = oldest + bound - time.monotonic()
                if left <= 0:
                    return "bound"
                self._cond.wait(left)
            return "stopping"
        finally:
            self.clock.waited_for_batch(time.monotonic() - began)

    def _batch_ready(self) -> str | None:
        """Why the queued batch should launch now without waiting out its bound, or ``None``.
        Called with ``_cond`` held."""
        # A batch that is already full cannot grow: waiting would only delay it. Not while
        # accounts contend: one account's backlog is capped at its share of the step, and
        # launching on it would leave out the other account's next call, a round trip away.
        if self.queue.queued_tokens() >= self.config.max_num_batched_tokens and not self.queue.contended():
            return "tokens_full"
        # Counted within the seat caps: a capped flood's backlog does not make a batch full.
        if self.queue.seatable(self.config.max_num_seqs) >= self.config.max_num_seqs:
            return "seqs_full"
        if self._every_session_ready():
            return "all_ready"
        return None

    def _every_session_ready(self) -> bool:
        """Every session of the last forward that can still send has queued its width again.

        A LIP with N threads decodes N sequences: launching when its first call arrives would
        split its width over several part-full forwards. Only the last forward's sessions are
        waited for: a connected session that sent nothing for a whole forward (idle, or new and
        still starting its sandbox) joins when its call comes and holds nobody back. A session
        whose width shrank or that stopped sending costs one bounded wait."""
        queued = collections.Counter(c.session.session_id for q in self.queue.queues.values() for c in q)
        active = set(self.active_sessions())
        return all(queued[sid] >= n for sid, n in self._width.items() if sid in active)

    def _resolve(self, call: PredCall) -> object:
        """A finished call's result (an error to raise, or a value): its logits rows, or the
        token ids its ``choose`` picks.

        Why on the engine thread: the next forward waits for every caller's next token, so the
        time to pick it is on the critical path; on the event loop the rows of one forward would
        be sampled one after another between replies. All calls of a forward are picked first
        and settled together after (``_run_batch``): settling each as it is picked makes the loop
        and this thread trade the GIL per call (measured with B3, batch 32: the engine's gap
        between forwards 9.1 ms this way against 9.9 ms; batch 8: 3.3 against 3.5 ms)."""
        call.ran = True
        rows = [call.logits[r] for r in call.rows]
        if call.choose is None:
            value: list[Any] = rows
        else:
            try:
                value = [call.choose(row, len(call.chosen)) for row in rows]
            except Exception as exc:  # the LIP's choice failed (e.g. a mask that leaves no token)
                return exc
        return value

    @staticmethod
    def _settle(call: PredCall, value: object) -> None:
        try:
            if isinstance(value, BaseException):
                call.future.set_exception(value)
            else:
                call.future.set_result(value)
        except concurrent.futures.InvalidStateError:
            pass  # the waiter gave up (deadline) and cancelled it

    def _fail(self, call: PredCall, error: BaseException) -> None:
        self.metrics.failed_calls += 1
        self._settle(call, error)

    def _fail_or_end(self, call: PredCall, error: BaseException) -> None:
        """A call whose next chunk cannot run. A multi-step call past its first step ends with
        the tokens it chose (the last one is not in the file, as always; the caller's next call
        appends it and meets ``error`` then); any other call fails with ``error``."""
        if call.chosen:
            self.metrics.calls += 1
            self._settle(call, list(call.chosen))
        else:
            self._fail(call, error)

    def _next_step(self, call: PredCall, result: object) -> bool:
        """After a multi-step call's forward: note the token it chose and, unless that ends the
        call, put it back in the queue to append that token (``True``). Otherwise its result
        becomes every token it chose. Why in the worker: each step would otherwise be a round
        trip to the program between two forwards, and the batch waits for the slowest one. A
        call watching stop strings comes here after every forward, its one-step calls too."""
        if isinstance(result, BaseException) or call.future.done():
            return False
        assert isinstance(result, list)
        token = int(result[0])
        call.chosen.append(token)
        watch = call.watch
        stopped = False
        if watch is not None:
            text = watch.feed(token)
            stopped = watch.matched is not None
            stream = call.text_stream
            if stream is not None and token not in call.stop:
                delta = stream.take(text, stopped)
                if delta and call.on_text is not None:
                    call.on_text(delta)
        if len(call.chosen) >= call.steps or token in call.stop or stopped or call.cut:
            result[:] = call.chosen
            return False
        if call.on_token is not None:
            call.on_token(token)
        # The tokens this forward appended are metered now (``on_tokens``): they leave the
        # call's reservation, or a long decode would count them twice against the budget.
        metered = min(len(call.tokens), call.reserved)
        if metered:
            call.session.unreserve_tokens(metered)
            call.reserved -= metered
        call.tokens, call.rows, call.done = (token,), (0,), 0
        call.logits.clear()
        return True

    def _map_cached_prefix(self, call: PredCall) -> int:
        """On a call's first chunk: map the longest cached prefix of its tokens into a fresh KV
        file (gpu_worker/kvfs/prefix.py) and count those tokens as done; returns how many. Never
        past the first row the caller wants logits of (that position must be computed), nor for
        a call that cannot fit (it fails in ``_plan`` and must leave the file as it was)."""
        if len(call.tokens) > self.max_model_len:
            return 0
        limit = min(call.rows) if call.rows else len(call.tokens) - 1
        try:
            skipped = self.kvfs.map_cached_prefix(call.session.owner, call.kv, call.tokens, limit)
        except KVFSError:
            return 0  # a bad handle: ``_plan`` reports it
        if skipped:
            call.done = skipped
            call.session.on_cached_tokens(skipped)
            self.metrics.prefix_cached_tokens += skipped
        return skipped

    def _plan(self, call: PredCall, n: int, budget_used: int, first: bool) -> AppendPlan | None:
        """Plan one chunk, or ``None`` (call failed, or deferred back to the queue)."""
        session = call.session
        try:
            if session.swapped:
                began = time.monotonic()
                self.kvfs.swap_in(session.owner)
                session.swapped = False
                session.trace.kv_back(began, time.monotonic())
            plan = self.kvfs.plan_append(session.owner, call.kv, call.tokens[call.done : call.done + n])
        except Busy:
            with self._cond:
                self.queue.push(call, front=True)
            return None
        except KVFSError as exc:
            self._fail_or_end(call, exc)
            return None
        run = len(plan.run_token_ids)
        # Checked against the whole call, not this chunk: a prompt that cannot fit fails before
        # its first chunk lands, so the file is left as it was (``pred`` does not pre-check).
        total = plan.num_computed_tokens + run + (call.remaining - n)
        if total > self.max_model_len:
            self.kvfs.abort_append(plan)
            self._fail_or_end(call, ContextFull(f"KV file would hold {total} tokens > {self.max_model_len}"))
            return None
        if not first and budget_used + run > self.config.max_num_batched_tokens:
            # Pending tokens (after merge/extract/reload) made it bigger than its share.
            self.kvfs.abort_append(plan)
            with self._cond:
                self.queue.push(call, front=True)
            return None
        return plan

    def contended_step_tokens(self) -> int:
        """The prefill tokens of a contended forward, all accounts together (``FairQueue``).

        ``contended_step_tokens`` if configured; else the tokens a forward can add to a
        decode-only forward and last at most ``contended_step_ratio`` of them, by the measured
        cost (the fastest recent decode-only forward, and the time a prompt token adds above
        it: ``Metrics.decode_floor``, ``Metrics.token_cost``), between a 128th of the
        token budget and the budget itself. Derived, so it fits the hardware: on a
        CPU a token of prefill costs a noticeable share of a forward and contended chunks are
        small; on a GPU a forward's fixed cost dominates and they may be whole budgets. Before
        both are measured: an eighth of the budget."""
        cap = self.config.max_num_batched_tokens
        if self.config.contended_step_tokens is not None:
            return max(1, min(self.config.contended_step_tokens, cap))
        m = self.metrics
        decode_s, token_s = m.decode_floor(), m.token_cost()
        if decode_s <= 0 or token_s <= 0:
            return max(1, int(cap * CONTENDED_STEP_DEFAULT_FRACTION))
        fits = (self.config.contended_step_ratio - 1) * decode_s / token_s
        return max(1, int(cap * CONTENDED_STEP_FLOOR_FRACTION), min(cap, int(fits)))

    def _measure_cost(self, elapsed: float, tokens: int, items: int) -> None:
        """Fold one forward into the cost model: a decode-only forward (every item one token)
        into its average time, a large one into the time a token adds above that."""
        m = self.metrics
        if tokens == items:
            m.decode_forward_s_ema = (
                elapsed if m.decode_forward_s_ema == 0 else 0.8 * m.decode_forward_s_ema + 0.2 * elapsed
            )
            m.decode_forward_samples.append(elapsed)
        elif m.decode_forward_samples and tokens >= self.config.max_num_batched_tokens * PREFILL_SAMPLE_FRACTION:
            per_token = max(elapsed - m.decode_floor(), 0.0) / tokens
            m.token_s_ema = per_token if m.token_s_ema == 0 else 0.8 * m.token_s_ema + 0.2 * per_token
            m.prefill_samples.append((tokens, elapsed))

    def _record_forward(self, plans: list[tuple[PredCall, int, AppendPlan]], start: float, elapsed: float) -> None:
        """The forward into the engine timeline (gpu_worker/engine_timeline.py): a call's one
        new token is a decode step, any other tokens it ran (a prompt's chunk, pending tokens
        after a merge) are prompt tokens."""
        prompt = decode = 0
        accounts: dict[str, int] = {}
        sessions: dict[str, SessionView] = {}
        for call, n, plan in plans:
            ran = len(plan.run_token_ids)
            step = 1 if n == 1 and len(call.tokens) == 1 else 0
            decode += step
            prompt += ran - step
            account = call.account
            accounts[account] = accounts.get(account, 0) + ran
            sessions[call.session.session_id] = call.session
        traces = tuple({s.trace.context for s in sessions.values() if s.trace.context is not None})
        self.timeline.record(
            ForwardRecord(start, elapsed, len(plans), prompt, decode, len(sessions), tuple(accounts.items()), traces)
        )

    def _run_batch(self, picked: list[tuple[PredCall, int]]) -> None:
        plans: list[tuple[PredCall, int, AppendPlan]] = []
        used = 0
        for call, n in picked:
            if (
                call.done == 0
                and not call.chosen
                and getattr(self.kvfs, "prefix", None) is not None
                and self._map_cached_prefix(call)
            ):
                n = min(n, call.remaining)  # the mapped prefix is done; at least one token is left
            plan = self._plan(call, n, used, first=not plans)
            if plan is not None:
                plans.append((call, n, plan))
                used += len(plan.run_token_ids)
        if not plans:
            return
        items: list[SeqWork] = []
        copies: list[tuple[int, int]] = []
        for call, n, plan in plans:
            start = call.done
            rows = [plan.n_pending + (r - start) for r in call.rows if start <= r < start + n]
            items.append(
                SeqWork(
                    plan.seq_id,
                    plan.run_token_ids,
                    plan.num_computed_tokens,
                    plan.page_ids,
                    tuple(rows) or (len(plan.run_token_ids) - 1,),
                )
            )
            copies.extend(plan.page_copies)
        now = time.monotonic()
        for call, _, _ in plans:
            if call.started is None:
                call.started = now
                wait = now - call.enqueued
                self.metrics.queue_wait_s_total += wait
                self.metrics.queue_wait_s_max = max(self.metrics.queue_wait_s_max, wait)
                if len(call.tokens) == 1:
                    self.metrics.queue_wait_s_max_decode = max(self.metrics.queue_wait_s_max_decode, wait)
        with self._cond:
            self._running = [c for c, _, _ in plans]
            self.clock.to("busy")
        wall0 = time.time()
        t0 = time.perf_counter()
        launched = time.monotonic()
        self.metrics.plan_s_total += max(launched - self._plan_began, 0.0)
        gap = launched - self._engine_free_since
        if 0 <= gap < BUSY_GAP_S and self.metrics.forwards:
            self.metrics.gap_s_total += gap
            self.metrics.gaps += 1
        try:
            outputs = self.engine.forward(Batch(tuple(items), tuple(copies)))
        except Exception as exc:
            log.exception("event=forward_failed items=%d tokens=%d", len(items), used)
            for call, _, plan in plans:
                self.kvfs.abort_append(plan)
                self._fail(call, ForwardFailed(f"forward failed: {type(exc).__name__}"))
            with self._cond:
                self._running = []
                self.clock.to("empty" if not len(self.queue) else "work")
            return
        elapsed = time.perf_counter() - t0
        self._engine_free_since = time.monotonic()
        m = self.metrics
        m.forwards += 1
        m.items += len(items)
        m.tokens += used
        m.forward_s_total += elapsed
        m.forward_s_max = max(m.forward_s_max, elapsed)
        m.forward_s_ema = elapsed if m.forward_s_ema == 0 else 0.8 * m.forward_s_ema + 0.2 * elapsed
        self._measure_cost(elapsed, used, len(items))
        for call, _, plan in plans:  # the trace's view of the forward: counts, never who else rode
            call.forwards += 1
            call.forward_s += elapsed
            own = len(plan.run_token_ids)
            call.forward_share_s += elapsed * own / max(used, 1)
            call.batch_size = max(call.batch_size, len(items))
            call.batch_tokens += used
            call.own_tokens += own
        self._record_forward(plans, wall0, elapsed)
        widths = collections.Counter(c.session.session_id for c, _, _ in plans)
        sessions = set(widths)
        for session in {id(c.session): c.session for c, _, _ in plans}.values():
            session.usage.forwards += 1  # only this (engine) thread writes the counter
        for tenant in {c.tenant for c, _, _ in plans}:
            m.forwards_per_tenant[tenant] += 1
        with self._cond:
            self.clock.to("post", at=self._engine_free_since)
            # A session's width is what it had in this forward plus what it already queued
            # meanwhile: a LIP whose N threads fell into two alternating half-batches is N wide,
            # so the next forward waits (boundedly) for all N instead of keeping the split.
            queued = collections.Counter(c.session.session_id for q in self.queue.queues.values() for c in q)
            self._width = {sid: n + queued[sid] for sid, n in widths.items()}
        m.max_sessions_in_forward = max(m.max_sessions_in_forward, len(sessions))
        if len(sessions) > 1:
            m.multi_session_forwards += 1
        # Per-token work from here on (copies to host, picking tokens) runs on one CPU thread.
        done: list[PredCall] = []
        with cpu_threads(1):
            for (call, n, plan), out in zip(plans, outputs, strict=True):
                self.kvfs.commit_append(plan)
                start = call.done
                mine = [r for r in call.rows if start <= r < start + n]
                out = out.to("cpu")
                for i, r in enumerate(mine):
                    call.logits[r] = out[i]
                call.done += n
                m.tokens_per_tenant[call.tenant] += len(plan.run_token_ids)
                # A prompt whose cached prefix left one token is still prefill, not a decode step.
                if n == 1 and len(call.tokens) > 1:
                    call.session.on_tokens(n, prefill=True)
                else:
                    call.session.on_tokens(n)
                # Tokens the file held uncomputed (shifted by kv_merge/kv_extract) rode along with
                # this call's own: the forward computed them for the session, so it pays for them
                # as prefill, or a merge would be free compute.
                pending = len(plan.run_token_ids) - n
                if pending > 0:
                    call.session.on_tokens(pending, prefill=True)
                if call.remaining > 0:
                    with self._cond:
                        self.queue.push(call, front=True)
                else:
                    done.append(call)
            results = [self._resolve(call) for call in done]
        finished: list[tuple[PredCall, object]] = []
        stepping: list[PredCall] = []
        for call, result in zip(done, results, strict=True):
            if (call.steps > 1 or call.watch is not None) and self._next_step(call, result):
                stepping.append(call)
            else:
                finished.append((call, result))
        with self._cond:
            for call in stepping:
                if call.cut:  # its session ended since ``_next_step`` looked
                    finished.append((call, list(call.chosen)))
                else:
                    self.queue.push(call, front=True)
            self._running = []
        settled = time.monotonic()
        for call, result in finished:
            m.calls += 1
            m.pred_s_per_tenant[call.tenant] += settled - call.enqueued
            self._settle(call, result)
        with self._cond:
            self.clock.post_done(bool(len(self.queue)))
        m.results_s_total += time.monotonic() - self._engine_free_since
