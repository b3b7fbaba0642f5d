"""How much of the host's CPU went to work that is not the benchmark's, per repetition.

The protocol marks a record ``busy`` when something else on the host competed with the two sides.
The 1-minute load average cannot say that: it counts the benchmark's own threads (two forward
threads, the client's threads, the stack's web and executor processes), so a benchmark on an
otherwise idle 2-core host read 2-4 and a bound on it either flagged quiet runs or missed busy
ones. Here the benchmark process and every process it starts are accounted in a cgroup of their
own (cgroup v1 ``cpuacct``: accounting only, no CPU weights or limits change), and the CPU the
host spent outside it is measured directly:

    other = (busy CPU of the whole host, /proc/stat) - (this benchmark's group)
            - (sandbox containers) - (the stack's daemons)

Sandbox containers (dockerd's ``/docker`` and the per-account ``/symphony-accounts`` groups, see
sandbox/cpu_groups.py) are the service's own work for the benchmarks that run programs in gVisor,
so they are reported apart and not counted as other work. So are the daemons the stack drives
(:data:`STACK_DAEMONS`: dockerd and containerd starting those containers, PostgreSQL and Redis
answering the control plane), which run outside any group of ours: a benchmark that starts 16
sandboxes a wave kept them at 0.3-0.4 of a core, read as "other work" until 2026-11-28. Another
test suite's containers or queries on the same host would be missed by these rules, and then
only the load average before the run shows them.

Where the ``cpuacct`` hierarchy is missing or not writable (not root, cgroup v2 only), nothing
is measured and the record says so (``other_cpus`` is ``None``).
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass
from pathlib import Path

#: The cgroup v1 accounting hierarchy.
CPUACCT = Path("/sys/fs/cgroup/cpuacct")
#: Prefix of the benchmark groups (one per benchmark process: ``symphony-bench-<pid>``).
PREFIX = "symphony-bench-"
#: The groups that hold the service's sandbox containers.
CONTAINER_GROUPS = ("docker", "symphony-accounts")
#: Processes (by ``comm``) of the daemons the stack drives; PostgreSQL's backends exit with their
#: connections, and their CPU then moves into their parent's (a daemon too) reaped-children time.
STACK_DAEMONS = frozenset({"dockerd", "containerd", "containerd-shim", "redis-server", "postgres"})
#: Of those, the ones whose reaped children's time is counted too (their children are theirs).
REAPING_DAEMONS = frozenset({"postgres"})
_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class CpuReading:
    """Cumulative CPU seconds at one instant."""

    wall: float
    host_busy: float
    own: float
    containers: float
    daemons: float = 0.0


def host_busy_s(stat: Path = Path("/proc/stat")) -> float:
    """Busy CPU seconds of the whole host since boot: every state of the ``cpu`` line but idle
    and iowait (guest time is already inside user and nice)."""
    fields = [int(x) for x in stat.read_text().split("\n", 1)[0].split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
    return (user + nice + system + irq + softirq + steal) * _TICK_S


def daemons_s(proc: Path = Path("/proc")) -> float:
    """CPU seconds the stack's daemons (:data:`STACK_DAEMONS`) have used, from their ``stat``
    files (a process that ended between two readings takes its time with it, unless a daemon
    reaped it)."""
    total = 0
    for stat in proc.glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            text = stat.read_text()
            comm = text[text.index("(") + 1 : text.rindex(")")]
            if comm not in STACK_DAEMONS:
                continue
            fields = text[text.rindex(")") + 2 :].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime
            if comm in REAPING_DAEMONS:
                total += int(fields[13]) + int(fields[14])  # cutime, cstime
    return total * _TICK_S


def _usage_s(group: Path) -> float:
    try:
        return int((group / "cpuacct.usage").read_text()) / 1e9
    except (OSError, ValueError):
        return 0.0


def _descendants(pid: int) -> list[int]:
    """``pid``'s living descendants, from /proc (children lists)."""
    out: list[int] = []
    stack = [pid]
    while stack:
        parent = stack.pop()
        for task in Path(f"/proc/{parent}/task").glob("*"):
            with contextlib.suppress(OSError):
                children = [int(c) for c in (task / "children").read_text().split()]
                out.extend(children)
                stack.extend(children)
    return out


class HostShare:
    """The benchmark's own cgroup, and readings of the host's CPU split three ways."""

    def __init__(self, root: Path = CPUACCT) -> None:
        self.root = root
        self.group: Path | None = None

    def track(self) -> bool:
        """Put this process and everything it already started (the two sides) in a fresh group;
        what they start later is born in it. False where cgroups cannot be used."""
        if self.group is not None:
            return True
        if not (self.root / "cgroup.procs").exists():
            return False
        self._prune()
        group = self.root / f"{PREFIX}{os.getpid()}"
        try:
            group.mkdir(exist_ok=True)
            for pid in [os.getpid(), *_descendants(os.getpid())]:
                with contextlib.suppress(ProcessLookupError):
                    (group / "cgroup.procs").write_text(str(pid))
        except OSError:
            return False
        self.group = group
        return True

    def read(self) -> CpuReading | None:
        if self.group is None:
            return None
        containers = sum(_usage_s(self.root / name) for name in CONTAINER_GROUPS)
        return CpuReading(time.monotonic(), host_busy_s(), _usage_s(self.group), containers, daemons_s())

    def _prune(self) -> None:
        """Remove earlier benchmarks' groups whose processes have all ended (the kernel refuses
        a group that still has tasks)."""
        for old in self.root.glob(f"{PREFIX}*"):
            with contextlib.suppress(OSError):
                old.rmdir()


def between(start: CpuReading, end: CpuReading) -> dict[str, float]:
    """CPU used between two readings, in cores (CPU seconds per wall second): ``own`` (the
    benchmark's processes), ``containers``, ``daemons`` (the stack's) and ``other`` (everything
    else on the host)."""
    wall = max(end.wall - start.wall, 1e-9)
    own = end.own - start.own
    containers = end.containers - start.containers
    daemons = max(end.daemons - start.daemons, 0.0)  # a daemon's exit can take time away
    other = (end.host_busy - start.host_busy) - own - containers - daemons
    return {
        "wall_s": round(wall, 3),
        "own_cpus": round(own / wall, 3),
        "container_cpus": round(containers / wall, 3),
        "daemon_cpus": round(daemons / wall, 3),
        "other_cpus": round(max(other, 0.0) / wall, 3),
    }
