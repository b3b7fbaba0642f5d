"""The engine adapter computes what Hugging Face transformers computes on the same weights.

One real vLLM engine (SmolLM2-135M-Instruct in float32) serves the whole module; every test
compares its logits with transformers' full-sequence forward: chunked prefill, decode, a mixed
batch, multi-row logits, a fork sharing pages with the partial last page copied, and a negative
control that skips the copy and must disagree. Every test runs on the eager model and (``slow``:
a compile takes minutes on a fresh cache) on the model vLLM compiled, which the worker runs by
default on CPU: the hand-built scheduler outputs must give the same logits through both.
"""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from gpu_worker.batch import Batch, SeqWork
from gpu_worker.engine import Engine, EngineConfig, cpu_threads, set_cpu_threads_of_this_thread

pytestmark = [pytest.mark.vllm, pytest.mark.integration]

ATOL = 2e-3


@pytest.fixture(
    scope="module",
    params=[pytest.param(False, id="eager"), pytest.param(True, id="compiled", marks=pytest.mark.slow)],
)
def engine(default_model_dir: Path, request: pytest.FixtureRequest) -> Iterator[Engine]:
    eng = Engine(
        EngineConfig(
            model_dir=str(default_model_dir),
            dtype="float32",
            num_pages=24,
            max_model_len=1024,
            max_num_batched_tokens=1024,
            max_num_seqs=8,
            compile=request.param,
            compile_cache_dir=str(Path(__file__).resolve().parents[2] / "var" / "compile-cache"),
        )
    )
    try:
        yield eng
    finally:
        eng.close()


