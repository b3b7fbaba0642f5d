"""LIP-level scheduling through the real worker: a LIP blocked on brokered I/O longer than the
threshold (0.5 s) has its private KV pages swapped to host memory, frees the device pages for
others meanwhile, and continues exactly as if nothing happened once the I/O returns."""

from __future__ import annotations

import threading
import time

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.vllm]

PROMPT = [(31 * i + 11) % 3000 + 40 for i in range(260)]  # three 128-token pages


def _tenant_pages(worker, tenant: str) -> tuple[int, int]:
    kvfs = worker.admin.stats()["kvfs"]
    return kvfs["pages_per_tenant"].get(tenant, 0), kvfs["host_pages"]


def test_io_wait_swaps_private_pages_out_and_back(gpu_worker_process) -> None:
    import symphony

    with gpu_worker_process.session("swapper") as info:
        sdk = symphony.connect(info.socket_path, info.token)
        reference = sdk.generate(sdk.kv_create(), PROMPT, 8)

        kv = sdk.kv_create()
        head = sdk.generate(kv, PROMPT, 4)
        device_before, host_before = _tenant_pages(gpu_worker_process, "swapper")
        sleeper = threading.Thread(target=sdk.sleep, args=(2.0,))  # brokered: the worker sleeps
        sleeper.start()
        time.sleep(1.2)  # past the 0.5 s threshold, while the LIP still waits
        device_during, host_during = _tenant_pages(gpu_worker_process, "swapper")
        sleeper.join()
        tail = sdk.generate(kv, [head[-1]], 4)  # continues from the swapped-in pages
        sessions = {s["session_id"]: s for s in gpu_worker_process.admin.stats()["sessions"]}
        sdk.close()

    assert device_before >= 3 and device_during < device_before, (device_before, device_during)
    assert host_during >= host_before + 3, (host_before, host_during)
    assert sessions[info.session_id]["swaps"] >= 1
    assert head + tail == reference
