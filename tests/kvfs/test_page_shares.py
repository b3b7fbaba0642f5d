"""Page-seconds of shared KV pages are split among their holders (``KVFS.live_usage``): a page
``n`` sessions hold counts ``1/n`` to each, as proportional set size does, so who opened a shared
context first changes nothing and the context is paid for once."""

from __future__ import annotations

from gpu_worker.kvfs import Owner
from tests.kvfs.memio import BLOCK, append, make_fs

WRITER, READERS = Owner("acme", "s0"), [Owner("acme", f"s{i}") for i in (1, 2, 3)]


def test_readers_of_one_context_share_its_pages_equally_and_pay_for_it_once(tmp_path):
    fs, io = make_fs(tmp_path)
    ctx = fs.create(WRITER, "ctx")
    append(fs, io, WRITER, ctx, list(range(4 * BLOCK)))
    fs.close(WRITER, ctx)
    handles = [fs.open(reader, "ctx", "r") for reader in READERS]  # copy-on-write forks
    shares = [pages for _event, pages in fs.live_usage(READERS)]
    assert shares == [4 / 3] * 3 and sum(shares) == 4
    # Each run's event still says how many pages it holds.
    assert [event["run_pages"] for event, _ in fs.live_usage(READERS)] == [4, 4, 4]
    # A reader's own page (an append past the shared full pages) is its alone.
    append(fs, io, READERS[0], handles[0], [7])
    first, second, third = (pages for _event, pages in fs.live_usage(READERS))
    assert first == 4 / 3 + 1 and second == third == 4 / 3
    # One reader left: the others split what remains between them.
    fs.close(READERS[2], handles[2])
    assert [pages for _event, pages in fs.live_usage(READERS)] == [2 + 1, 2, 0]
