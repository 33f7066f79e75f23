#!/usr/bin/env python
# Usage: .venv/bin/python scripts/bench_nf4.py [--against REV] [--rows 1 2 4 8 64] [--rounds 5]
#        [--threads 2] [--layers 30]
"""kernels/nf4_cpu.c against itself at another commit: the same products, the libraries side by side.

Builds this tree's nf4_cpu.c and, with --against, the one at git revision REV (kernels/native.py's
flags), then times y = x @ W^T over the 4-bit layers of a SmolLM2-135M-shaped model (q|k|v 960x576,
o 576x576, gate|up 3072x576, down 576x1536, random 4-bit weights in blocks of 64) for each row count,
the libraries alternated round by round so that this machine's drift hits them alike. Before timing
it checks that both libraries give the same bits for every row count, and that a row's bits do not
depend on the rows beside it. Medians in ms.
"""

from __future__ import annotations

import argparse
import ctypes as ct
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from spectui.kernels import native
from spectui.kernels.nf4_cpu import ARGTYPES

ROOT = Path(__file__).resolve().parent.parent

SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)]  # (N, K) of one layer's products
BLOCK = 64


def build(source: Path, out: Path):
    """Compile one nf4_cpu.c (its folder's headers beside it) -> the library's spectui_nf4_matmul."""
    subprocess.run([native.compiler(), *native.FLAGS, str(source), "-o", str(out), "-lm"], check=True)
    fn = ct.CDLL(str(out)).spectui_nf4_matmul
    fn.argtypes, fn.restype = ARGTYPES, ct.c_int
    return fn


def source_at(rev: str, folder: Path) -> Path:
    """kernels/ at git revision rev, written into folder (the .c files and their headers)."""
    names = subprocess.run(["git", "-C", str(ROOT), "ls-tree", "--name-only", rev, "kernels/"], check=True,
                           capture_output=True, text=True).stdout.split()
    for name in names:
        if name.endswith((".c", ".h")):
            text = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:{name}"], check=True,
                                  capture_output=True).stdout
            (folder / Path(name).name).write_bytes(text)
    return folder / "nf4_cpu.c"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--against", help="a git revision whose nf4_cpu.c to time beside this tree's")
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 2, 3, 4, 5, 6, 7, 8, 12, 64])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--layers", type=int, default=30)
    args = ap.parse_args()
    if native.compiler() is None or not native.cpu_supported():
        sys.exit("bench_nf4: needs x86-64 with AVX2/FMA and a C compiler")
    tmp = Path(tempfile.mkdtemp(prefix="bench-nf4-"))
    libraries = {"this tree": build(ROOT / "kernels" / "nf4_cpu.c", tmp / "now.so")}
    if args.against:
        (tmp / "old").mkdir()
        libraries[args.against] = build(source_at(args.against, tmp / "old"), tmp / "old.so")

    from bitsandbytes.functional import get_4bit_type

    gen = torch.Generator().manual_seed(0)
    code = get_4bit_type("nf4", device="cpu").float().contiguous()  # [16]: bitsandbytes' own NF4 table
    layers = [(N, K, torch.randint(0, 256, (N * K // 2,), dtype=torch.uint8, generator=gen),
               torch.rand(N * K // BLOCK, generator=gen) * 0.1 + 0.01)
              for _ in range(args.layers) for N, K in SHAPES]

    def product(fn, M: int, x: torch.Tensor, N: int, K: int, w, absmax, threads: int) -> torch.Tensor:
        y = torch.empty(M, N)
        if fn(M, N, K, x.data_ptr(), K, w.data_ptr(), absmax.data_ptr(), BLOCK, code.data_ptr(), y.data_ptr(), N,
              threads, 0):
            raise MemoryError("nf4_cpu.c could not allocate")
        return y

    inputs = {(M, K): torch.randn(M, K, generator=gen) for M in args.rows for K in {k for _, k in SHAPES}}
    N, K, w, absmax = layers[2]  # the gate|up shape: bits checked here
    for M in args.rows:
        x = inputs[(M, K)]
        outs = [product(fn, M, x, N, K, w, absmax, args.threads) for fn in libraries.values()]
        alone = torch.cat([product(next(iter(libraries.values())), 1, x[i:i + 1].clone(), N, K, w, absmax, 1)
                           for i in range(M)])
        if not all(torch.equal(o, outs[0]) for o in outs) or not torch.equal(alone, outs[0]):
            sys.exit(f"bench_nf4: {M} rows: the libraries' bits differ, or a row's bits depend on its neighbours")

    times = {(name, M): [] for name in libraries for M in args.rows}
    for round_ in range(args.rounds + 1):  # round 0 warms up (threads, caches) and is not kept
        for M in args.rows:
            for name, fn in libraries.items():
                start = time.perf_counter()
                for N, K, w, absmax in layers:
                    product(fn, M, inputs[(M, K)], N, K, w, absmax, args.threads)
                if round_:
                    times[(name, M)].append((time.perf_counter() - start) * 1e3)
    print(f"ms for the {args.layers} layers' products, {args.threads} threads, median of {args.rounds} rounds "
          "(bits equal)")
    print("| rows | " + " | ".join(libraries) + " |")
    print("|---:|" + "---:|" * len(libraries))
    for M in args.rows:
        print(f"| {M} | " + " | ".join(f"{statistics.median(times[(name, M)]):.2f}" for name in libraries) + " |")


if __name__ == "__main__":
    main()
