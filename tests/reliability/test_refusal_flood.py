"""A program that retries a refused call in a tight loop is paced, and another account is not.

Every call costs the worker's shared event loop the same to read, check and answer, refused or
not; in the account soak one refused grammar call was asked ~800 times a second. The worker
now holds the replies of an account's repeated resource refusals (gpu_worker/refusal_pacing.py):
the first few at once, then 10 ms doubling to 1 s. Here a real worker, four threads of one
account asking for a named KV file past its plan's count as fast as they can for a few
seconds: the account gets at most a few dozen refusals (it got thousands before), the worker
says it held them, and another account's first refusal of the same kind and its ordinary calls
still answer at once meanwhile.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

import symphony as sy
from tests.plugins.worker import start_worker

pytestmark = [pytest.mark.integration, pytest.mark.vllm, pytest.mark.timeout(120)]

FLOOD_S = 4.0
THREADS = 4
#: The most refusals the flooding account may get in ``FLOOD_S``: the pacer's free ones plus
#: holds that double to 1 s; unpaced, the same loop got thousands here.
MOST_REFUSALS = 80
#: An answer the other account waits for meanwhile (unpaced: milliseconds).
PROMPT_S = 0.5


@pytest.fixture(scope="module")
def worker(tiny_model_dir: Path):
    with start_worker(tiny_model_dir, name="refusal-flood") as w:
        yield w


def _session(worker, account: str) -> sy.Client:
    info = worker.create_session(f"{account}-tenant", account=account, max_kv_files=1)
    return sy.connect(info.socket_path, info.token)


def test_a_tight_loop_of_refusals_is_paced_and_another_account_is_not(worker) -> None:
    attacker = _session(worker, "acct-flood")
    canary = _session(worker, "acct-canary")
    attacker.kv_create("kept")  # the plan's one named file: every further one is refused
    canary.kv_create("kept")
    refusals = [0] * THREADS
    codes: set[str] = set()
    stop = time.monotonic() + FLOOD_S

    def flood(i: int) -> None:
        while time.monotonic() < stop:
            try:
                attacker.kv_create(f"more-{i}")
            except sy.SymphonyError as exc:
                refusals[i] += 1
                codes.add(type(exc).__name__)

    threads = [threading.Thread(target=flood, args=(i,), daemon=True) for i in range(THREADS)]
    for t in threads:
        t.start()
    time.sleep(1.0)  # the attacker's streak is well past its free refusals by now
    # The other account: its own first refusal and an ordinary call answer at once.
    started = time.monotonic()
    with pytest.raises(sy.SymphonyError):
        canary.kv_create("second")
    canary_refusal_s = time.monotonic() - started
    started = time.monotonic()
    canary.tokenize("still answered")
    canary_call_s = time.monotonic() - started
    for t in threads:
        t.join(FLOOD_S + 5)
    held = worker.admin.stats()["refusals_paced"]
    assert sum(refusals) <= MOST_REFUSALS, (refusals, held)
    assert sum(refusals) >= THREADS, refusals  # it was refused, not hung
    assert held["held"] >= 1 and held["held_s"] > 0, held
    assert canary_refusal_s < PROMPT_S and canary_call_s < PROMPT_S, (canary_refusal_s, canary_call_s)
    assert len(codes) == 1, codes
