"""A finished run's classification (succeeded, failed, timed_out, killed) from its captured
output and exit: one place for cold and warm runs."""

from __future__ import annotations

import logging
from typing import Any

from sandbox.containers import OutputWatch
from sandbox.spec import SandboxResult, SandboxSpec

log = logging.getLogger(__name__)


def finish_result(
    res: SandboxResult, spec: SandboxSpec, watch: OutputWatch, exit_code: int | None, state: dict[str, Any]
) -> None:
    """Fill ``res`` from the captured output and the exit: one classification for cold and warm runs."""
    cap = watch.collector.result()
    killed = watch.killed
    res.exit_code, res.stdout, res.stderr, res.output_bytes = exit_code, cap.stdout, cap.stderr, cap.total_bytes
    record = cap.record or {}
    if "deadline" in killed:
        res.status, res.error = "timed_out", f"deadline of {spec.deadline_s:g}s exceeded; the sandbox was killed"
    elif "output" in killed or cap.exceeded:
        res.status = "killed"
        res.error = f"output limit of {spec.output_limit_bytes} bytes exceeded; the sandbox was killed"
    elif state.get("OOMKilled"):
        res.status, res.error = "killed", f"memory limit of {spec.memory_mb} MiB exceeded; the sandbox was killed"
    elif exit_code == 0 and record.get("ok"):
        res.status, res.result = "succeeded", record.get("result")
    elif exit_code == 0:
        res.error = "the program exited without reporting a result"
    elif record.get("error"):
        res.error = str(record["error"])
    elif exit_code is not None and exit_code >= 128:
        res.status = "killed"
        res.error = (
            f"the sandbox was killed by signal {exit_code - 128} (memory limit of {spec.memory_mb} MiB?)"
            + _tail(cap.stderr)
        )
    elif cap.record is None:
        # The runner always prints a record unless the whole sandbox died under it.
        res.error = (
            f"the sandbox died with status {exit_code} before the program finished"
            f" (killed or crashed; e.g. its process limit of {spec.pids} was hit)" + _tail(cap.stderr)
        )
    else:
        res.error = f"the sandbox exited with status {exit_code}" + _tail(cap.stderr)
    log.info(
        "event=sandbox_done run=%s tenant=%s status=%s exit=%s start_s=%.3f run_s=%.3f output_bytes=%d warm=%s",
        spec.run_id,
        spec.tenant,
        res.status,
        exit_code,
        res.start_s,
        res.duration_s,
        res.output_bytes,
        bool(res.timings.get("warm")),
    )


def _tail(text: str, n: int = 2000) -> str:
    text = text.strip()
    return f": {text[-n:]}" if text else ""
