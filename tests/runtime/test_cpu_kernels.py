"""The dtype `auto` picks follows the CPU's kernels, said once per process, and a forced
lower ISA (ATEN_CPU_CAPABILITY=avx2, as on an AVX2-only CPU) takes the choice with it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = """
from art.runtime import models
import torch
print(models.torch_dtype("auto"), models.torch_dtype("auto"), torch.backends.cpu.get_cpu_capability())
"""


def run(**env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", SCRIPT],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )


def cpu_flags() -> set[str]:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


@pytest.mark.skipif(not Path("/proc/cpuinfo").exists(), reason="reads the CPU's flags from /proc")
def test_auto_is_bf16_only_on_avx512_kernels_with_native_bf16_and_is_said_once() -> None:
    native = run()
    first, second, capability = native.stdout.split()
    assert first == second
    bf16_hardware = bool(cpu_flags() & {"avx512_bf16", "amx_tile"})
    expected = bf16_hardware and capability.startswith("AVX512")
    assert first == ("torch.bfloat16" if expected else "torch.float32"), native.stdout
    said = [line for line in native.stderr.splitlines() if "CPU kernels" in line]
    assert len(said) == 1, native.stderr
    assert capability in said[0]


def test_forcing_avx2_kernels_picks_fp32_as_an_avx2_cpu_would() -> None:
    forced = run(ATEN_CPU_CAPABILITY="avx2")
    dtype, _, capability = forced.stdout.split()
    assert (dtype, capability) == ("torch.float32", "AVX2")
    assert "CPU kernels AVX2, no native bf16: dtype 'auto' is float32" in forced.stderr


def test_float32_decode_steps_multiply_with_onednn_said_and_overridable_by_name() -> None:
    said = run(ATEN_CPU_CAPABILITY="avx2").stderr
    assert (
        "float32 decode steps multiply with oneDNN (or MKL's packed GEMM where it times "
        "clearly faster on the model's layers), or torch's BLAS at 1-2 rows where it "
        "times clearly faster (ART_DECODE_GEMM=onednn|blas|mkl)"
    ) in said
    named = run(ATEN_CPU_CAPABILITY="avx2", ART_DECODE_GEMM="onednn").stderr
    assert "float32 decode steps multiply with oneDNN (ART_DECODE_GEMM" in named  # no split
    blas = run(ATEN_CPU_CAPABILITY="avx2", ART_DECODE_GEMM="blas").stderr
    assert "float32 decode steps multiply with torch's BLAS" in blas
    mkl = run(ATEN_CPU_CAPABILITY="avx2", ART_DECODE_GEMM="mkl").stderr
    assert "float32 decode steps multiply with MKL's packed GEMM on weights packed" in mkl
    with pytest.raises(subprocess.CalledProcessError) as refused:
        run(ART_DECODE_GEMM="openblas")
    assert "ART_DECODE_GEMM" in refused.value.stderr
    assert "not one of onednn, blas, mkl" in refused.value.stderr
