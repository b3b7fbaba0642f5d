"""Each side's resources are read from the processes that run: real subprocesses started with a
CPU mask and an environment, read back through ``/proc`` as a benchmark reads its two sides."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench import resources

CPUS = sorted(os.sched_getaffinity(0))


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    """A process bound to the first CPU, started with one OpenMP thread and the passive policy."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE"}
    code = f"import os, time; os.sched_setaffinity(0, {{{CPUS[0]}}}); time.sleep(60)"
    proc = subprocess.Popen([sys.executable, "-c", code], env=env)
    _wait_for(lambda: resources.thread_cpus(proc.pid) == [CPUS[0]])
    yield proc
    proc.kill()
    proc.wait()


def _wait_for(cond, timeout_s: float = 20.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def test_cpu_lists_read_and_written_in_the_kernels_format() -> None:
    assert resources.parse_cpu_list("0-2,5\n") == [0, 1, 2, 5]
    assert resources.parse_cpu_list("3") == [3]
    assert resources.cpu_list_text([5, 0, 1, 2]) == "0-2,5"
    assert resources.cpu_list_text([1]) == "1"


def test_a_side_is_read_from_the_process_it_names(sleeper: subprocess.Popen[bytes]) -> None:
    side = resources.side(pid=sleeper.pid, env=None, dtype="torch.float32", max_batch=8, kv_pages=10, page_bytes=4)
    assert side["cpu_affinity"] == [CPUS[0]]
    assert side["forward_threads"] == 1  # OMP_NUM_THREADS from the environment it started with
    assert side["omp_wait_policy"] == "PASSIVE"
    assert side["dtype"] == "float32" and side["kv_bytes"] == 40 and side["pid"] == sleeper.pid


def test_without_omp_num_threads_a_forward_takes_one_thread_per_cpu() -> None:
    assert resources.openmp_threads({}, [0, 1]) == 2
    assert resources.openmp_threads({"OMP_NUM_THREADS": "3"}, [0, 1]) == 3
    assert resources.openmp_threads({"OMP_NUM_THREADS": "junk"}, [0]) == 1


def test_cpus_of_a_process_are_those_of_all_its_threads() -> None:
    """vLLM binds each OpenMP thread to one core: the union of the threads' masks is the
    process's CPUs, whatever its main thread's mask says."""
    if len(CPUS) < 2:
        pytest.skip("needs two CPUs")
    code = (
        "import os, threading, time\n"
        "def pinned():\n"
        f"    os.sched_setaffinity(0, {{{CPUS[1]}}}); time.sleep(60)\n"
        "threading.Thread(target=pinned, daemon=True).start()\n"
        f"os.sched_setaffinity(0, {{{CPUS[0]}}}); time.sleep(60)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code])
    try:
        main_mask = f"Cpus_allowed_list:\t{CPUS[0]}\n"
        threads = Path(f"/proc/{proc.pid}/task")
        _wait_for(
            lambda: main_mask in Path(f"/proc/{proc.pid}/status").read_text() and len(list(threads.iterdir())) == 2
        )
        _wait_for(lambda: all("Cpus_allowed_list:\t0-" not in (t / "status").read_text() for t in threads.iterdir()))
        assert resources.thread_cpus(proc.pid) == CPUS[:2]
    finally:
        proc.kill()
        proc.wait()


def test_the_forward_process_is_the_deepest_of_the_tree_not_a_helper() -> None:
    """API server -> engine core -> worker (vllm serve), beside a multiprocessing helper."""
    code = (
        "import subprocess, sys, time\n"
        "tracker = subprocess.Popen([sys.executable, '-c', "
        "'from multiprocessing import resource_tracker; import time; time.sleep(60)'])\n"
        "core = subprocess.Popen([sys.executable, '-c', "
        '\'import subprocess, sys, time; subprocess.Popen([sys.executable, "-c", "import time; '
        "time.sleep(60)\"]); time.sleep(60)'])\n"
        "time.sleep(60)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    try:
        _wait_for(lambda: any(resources.children(c) for c in resources.children(proc.pid)))
        core = next(c for c in resources.children(proc.pid) if resources.children(c))
        worker = resources.children(core)[0]
        assert resources.forward_process(proc.pid) == worker
        lone = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        try:
            assert resources.forward_process(lone.pid) == lone.pid
        finally:
            lone.kill()
            lone.wait()
    finally:
        os.killpg(proc.pid, 9)
        proc.wait()


def test_a_kv_page_is_keys_and_values_of_every_layer(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(
        '{"num_hidden_layers": 30, "num_key_value_heads": 3, "num_attention_heads": 9, "hidden_size": 576}'
    )
    # SmolLM2-135M in float32 with 128-token blocks: 5.9 MB a page (the figure).
    assert resources.kv_page_bytes(str(tmp_path), "float32", 128) == 2 * 30 * 3 * 64 * 128 * 4 == 5_898_240
    assert resources.kv_page_bytes(str(tmp_path), "torch.bfloat16", 16) == 2 * 30 * 3 * 64 * 16 * 2


def test_vllms_cache_configuration_is_read_from_its_metrics_page() -> None:
    page = (
        "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n"
        "# TYPE vllm:cache_config_info gauge\n"
        'vllm:cache_config_info{block_size="128",cache_dtype="auto",engine="0",'
        'num_gpu_blocks="340",prefix_caching_hash_algo="sha256"} 1.0\n'
    )
    labels = resources.parse_cache_config_info(page)
    assert labels["num_gpu_blocks"] == "340" and labels["block_size"] == "128"
    with pytest.raises(ValueError):
        resources.parse_cache_config_info("vllm:num_requests_running 0\n")


def test_equal_compute_gives_vllm_serve_the_cpus_and_the_wait_policy() -> None:
    env = resources.equal_compute_env([0, 1])
    assert env == {
        "VLLM_CPU_OMP_THREADS_BIND": "0-1",
        "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
        "OMP_WAIT_POLICY": "PASSIVE",
    }


def test_a_side_of_several_processes_adds_them_up() -> None:
    part = {
        "forward_threads": 2,
        "cpu_affinity": [0, 1],
        "omp_wait_policy": "PASSIVE",
        "dtype": "float32",
        "max_batch": 4,
        "kv_pages": 10,
        "kv_bytes": 100,
    }
    both = resources.combined([part, part])
    assert both["forward_threads"] == 4 and both["cpu_affinity"] == [0, 1] and both["kv_bytes"] == 200
    assert both["omp_wait_policy"] == "PASSIVE" and both["max_batch"] == 8
