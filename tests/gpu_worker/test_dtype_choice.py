"""The worker's ``--dtype auto``: float32 on a CPU that only emulates bf16, the checkpoint's
dtype where bf16 is native; and on this machine, the real worker reports what it chose."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_worker.dtype_choice import choose_dtype, cpu_flags, cpu_has_native_bf16

X86 = "processor\t: 0\nvendor_id\t: GenuineIntel\nflags\t\t: fpu sse2 avx2 {extra}\nbugs\t\t:\n"
ARM = "processor\t: 0\nFeatures\t: fp asimd {extra}\nCPU implementer\t: 0x41\n"


@pytest.mark.parametrize(
    ("text", "native"),
    [
        (X86.format(extra="avx512f"), False),
        (X86.format(extra="avx512f avx512_bf16"), True),
        (X86.format(extra="amx_tile amx_bf16"), True),
        (ARM.format(extra="sve"), False),
        (ARM.format(extra="bf16 i8mm"), True),
    ],
)
def test_native_bf16_is_read_from_the_cpu_flags(tmp_path: Path, text: str, native: bool) -> None:
    info = tmp_path / "cpuinfo"
    info.write_text(text)
    assert cpu_has_native_bf16(info) is native
    want = "auto" if native else "float32"
    assert choose_dtype("auto", on_gpu=False, cpuinfo=info)[0] == want


def test_a_gpu_or_an_explicit_dtype_is_kept(tmp_path: Path) -> None:
    info = tmp_path / "cpuinfo"
    info.write_text(X86.format(extra=""))
    assert choose_dtype("auto", on_gpu=True, cpuinfo=info)[0] == "auto"
    assert choose_dtype("bfloat16", on_gpu=False, cpuinfo=info) == ("bfloat16", "as asked (--dtype)")
    assert cpu_flags(tmp_path / "missing") == set()


@pytest.mark.integration
@pytest.mark.vllm
@pytest.mark.timeout(300)
def test_the_real_worker_serves_auto_in_what_this_cpu_computes_natively(default_model_dir: Path) -> None:
    from tests.plugins.worker import start_worker

    with start_worker(default_model_dir, dtype="auto", name="dtype-auto", num_pages=160) as worker:
        health = worker.admin.health()
    want = "bfloat16" if cpu_has_native_bf16() else "float32"  # the default checkpoint is bf16
    assert health["dtype"] == want, health
