"""The harness writes the protocol's evidence into every record: each repetition's paired ratio,
the host's load average per repetition and before the run, and whether the host was busy."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from bench import harness, host_share


def test_paired_ratios_pair_each_repetitions_two_sides() -> None:
    cmp = harness.Comparison("x", "tok/s")
    for s, b in ((10.0, 5.0), (9.0, 9.0), (12.0, 6.0)):
        cmp.symphony.add(s)
        cmp.baseline.add(b)
    assert cmp.paired_ratios == [2.0, 1.0, 2.0]
    paired = cmp.to_dict()["paired_ratio"]
    assert paired == {"median": 2.0, "min": 1.0, "max": 2.0, "values": [2.0, 1.0, 2.0]}


@pytest.fixture(autouse=True)
def no_accounting_group(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    """The test process stays where it is: the harness's group is one with no cgroup behind it
    (the load-average rule applies), unless a test gives it readings itself."""
    monkeypatch.setattr(harness, "HOST_SHARE", host_share.HostShare(root=tmp_path / "no-cgroups"))
    monkeypatch.setattr(harness, "CPU_READINGS", [])


def test_interleaving_records_the_load_of_each_repetition(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(harness, "LOAD_PER_REP", [])
    cmp = harness.Comparison("x", "s")
    harness.interleaved(3, lambda: 1.0, lambda: 2.0, cmp)
    assert len(harness.LOAD_PER_REP) == 3 and cmp.symphony.values == [1.0] * 3


def test_a_host_busy_before_or_during_the_run_is_marked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(harness.os, "cpu_count", lambda: 2)
    result = harness.BenchResult("b", {})
    monkeypatch.setattr(harness, "LOAD_BEFORE", 0.5)
    monkeypatch.setattr(harness, "LOAD_PER_REP", [2.0, 2.5])
    assert result.protocol()["busy"] is False and result.protocol()["version"] == harness.PROTOCOL_VERSION
    monkeypatch.setattr(harness, "LOAD_BEFORE", 1.5)  # something else was running before
    assert result.protocol()["busy"] is True
    monkeypatch.setattr(harness, "LOAD_BEFORE", 0.5)
    monkeypatch.setattr(harness, "LOAD_PER_REP", [2.0, 3.5])  # past the two sides' own load
    assert result.protocol()["busy"] is True


class _Readings(host_share.HostShare):
    """A group whose readings are given: (wall, host busy, own, containers) seconds."""

    def __init__(self, *readings: tuple[float, float, float, float]) -> None:
        super().__init__()
        self.readings = [host_share.CpuReading(*r) for r in readings]

    def track(self) -> bool:
        return True

    def read(self) -> host_share.CpuReading | None:
        return self.readings.pop(0)


def test_other_work_during_a_repetition_marks_the_host_busy(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the benchmark's own group measured, its own load (two forward threads and more) is
    no sign of a busy host; CPU spent outside it and the sandbox containers is."""
    monkeypatch.setattr(harness, "LOAD_BEFORE", 0.2)
    monkeypatch.setattr(harness, "LOAD_PER_REP", [])
    # Two repetitions of 10 s: the host busy 20 core-seconds in each, all of it the benchmark's
    # and its containers' in the first, 5 core-seconds of something else in the second.
    share = _Readings((0, 0, 0, 0), (10, 20, 17, 3), (20, 40, 30, 5))
    monkeypatch.setattr(harness, "HOST_SHARE", share)
    harness.repetition_starts()
    harness.repetition_starts()
    protocol = harness.BenchResult("b", {}).protocol()
    first, second = protocol["cpu_per_rep"]
    assert (first["own_cpus"], first["container_cpus"], first["other_cpus"]) == (1.7, 0.3, 0.0)
    assert second["other_cpus"] == 0.5 and protocol["busy"] is True
    assert protocol["busy_bound"] == {"before_per_cpu": 0.5, "other_cpus": harness.BUSY_OTHER_CPUS}


def test_the_stacks_daemons_are_the_benchmarks_work_not_other_work(tmp_path) -> None:
    """dockerd, containerd, PostgreSQL and Redis run outside the benchmark's group; the CPU they
    spend (PostgreSQL's reaped backends included) is counted apart, not as other work."""
    tick = 1 / os.sysconf("SC_CLK_TCK")

    def proc(pid: int, comm: str, utime: int, stime: int, cutime: int = 0, cstime: int = 0) -> None:
        (tmp_path / str(pid)).mkdir()
        rest = ["S"] + ["0"] * 10 + [str(utime), str(stime), str(cutime), str(cstime)] + ["0"] * 30
        (tmp_path / str(pid) / "stat").write_text(f"{pid} ({comm}) {' '.join(rest)}\n")

    proc(10, "dockerd", 100, 50)
    proc(11, "postgres", 10, 10, cutime=30, cstime=20)
    proc(12, "redis-server", 5, 5)
    proc(13, "containerd-shim", 1, 1, cutime=999)  # its children are containers, counted apart
    proc(14, "python3", 500, 500)  # not a daemon of the stack
    assert host_share.daemons_s(tmp_path) == pytest.approx((150 + 70 + 10 + 2) * tick)
    split = host_share.between(host_share.CpuReading(0, 0, 0, 0, 0), host_share.CpuReading(10, 20, 14, 2, 3))
    assert (split["own_cpus"], split["container_cpus"], split["daemon_cpus"], split["other_cpus"]) == (
        1.4,
        0.2,
        0.3,
        0.1,
    )