@pytest.fixture(scope="module")
def hf_model(default_model_dir: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(default_model_dir), dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def reference(hf_model):
    """Full-sequence transformers logits ``[len(tokens), vocab]`` (cached per token tuple)."""
    cache: dict[tuple[int, ...], torch.Tensor] = {}

    def logits(tokens: list[int]) -> torch.Tensor:
        key = tuple(tokens)
        if key not in cache:
            with torch.no_grad():
                cache[key] = hf_model(torch.tensor([tokens])).logits[0].float()
        return cache[key]

    return logits


def tokens(n: int, seed: int) -> list[int]:
    return torch.randint(0, 49152, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def assert_close(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.shape == want.shape
    assert torch.equal(got.argmax(-1), want.argmax(-1))
    torch.testing.assert_close(got.cpu(), want, atol=ATOL, rtol=0)


def work(seq: str, toks: list[int], start: int, end: int, pages, rows=None) -> SeqWork:
    n = end - start
    return SeqWork(
        seq_id=seq,
        new_token_ids=tuple(toks[start:end]),
        num_computed_tokens=start,
        page_ids=tuple(pages),
        logits_rows=tuple(range(n)) if rows is None else tuple(rows),
    )


def test_geometry(engine: Engine) -> None:
    assert engine.num_pages == 24
    assert engine.vocab_size == 49152
    assert engine.block_size > 0
    # 30 layers x K+V x 3 kv heads x 64 dims x block_size tokens x 4 bytes (float32).
    assert engine.page_bytes == 30 * 2 * 3 * 64 * engine.block_size * 4


def test_chunked_prefill_all_rows(engine: Engine, reference) -> None:
    toks = tokens(300, seed=1)
    pages = (1, 2, 3)
    got = [engine.forward(Batch((work("a", toks, s, e, pages),)))[0] for s, e in [(0, 97), (97, 230), (230, 300)]]
    assert_close(torch.cat(got), reference(toks))


def test_decode_steps_follow_greedy(engine: Engine, reference) -> None:
    toks = tokens(150, seed=2)
    pages = (4, 5)
    (last,) = engine.forward(Batch((work("d", toks, 0, 150, pages, rows=[149]),)))
    assert_close(last, reference(toks)[-1:])
    for _ in range(6):
        toks.append(int(last[0].argmax()))
        n = len(toks)
        (last,) = engine.forward(Batch((work("d", toks, n - 1, n, pages, rows=[0]),)))
        assert_close(last, reference(toks)[-1:])


def test_mixed_batch_prefill_and_two_decodes(engine: Engine, reference) -> None:
    a, b, c = tokens(140, seed=3), tokens(90, seed=4), tokens(60, seed=5)
    pa, pb, pc = (6, 7), (8,), (9,)
    engine.forward(Batch((work("ma", a, 0, 139, pa, rows=[138]), work("mc", c, 0, 59, pc))))
    out = engine.forward(
        Batch((work("ma", a, 139, 140, pa), work("mb", b, 0, 90, pb, rows=[10, 89]), work("mc", c, 59, 60, pc)))
    )
    assert_close(out[0], reference(a)[-1:])
    assert_close(out[1], reference(b)[[10, 89]])
    assert_close(out[2], reference(c)[-1:])


def _fork_case(engine: Engine, reference, copy_partial: bool) -> tuple[torch.Tensor, torch.Tensor, list, list]:
    """Parent of 200 tokens on pages (10, 11); the child shares page 10 (full) and gets page 12
    as its copy of the partial page 11; both then append different tokens in one batch."""
    bs = engine.block_size
    n = bs + 72
    prefix = tokens(n, seed=6)
    engine.forward(Batch((work("parent", prefix, 0, n, (10, 11), rows=[n - 1]),)))
    parent = prefix + tokens(5, seed=7)
    child = prefix + tokens(5, seed=8)
    copies = ((11, 12),) if copy_partial else ()
    out = engine.forward(
        Batch(
            (work("parent", parent, n, n + 5, (10, 11)), work("child", child, n, n + 5, (10, 12))),
            page_copies=copies,
        )
    )
    return out[0], out[1], parent, child


def test_fork_shares_full_pages_and_copies_partial_page(engine: Engine, reference) -> None:
    got_parent, got_child, parent, child = _fork_case(engine, reference, copy_partial=True)
    assert_close(got_parent, reference(parent)[-5:])
    assert_close(got_child, reference(child)[-5:])


def test_negative_control_fork_without_partial_page_copy_disagrees(engine: Engine, reference) -> None:
    """Page 12 holds other data (zeroed here); without the copy the child's context is wrong."""
    engine.write_pages([12], torch.zeros((1, *engine.page_shape)))
    got_parent, got_child, parent, child = _fork_case(engine, reference, copy_partial=False)
    assert_close(got_parent, reference(parent)[-5:])
    with pytest.raises(AssertionError):
        assert_close(got_child, reference(child)[-5:])


def test_page_read_write_roundtrip(engine: Engine, reference) -> None:
    toks = tokens(200, seed=9)
    engine.forward(Batch((work("rw", toks, 0, 199, (13, 14), rows=[198]),)))
    saved = engine.read_pages([13, 14])
    assert saved.shape == (2, *engine.page_shape) and saved.device.type == "cpu"
    # Move the KV to other pages, as a swap out and back in would, and decode from there.
    engine.write_pages([15, 16], saved)
    (moved,) = engine.forward(Batch((work("rw2", toks, 199, 200, (15, 16)),)))
    assert_close(moved, reference(toks)[-1:])


def test_page_moves_do_not_wait_for_a_running_forward(engine: Engine, reference) -> None:
    """A spill or reload copies pages no forward writes. Made to wait for the forward's lock,
    a LIP's ``kv_open`` of a spilled file waited up to a whole forward (B1 at 1024-token
    documents), so here the lock is held, as a forward holds it, while pages move."""
    toks = tokens(130, seed=11)
    engine.forward(Batch((work("mv", toks, 0, 129, (21, 22), rows=[128]),)))
    held, done = threading.Event(), threading.Event()

    def forward_running() -> None:
        with engine._lock:
            held.set()
            done.wait(30)

    holder = threading.Thread(target=forward_running)
    holder.start()
    held.wait(30)
    try:
        with concurrent.futures.ThreadPoolExecutor(1) as mover:
            mover.submit(lambda: engine.write_pages([23, 12], engine.read_pages([21, 22]))).result(timeout=10)
    finally:
        done.set()
        holder.join()
    (moved,) = engine.forward(Batch((work("mv2", toks, 129, 130, (23, 12)),)))
    assert_close(moved, reference(toks)[-1:])
    engine.release("mv")
    engine.release("mv2")


@pytest.mark.parametrize(
    "bad",
    [
        SeqWork("x", (1, 2), 0, (0,), (1,)),  # page 0 is reserved
        SeqWork("x", (1, 2), 0, (), (1,)),  # no page for the tokens
        SeqWork("x", (1, 2), 0, (1,), (2,)),  # logits row past the new tokens
        SeqWork("x", (), 0, (1,), (0,)),  # nothing to compute
        SeqWork("x", (49152,), 0, (1,), (0,)),  # token outside the vocabulary
    ],
)
def test_invalid_work_is_rejected(engine: Engine, bad: SeqWork) -> None:
    with pytest.raises(ValueError):
        engine.forward(Batch((bad,)))


def test_mixed_batch_last_rows_map_through_runner_reordering(engine: Engine, reference) -> None:
    """Prefill listed before the decodes: vLLM may reorder rows; results stay in batch order."""
    a, b, c = tokens(70, seed=10), tokens(100, seed=11), tokens(50, seed=12)
    pa, pb, pc = (19,), (20,), (21,)
    engine.forward(Batch((work("ra", a, 0, 69, pa, rows=[68]), work("rc", c, 0, 49, pc, rows=[48]))))
    out = engine.forward(
        Batch((work("rb", b, 0, 100, pb, rows=[99]), work("ra", a, 69, 70, pa), work("rc", c, 49, 50, pc)))
    )
    assert_close(out[0], reference(b)[-1:])
    assert_close(out[1], reference(a)[-1:])
    assert_close(out[2], reference(c)[-1:])


def test_persistent_request_survives_absence_and_page_growth(engine: Engine, reference) -> None:
    """A sequence skips steps (vLLM drops it from its batch, keeps its state) and grows its page
    table between calls; it is continued, not re-registered, and stays exact."""
    bs = engine.block_size
    toks = tokens(bs + 40, seed=13)
    other = tokens(30, seed=14)
    engine.forward(Batch((work("grow", toks, 0, bs - 10, (22,), rows=[bs - 11]),)))
    engine.forward(Batch((work("other", other, 0, 30, (23,)),)))  # "grow" absent from this step
    before = engine.stats()
    (got,) = engine.forward(Batch((work("grow", toks, bs - 10, bs + 40, (22, 1)),)))
    assert_close(got, reference(toks)[bs - 10 :])
    toks.append(int(got[-1].argmax()))
    (got,) = engine.forward(Batch((work("grow", toks, bs + 40, bs + 41, (22, 1)),)))
    assert_close(got, reference(toks)[-1:])
    after = engine.stats()
    assert after["continued_requests"] - before["continued_requests"] == 2
    assert after["new_requests"] == before["new_requests"]


def test_truncate_and_rewrite_starts_a_fresh_request(engine: Engine, reference) -> None:
    """Going back (KVFS truncate) must not be answered from the runner's cached request."""
    toks = tokens(120, seed=15)
    engine.forward(Batch((work("tr", toks, 0, 120, (2,)),)))
    rewritten = toks[:80] + tokens(10, seed=16)
    before = engine.stats()["new_requests"]
    (got,) = engine.forward(Batch((work("tr", rewritten, 80, 90, (2,)),)))
    assert_close(got, reference(rewritten)[80:])
    assert engine.stats()["new_requests"] == before + 1


def test_release_then_reuse_and_full_length_sequence(engine: Engine, reference) -> None:
    """A sequence may fill max_model_len exactly; a released id starts afresh."""
    n = engine.config.max_model_len
    pages = tuple(range(3, 3 + -(-n // engine.block_size)))
    toks = tokens(n, seed=17)
    (got,) = engine.forward(Batch((work("full", toks, 0, n, pages, rows=[0, n - 1]),)))
    assert_close(got, reference(toks)[[0, n - 1]])
    engine.release("full")
    short = tokens(20, seed=18)
    (got,) = engine.forward(Batch((work("full", short, 0, 20, pages, rows=[19]),)))
    assert_close(got, reference(short)[-1:])
    with pytest.raises(ValueError, match="max_model_len"):
        engine.forward(Batch((work("full", [*toks, 1], n, n + 1, pages),)))


def _in_fresh_thread(fn) -> None:
    thread = threading.Thread(target=fn)
    thread.start()
    thread.join()


def test_forward_thread_keeps_its_cpu_threads_when_other_threads_take_one(engine: Engine, reference) -> None:
    """The worker's event loop takes one CPU thread for its per-token ops after the engine
    thread has claimed the forward's count, and the engine thread itself picks tokens on one
    thread between forwards (``cpu_threads``); the forward must still run with that count (vLLM's
    CPU attention checks it) and give the reference logits."""
    if engine.forward_threads < 2:
        pytest.skip("one CPU: nothing to keep apart")
    claimed, go, seen = threading.Event(), threading.Event(), {}

    def forward_thread() -> None:
        engine.claim_forward_thread()
        claimed.set()
        go.wait(30)
        with cpu_threads(1):  # the scheduler picks tokens between forwards on one thread
            seen["picking_threads"] = torch.get_num_threads()
        toks = tokens(40, seed=9)
        try:
            seen["logits"] = (engine.forward(Batch((work("t", toks, 0, 40, (20,), rows=[39]),)))[0], toks)
        finally:
            seen["threads"] = torch.get_num_threads()
            engine.release("t")

    runner = threading.Thread(target=forward_thread)
    runner.start()
    claimed.wait(30)
    _in_fresh_thread(lambda: set_cpu_threads_of_this_thread(1))  # what the event loop does
    go.set()
    runner.join()
    _in_fresh_thread(lambda: set_cpu_threads_of_this_thread(engine.forward_threads))  # restore for later tests
    assert seen["threads"] == engine.forward_threads and seen["picking_threads"] == 1
    logits, toks = seen["logits"]
    assert_close(logits, reference(toks)[-1:])
