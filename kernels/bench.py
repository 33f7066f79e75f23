"""Benchmark: Triton tree attention vs torch SDPA, LLaMA-7B attention shapes.

    python -m spectui.kernels.bench [--prefixes 512,1024,...] [--trees 16,32,64,128] [--peak-gbs 3350]

Per (prefix P, tree size T), B=1, 32 heads, D=128, fp16 by default, it times (median, L2 flushed
before every run by triton.testing.do_bench, so the host launch cost hides behind the flush):
  * tree     -- the Triton kernel (tree bits packed once outside the timed call, as the verifier
                does once per step for all layers);
  * sdpa+mask -- torch SDPA with the dense boolean [B, 1, T, P + T] mask (what "sdpa" would run);
  * sdpa     -- torch SDPA without a mask: the floor for "read K/V once", ignoring the tree.
Bandwidth = bytes of K and V read (2 * B * Hkv * (P + T) * D * itemsize) / kernel time, and the
share of peak HBM bandwidth (from the device properties, a known-GPU table, or --peak-gbs).
On a machine without CUDA it prints one line and exits 0.
"""

from __future__ import annotations

import argparse
import sys

import torch

# Peak HBM bandwidth in GB/s by device-name fragment, used when the properties do not give it.
KNOWN_PEAK_GBS = {"H200": 4800.0, "H100 PCIe": 2000.0, "H100": 3350.0, "A100-SXM4-80GB": 2039.0, "A100": 1555.0}


def peak_gbs(override: float | None) -> float | None:
    """Peak memory bandwidth of the current CUDA device in GB/s, or None if unknown."""
    if override:
        return override
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    clock_khz = getattr(props, "memory_clock_rate", 0)
    bus_bits = getattr(props, "memory_bus_width", 0)
    if clock_khz and bus_bits:
        return 2 * clock_khz * 1e3 * bus_bits / 8 / 1e9  # double data rate
    for frag, gbs in KNOWN_PEAK_GBS.items():
        if frag in props.name:
            return gbs
    return None


def kv_bytes(batch: int, kv_heads: int, prefix: int, tree: int, dim: int, itemsize: int) -> int:
    """Bytes of K and V the attention must read: the whole prefix plus the tree nodes, once."""
    return 2 * batch * kv_heads * (prefix + tree) * dim * itemsize


def random_tree_mask(batch: int, T: int, device: str, gen: torch.Generator) -> torch.Tensor:
    """bool [B, T, T] ancestor mask of a random tree (parent of node i drawn from 0..i-1)."""
    parent = [-1] + [int(torch.randint(0, i, (1,), generator=gen)) for i in range(1, T)]
    mask = torch.zeros(T, T, dtype=torch.bool)
    for i in range(T):
        j = i
        while j >= 0:
            mask[i, j] = True
            j = parent[j]
    return mask.expand(batch, T, T).contiguous().to(device)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m spectui.kernels.bench", description=__doc__.splitlines()[0])
    ap.add_argument("--prefixes", default="512,1024,2048,4096,8192,16384")
    ap.add_argument("--trees", default="16,32,64,128")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=None, help="default: --heads (LLaMA-7B has no GQA)")
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--dtype", choices=("float16", "bfloat16"), default="float16")
    ap.add_argument("--peak-gbs", type=float, default=None, help="peak HBM bandwidth, GB/s")
    ap.add_argument("--rep", type=int, default=100, help="ms of timed repetitions per measurement")
    args = ap.parse_args(argv)

    if not torch.cuda.is_available():
        print("spectui.kernels.bench: no CUDA device here; the Triton tree-attention benchmark needs a GPU.")
        return 0

    import triton.testing
    import torch.nn.functional as F

    from .reference import dense_tree_mask
    from .triton_tree import pack_tree_mask, tree_attention_triton

    dev, dtype = "cuda", getattr(torch, args.dtype)
    B, Hq, D = args.batch, args.heads, args.dim
    Hkv = args.kv_heads or Hq
    G = Hq // Hkv
    peak = peak_gbs(args.peak_gbs)
    gen = torch.Generator().manual_seed(0)
    print(f"device {torch.cuda.get_device_name()}, peak {peak or float('nan'):.0f} GB/s; "
          f"B={B} Hq={Hq} Hkv={Hkv} D={D} {args.dtype}; times in us (median)")
    head = (f"{'prefix':>6} {'T':>4} | {'tree':>8} {'GB/s':>7} {'%peak':>6} | {'sdpa+mask':>9} {'speedup':>7} |"
            f" {'sdpa':>8} {'tree/sdpa':>9} | {'maxerr':>8}")
    print(head)
    print("-" * len(head))
    for P in (int(x) for x in args.prefixes.split(",")):
        for T in (int(x) for x in args.trees.split(",")):
            q = torch.randn(B, Hq, T, D, device=dev, dtype=dtype)
            k = torch.randn(B, Hkv, P + T, D, device=dev, dtype=dtype)
            v = torch.randn(B, Hkv, P + T, D, device=dev, dtype=dtype)
            tree = random_tree_mask(B, T, dev, gen)
            bits = pack_tree_mask(tree)
            dense = dense_tree_mask(tree, P)  # [B, 1, T, P + T]
            out = torch.empty_like(q)
            kr, vr = (k, v) if G == 1 else (k.repeat_interleave(G, 1), v.repeat_interleave(G, 1))

            def run_tree():
                tree_attention_triton(q, k, v, None, P, tree_bits=bits, out=out)

            def run_masked():
                return F.scaled_dot_product_attention(q, kr, vr, attn_mask=dense)

            def run_floor():
                return F.scaled_dot_product_attention(q, kr, vr)

            run_tree()
            err = (out.float() - run_masked().float()).abs().max().item()
            t_tree, t_mask, t_floor = (
                triton.testing.do_bench(fn, rep=args.rep, return_mode="median") * 1e3
                for fn in (run_tree, run_masked, run_floor)
            )
            gbs = kv_bytes(B, Hkv, P, T, D, q.element_size()) / (t_tree * 1e-6) / 1e9
            pct = f"{100 * gbs / peak:5.1f}%" if peak else "   n/a"
            print(f"{P:>6} {T:>4} | {t_tree:8.1f} {gbs:7.0f} {pct:>6} | {t_mask:9.1f} {t_mask / t_tree:6.2f}x |"
                  f" {t_floor:8.1f} {t_tree / t_floor:8.2f}x | {err:8.1e}")
            del q, k, v, kr, vr, dense, out
    return 0


if __name__ == "__main__":
    sys.exit(main())
