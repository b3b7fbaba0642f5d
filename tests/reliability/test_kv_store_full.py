"""Fault injection: the worker's KV store (its disk) fills up.

The store is a real 4 MiB tmpfs. A file persisted before the disk filled must stay byte for byte
intact; creating a file must fail with ``ENOSPC`` (not even its lease fits); persisting another
file must fail with a clear ``ENOSPC`` ("the KV store is full") and leave no partial blob, while
the file stays usable on device; once space is freed the same file persists, and after a
restart both reload.
"""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpu_worker.protocol import ErrorCode, ProtocolError
from tests.plugins.worker import start_worker

pytestmark = [pytest.mark.integration, pytest.mark.vllm]

PROMPT = [(13 * i + 7) % 4000 + 30 for i in range(300)]


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    mount = tmp_path / "kvstore"
    mount.mkdir()
    proc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount)], capture_output=True, text=True
    )
    if proc.returncode != 0:
        pytest.fail(f"this test mounts a small tmpfs and needs root (CAP_SYS_ADMIN): {proc.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def _fill(disk: Path) -> Path:
    """Write until the filesystem refuses; returns the filler file."""
    filler = disk / "filler"
    with open(filler, "wb", buffering=0) as fh:  # unbuffered: nothing left to flush on close
        for chunk in (65536, 512):
            with contextlib.suppress(OSError):
                while True:
                    fh.write(b"\0" * chunk)
    return filler


def test_full_kv_store_gives_enospc_and_corrupts_nothing(tiny_model_dir: Path, small_disk: Path) -> None:
    import symphony

    with start_worker(tiny_model_dir, name="disk-full", kv_store=small_disk) as worker:
        info = worker.create_session("acme")
        sdk = symphony.connect(info.socket_path, info.token)
        first = sdk.kv_create("first")
        sdk.pred(first, PROMPT)[-1].release()
        first.close()  # write-through while there is room
        blob = small_disk / "acme" / "first.safetensors"
        before = blob.read_bytes()

        second = sdk.kv_create("second")  # its write lease (gpu_worker/kvfs/lease.py) still fits
        filler = _fill(small_disk)
        with pytest.raises(symphony.NoSpace, match="KV store is full"):
            sdk.kv_create("third")  # not even its lease fits: refused, nothing half-created
        sdk.pred(second, PROMPT)[-1].release()
        second.close()  # write-through fails: logged, the file stays on device
        with pytest.raises(ProtocolError) as refused:
            worker.admin.kv_evict("acme", "second")
        assert refused.value.code == ErrorCode.NO_SPACE and "KV store is full" in refused.value.message
        assert blob.read_bytes() == before
        assert not list(small_disk.rglob(".tmp-*")), "a partial blob was left behind"
        assert not (small_disk / "acme" / "second.safetensors").exists()
        still = sdk.kv_open("second", "r")  # usable on device meanwhile
        assert len(still) == len(PROMPT)
        still.close()
        worker.assert_alive()

        filler.unlink()
        worker.admin.kv_evict("acme", "second")  # now it fits
        sdk.close()
        worker.end_session(info.session_id)

    with start_worker(tiny_model_dir, name="disk-full-again", kv_store=small_disk) as again:
        listed = {f["name"]: f["tokens"] for f in again.admin.kv_list() if f["tenant"] == "acme"}
        assert listed == {"first": len(PROMPT), "second": len(PROMPT)}
        info = again.create_session("acme")
        sdk = symphony.connect(info.socket_path, info.token)
        from_reload = sdk.pred(sdk.kv_open("second", "r"), [42])[-1].topk(8)
        from_scratch = sdk.pred(sdk.kv_create(), [*PROMPT, 42])[-1].topk(8)
        sdk.close()
        again.end_session(info.session_id)
    assert from_reload.ids == from_scratch.ids
    assert from_reload.logprobs == pytest.approx(from_scratch.logprobs, abs=1e-3)
