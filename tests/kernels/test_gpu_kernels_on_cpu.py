"""The GPU suite's kernel checks, exercised on this CPU as far as they go without a GPU (issue 15):

* tests/gpu/test_kernel_cuda.py's random-case generator, one case per shape family (18), run on
  CPU tensors through triton's interpreter (this folder's conftest sets TRITON_INTERPRET=1), with
  prefixes up to 1,024 tokens (the GPU run draws them up to 4,096; the interpreter's time grows with
  the prefix, and every split and tile path is reached below 1,024);
* the kernels compiled for an H100 (sm_90) by triton's own pipeline and ptxas, with no GPU
  (scripts/triton_sm90_compile.py --quick, in a subprocess: it swaps triton's driver).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_gpu_random_cases_run_interpreted_on_cpu():
    gpu = load(ROOT / "tests" / "gpu" / "test_kernel_cuda.py", "gpu_kernel_cases")
    # every other family: head dims 64 / 80 / 96 / 128, groups 1, 2, 3, 4, 7 and 8, both dtypes, split
    # counts 1, 3, 7 and automatic, batches 1-3. The interpreter has no compiles to tell the rest apart
    # (their constexpr sets matter to the GPU run, which takes all 18): 19 s here against 61-68 s for all.
    every_other = range(0, len(gpu.FAMILIES), 2)
    stats = gpu.check_cases("cpu", len(gpu.FAMILIES), max_p=1024, families=every_other)
    assert not stats["failures"], "\n".join(stats["failures"])
    assert stats["cases"] == len(every_other) == 9
    shapes = {(gpu.FAMILIES[i].dim, gpu.FAMILIES[i].hq // gpu.FAMILIES[i].hkv) for i in every_other}
    assert {d for d, _ in shapes} == {64, 80, 96, 128} and {g for _, g in shapes} == {1, 2, 3, 4, 7, 8}
    assert 0 < stats["max_tol_ratio"] <= 1.0 and set(stats["max_abs_err"]) == {"float16", "bfloat16"}


@pytest.mark.slow  # a process compiling three kernels: ~6 s of the quick loop
def test_kernels_compile_for_sm90_without_a_gpu():
    import triton

    ptxas = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
    if not ptxas.exists():
        pytest.skip(f"this triton ships no ptxas ({ptxas})")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "triton_sm90_compile.py"), "--quick"],
                         capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "3 kernels compiled for cuda/sm_90; 0 over the shared memory limit" in out.stdout
    assert "SPLIT': True" in out.stdout and "SPLIT': False" in out.stdout and "spills 0" in out.stdout
