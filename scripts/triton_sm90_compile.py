"""Compile the Triton tree-attention kernels for an H100 (sm_90) on a machine without a GPU.

    python scripts/triton_sm90_compile.py [--quick]

The interpreter (TRITON_INTERPRET=1) checks what the kernels compute; this checks that they
compile for the GPU: Triton's real pipeline (TTIR -> TTGIR -> LLVM -> PTX -> cubin through the
ptxas bundled with triton) for target cuda/90, with the launch options the GPU would get
(tensor-core tf32/fp16/bf16 dots, the launcher's warps and stages). triton's active driver is
replaced by one that only names that target, and the launcher's kernels by wrappers that compile
(JITFunction.run(warmup=True)) instead of launching, so nothing runs and no GPU is needed.

For every distinct compile it prints the constexprs, warps, stages, shared memory and ptxas'
registers and spills, and fails (exit 1) when a compile fails or needs more shared memory than an
H100 block may have (227 KB). This uses triton internals (driver.set_active, JITFunction.run's
warmup), checked with triton 3.6 (the GPU machine's) and 3.9 (ours).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import sys

import torch

os.environ.setdefault("TRITON_ALWAYS_COMPILE", "1")  # a real compile every time, not triton's cache
os.environ.setdefault("TRITON_DUMP_PTXAS_LOG", "1")  # ptxas -v: registers and spills
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # triton 3.9 warns while it is unset

H100_SMEM = 232448  # bytes of shared memory one block may use on sm_90
# (dtype, T, prefix, forced splits) : the verifier's shapes (LLaMA-7B attention, 32 heads, D=128)
QUICK = [(torch.float16, 8, 512, None), (torch.bfloat16, 64, 4096, 4)]
FULL = [(dt, T, P, s) for dt in (torch.float16, torch.bfloat16) for T in (8, 32, 64, 128)
        for P, s in ((0, None), (512, 1), (4096, 8))] + [(torch.float32, 16, 256, None)]


class TargetOnlyDriver:
    """Stands in for triton's CUDA driver: names the target, launches nothing."""

    def get_current_target(self):
        from triton.backends.compiler import GPUTarget

        return GPUTarget("cuda", 90, 32)

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def get_active_torch_device(self):
        return torch.device("cpu")


class CompileOnly:
    """kernel[grid](*args, **meta) -> compile for the target, record it, launch nothing."""

    def __init__(self, fn, compiles: list):
        from triton.runtime.jit import JITFunction

        self.jit, self.compiles = JITFunction(fn), compiles

    def __getitem__(self, grid):
        def compile_(*args, **meta):
            if "DOT_PREC" in meta and meta["DOT_PREC"] == "ieee" and args[0].dtype != torch.float32:
                meta = {**meta, "DOT_PREC": "tf32", "DOT_F32": False}  # what a GPU launch passes
            log = io.StringIO()
            with contextlib.redirect_stdout(log):
                kernel = self.jit.run(*args, grid=grid, warmup=True, **meta)
            regs = re.findall(r"Used (\d+) registers", log.getvalue())
            spills = re.findall(r"(\d+) bytes spill stores", log.getvalue())
            self.compiles.append(dict(kernel=self.jit.__name__, shared=kernel.metadata.shared,
                                      regs=regs, spills=spills,
                                      meta={k: v for k, v in meta.items() if k.isupper() or k.startswith("num")}))
            return kernel

        return compile_


def compile_all(configs) -> list[dict]:
    import triton
    from triton.runtime.driver import driver

    from spectui.kernels import triton_tree
    from spectui.kernels.triton_tree import pack_tree_mask, tree_attention_triton

    compiles: list[dict] = []
    kernels = (CompileOnly(triton_tree._tree_attn_fwd, compiles), CompileOnly(triton_tree._tree_attn_combine, compiles))
    saved_kernels, saved_knob, saved_driver = triton_tree._kernels, triton.knobs.runtime.interpret, driver._active
    driver.set_active(TargetOnlyDriver())
    triton_tree._kernels = lambda interpreted: kernels
    triton.knobs.runtime.interpret = False
    try:
        for dtype, T, P, splits in configs:
            q = torch.empty(1, 32, T, 128, dtype=dtype)
            kv = torch.empty(1, 32, P + T, 128, dtype=dtype)
            bits = pack_tree_mask(torch.ones(1, T, T, dtype=torch.bool).tril())
            tree_attention_triton(q, kv, kv, None, P, tree_bits=bits, num_splits=splits)
    finally:
        triton_tree._kernels = saved_kernels
        triton.knobs.runtime.interpret = saved_knob
        driver._active = saved_driver  # not reset_active(): that builds the default driver, which needs a GPU
    return compiles


def main(argv: list[str] | None = None) -> int:
    import triton

    ap = argparse.ArgumentParser(prog="scripts/triton_sm90_compile.py", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="two configurations instead of 25")
    args = ap.parse_args(argv)
    try:
        compiles = compile_all(QUICK if args.quick else FULL)
    except Exception as exc:  # a compile error: one line, exit 1
        print(f"triton_sm90_compile: compile failed with triton {triton.__version__}: {type(exc).__name__}: "
              f"{str(exc).splitlines()[0] if str(exc) else ''}")
        return 1
    over = [c for c in compiles if c["shared"] > H100_SMEM]
    for c in compiles:
        print(f"{c['kernel']:18s} {c['meta']} smem {c['shared']} regs {','.join(c['regs'])} spills {','.join(c['spills']) or 0}")
    print(f"triton {triton.__version__}: {len(compiles)} kernels compiled for cuda/sm_90; {len(over)} over the shared memory limit")
    return 1 if over or not compiles else 0


if __name__ == "__main__":
    sys.exit(main())
