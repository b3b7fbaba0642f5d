"""Which dtype the worker serves in: exact where the hardware would only emulate bf16.

The default checkpoint is bf16. A CPU without native bf16 (no AVX512_BF16 or AMX-BF16 on x86,
no BF16 on Arm) emulates it, rounding each op's result back to bf16: near-ties then flip between
a batched decode and a multi-position verify, so greedy outputs and seeded samples depend on how
calls were batched (the speculative example's "equals greedy" claim failed on some prompts, and
seeded runs differed under load). In float32 they agree (what ``tests/`` run). On such a CPU
``auto`` therefore means float32; on a GPU, or a CPU with native bf16, it keeps the
checkpoint's dtype. An explicit ``--dtype`` is always used as given.
"""

from __future__ import annotations

from pathlib import Path

#: ``/proc/cpuinfo`` flags that mean the CPU computes bf16 natively.
NATIVE_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16", "bf16"})


def cpu_flags(cpuinfo: str | Path = "/proc/cpuinfo") -> set[str]:
    """The CPU's feature flags (x86 ``flags``, Arm ``Features``); empty when unreadable."""
    try:
        text = Path(cpuinfo).read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return set(value.split())
    return set()


def cpu_has_native_bf16(cpuinfo: str | Path = "/proc/cpuinfo") -> bool:
    return bool(cpu_flags(cpuinfo) & NATIVE_BF16_FLAGS)


def choose_dtype(requested: str, on_gpu: bool, cpuinfo: str | Path = "/proc/cpuinfo") -> tuple[str, str]:
    """The dtype to give the engine for ``--dtype requested``, and why (for the log)."""
    if requested != "auto":
        return requested, "as asked (--dtype)"
    if on_gpu:
        return "auto", "the checkpoint's dtype (GPU)"
    if cpu_has_native_bf16(cpuinfo):
        return "auto", "the checkpoint's dtype (the CPU has native bf16)"
    return "float32", "the CPU has no native bf16 (avx512_bf16/amx_bf16): float32 keeps results exact"