def test_the_benchmarks_group_keeps_the_cpu_of_processes_that_ended(tmp_path) -> None:
    """Through the kernel's real accounting: a child that burned CPU and exited is still the
    benchmark's own (a sandbox's short-lived processes, a side's helper)."""
    if not (host_share.CPUACCT / "cgroup.procs").exists() or not os.access(host_share.CPUACCT, os.W_OK):
        pytest.skip("no writable cgroup v1 cpuacct hierarchy on this host")
    script = (
        "import subprocess, sys\n"
        "from bench import host_share\n"
        "share = host_share.HostShare()\n"
        "assert share.track()\n"
        "start = share.read()\n"
        "subprocess.run([sys.executable, '-c', 'import time\\nt = time.process_time()\\n"
        "while time.process_time() - t < 0.6: pass'], check=True)\n"
        "end = share.read()\n"
        "print(end.own - start.own)\n"
    )
    out = subprocess.run([sys.executable, "-c", script], cwd=harness.ROOT, capture_output=True, text=True, check=True)
    assert float(out.stdout.strip()) >= 0.5, out


def test_a_record_names_the_model_without_this_machines_layout() -> None:
    """``config.model`` is relative to the checkout, or ``models/<name>`` outside it; no
    committed record holds an absolute path."""
    import json

    inside = harness.ROOT / "var" / "models" / "SmolLM2-135M-Instruct"
    cfg = harness.BenchConfig(model=str(inside), quick=False, reps=1, dtype="float32", seed=0)
    assert harness.config_dict(cfg, turns=2)["model"] == "var/models/SmolLM2-135M-Instruct"
    elsewhere = harness.BenchConfig(model="/srv/x/models/tiny", quick=True, reps=1, dtype="float32", seed=0)
    assert harness.config_dict(elsewhere)["model"] == "models/tiny"
    assert harness.portable_path("var/models/tiny") == "var/models/tiny"
    for record in sorted((harness.ROOT / "bench" / "results").glob("*.json")):
        text = json.dumps(json.loads(record.read_text()))
        assert str(harness.ROOT) not in text and '"/work/' not in text and '"/home/' not in text, record.name


def test_fill_sides_reads_each_side_while_it_runs() -> None:
    class Running:
        def __init__(self, threads: int) -> None:
            self.threads = threads

        def resources(self) -> dict[str, int]:
            return {"forward_threads": self.threads}

    result = harness.BenchResult("b", {})
    harness.fill_sides(result, Running(2), Running(1), baseline_offline=Running(3))
    assert result.protocol()["sides"] == {
        "symphony": {"forward_threads": 2},
        "baseline": {"forward_threads": 1},
        "baseline_offline": {"forward_threads": 3},
    }


def test_the_baseline_gets_the_workers_device_and_host_pages() -> None:
    opts = harness.WorkerOptions(model="m", num_pages=40, host_pages=300)
    assert harness.baseline_blocks(opts) == 340
    assert harness.baseline_blocks(harness.WorkerOptions(model="m", num_pages=40)) == 40


def test_engine_time_counts_only_the_measured_stretches() -> None:
    """``EngineTime`` diffs the worker's cumulative buckets across each measured stretch, so the
    time between stretches (set-up, the baseline's turns) is left out of a figure's shares."""
    from bench.harness import EngineTime

    readings = iter(
        [
            {"busy_s": 10.0, "idle_with_work_queued_s": 1.0, "idle_empty_s": 50.0, "batch_wait_s": 0.5},
            {"busy_s": 19.0, "idle_with_work_queued_s": 1.5, "idle_empty_s": 50.5, "batch_wait_s": 0.7},
            {"busy_s": 30.0, "idle_with_work_queued_s": 9.0, "idle_empty_s": 90.0, "batch_wait_s": 1.0},
            {"busy_s": 39.0, "idle_with_work_queued_s": 9.5, "idle_empty_s": 90.5, "batch_wait_s": 1.2},
        ]
    )

    class Worker:
        def engine_time(self) -> dict[str, float]:
            return {"forwards": 0.0, **next(readings)}

    window = EngineTime(Worker())  # type: ignore[arg-type]
    for _ in range(2):
        with window.measure():
            pass
    got = window.to_dict()
    assert (got["busy_s"], got["idle_with_work_queued_s"], got["idle_empty_s"]) == (18.0, 1.0, 1.0)
    assert got["busy_fraction"] == 0.9 and got["idle_with_work_fraction"] == 0.05
    assert got["batch_wait_fraction"] == 0.02
    assert "busy 90.0%" in window.line()
