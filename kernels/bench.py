"""Benchmark: Triton tree attention vs torch SDPA and eager attention, LLaMA-7B attention shapes.

    python -m spectui.kernels.bench [--prefixes 512,2048,4096] [--trees 8,32,64] [--sweep] [--json PATH]

Per (prefix P, tree size T), B=1, 32 heads, D=128, fp16 by default, it times (median, L2 flushed
before every run by triton.testing.do_bench, so the host launch cost mostly hides behind the flush):
  * tree      -- the Triton kernel (tree bits packed once outside the timed call, as the verifier
                 does once per step for all layers);
  * sdpa+mask -- torch SDPA with the dense boolean [B, 1, T, P + T] mask (what "sdpa" would run);
  * eager     -- q @ k^T * scale, masked_fill, softmax in fp32, @ v (transformers' "eager");
  * sdpa      -- torch SDPA without a mask: the floor for "read K/V once", ignoring the tree;
  * loop      -- the kernel called 200 times back to back (no flush, one sync): per-call wall time,
                 which exceeds "tree" where the host's launch cost (Python + triton) dominates.
Bandwidth = bytes of K and V read (2 * B * Hkv * (P + T) * D * itemsize) / kernel time, as a share
of the MEASURED peak (a 1 GiB device-to-device copy: bytes read + written / time) and of the spec
sheet's peak (device properties, a known-GPU table, or --peak-gbs) where known.
--sweep also times the kernel per (P, T) with num_splits forced to 1, 2, 4, 8, 16, 32 and auto,
and with BLOCK_N in (32, 64, 128) x num_warps in (4, 8) (auto splits), so one GPU run shows the
best choices. --json PATH writes everything as JSON. Without CUDA it prints one line (and writes
{"skipped": "no CUDA"} to --json) and exits 0.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import torch

from .reference import ancestor_mask

# Peak HBM bandwidth in GB/s by device-name fragment, used when the properties do not give it.
KNOWN_PEAK_GBS = {"H200": 4800.0, "H100 PCIe": 2000.0, "H100": 3350.0, "A100-SXM4-80GB": 2039.0, "A100": 1555.0}
SWEEP_SPLITS = (1, 2, 4, 8, 16, 32, None)  # None: the launcher's automatic choice
SWEEP_BLOCK_N = (32, 64, 128)
SWEEP_WARPS = (4, 8)
COPY_BYTES = 1 << 30
DEVICE = "cuda"


def peak_gbs(override: float | None) -> float | None:
    """Spec-sheet peak memory bandwidth of the current CUDA device in GB/s, or None if unknown."""
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


def copy_peak_gbs(rep: int, nbytes: int = COPY_BYTES) -> float:
    """Measured device bandwidth: a `nbytes` device-to-device copy, (bytes read + written) / median time."""
    import triton.testing

    src = torch.empty(nbytes, dtype=torch.uint8, device=DEVICE).fill_(1)
    dst = torch.empty_like(src)
    ms = triton.testing.do_bench(lambda: dst.copy_(src), rep=max(rep, 50), return_mode="median")
    del src, dst
    torch.cuda.empty_cache()
    return 2 * nbytes / (ms * 1e-3) / 1e9


def kv_bytes(batch: int, kv_heads: int, prefix: int, tree: int, dim: int, itemsize: int) -> int:
    """Bytes of K and V the attention must read: the whole prefix plus the tree nodes, once."""
    return 2 * batch * kv_heads * (prefix + tree) * dim * itemsize


def random_tree_mask(batch: int, T: int, device: str, gen: torch.Generator) -> torch.Tensor:
    """bool [B, T, T] ancestor mask of a random tree (parent of node i drawn from 0..i-1)."""
    parent = [-1] + [int(torch.randint(0, i, (1,), generator=gen)) for i in range(1, T)]
    mask = ancestor_mask(parent)  # [T, T]
    return mask.expand(batch, T, T).contiguous().to(device)


def eager_attention(q, k, v, mask, scale):
    """transformers' eager attention: fp16 scores, masked, softmax in fp32, back to fp16 for @ v."""
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale
    scores = scores.masked_fill(~mask, float("-inf"))
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.matmul(probs, v)


def _fmt(x: float | None, spec: str, width: int) -> str:
    return f"{x:{width}{spec}}" if isinstance(x, (int, float)) and math.isfinite(x) else f"{'n/a':>{width}}"


def _write_json(path: str | None, payload: dict) -> None:
    if not path:
        return
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    with open(path, "w") as fh:
        json.dump(payload, fh, indent=1)
        fh.write("\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m spectui.kernels.bench", description=__doc__.splitlines()[0])
    ap.add_argument("--prefixes", default="512,2048,4096")
    ap.add_argument("--trees", default="8,32,64")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=None, help="default: --heads (LLaMA-7B has no GQA)")
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--dtype", choices=("float16", "bfloat16"), default="float16")
    ap.add_argument("--peak-gbs", type=float, default=None, help="spec-sheet peak HBM bandwidth, GB/s")
    ap.add_argument("--rep", type=int, default=50, help="ms of timed repetitions per measurement")
    ap.add_argument("--sweep", action="store_true", help="also time forced num_splits and BLOCK_N x num_warps")
    ap.add_argument("--json", default=None, metavar="PATH", help="write the results as JSON to PATH")
    args = ap.parse_args(argv)

    if not torch.cuda.is_available():
        print("spectui.kernels.bench: no CUDA device here; the Triton tree-attention benchmark needs a GPU.")
        _write_json(args.json, {"skipped": "no CUDA"})
        return 0
    report: dict = {"rows": []}
    started = time.perf_counter()
    try:
        run(args, report)
    except BaseException as exc:  # keep what was measured: the JSON is written either way
        report["error"] = f"{type(exc).__name__}: {exc}"
        raise
    finally:
        report["elapsed_s"] = round(time.perf_counter() - started, 1)
        _write_json(args.json, report)
    return 0


def run(args: argparse.Namespace, report: dict) -> None:
    """The benchmark proper (CUDA only); fills `report` as it goes."""
    import torch.nn.functional as F
    import triton
    import triton.testing

    from .reference import dense_tree_mask
    from .triton_launch import launch_plan
    from .triton_tree import pack_tree_mask, tree_attention_triton

    dev, dtype = DEVICE, getattr(torch, args.dtype)
    B, Hq, D = args.batch, args.heads, args.dim
    Hkv = args.kv_heads or Hq
    G = Hq // Hkv
    scale = D**-0.5
    spec = peak_gbs(args.peak_gbs)
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    copy_peak = copy_peak_gbs(args.rep)
    report.update({
        "device": props.name, "capability": f"{props.major}.{props.minor}", "sms": props.multi_processor_count,
        "torch": torch.__version__, "triton": triton.__version__,
        "shape": {"batch": B, "heads": Hq, "kv_heads": Hkv, "dim": D, "dtype": args.dtype},
        "rep_ms": args.rep, "peak_copy_gbs": round(copy_peak, 1), "peak_spec_gbs": spec,
        "units": "times in microseconds (median); gbs = K/V bytes read / kernel time",
    })
    gen = torch.Generator().manual_seed(0)

    def bench(fn) -> float:
        return triton.testing.do_bench(fn, rep=args.rep, return_mode="median") * 1e3

    print(f"device {props.name}, copy peak {copy_peak:.0f} GB/s (1 GiB device copy), spec peak "
          f"{_fmt(spec, '.0f', 1)} GB/s; B={B} Hq={Hq} Hkv={Hkv} D={D} {args.dtype}; times in us (median)")
    head = (f"{'prefix':>6} {'T':>4} | {'tree':>7} {'GB/s':>6} {'%copy':>6} {'%spec':>6} {'loop':>6} |"
            f" {'sdpa+mask':>9} {'speedup':>7} |"
            f" {'eager':>7} {'speedup':>7} | {'sdpa':>7} {'tree/sdpa':>9} | {'maxerr':>8}")
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

            def run_tree(**kw):
                return tree_attention_triton(q, k, v, None, P, scale, tree_bits=bits, out=out, **kw)

            def run_masked():
                return F.scaled_dot_product_attention(q, kr, vr, attn_mask=dense, scale=scale)

            def run_eager():
                return eager_attention(q, kr, vr, dense, scale)

            def run_floor():
                return F.scaled_dot_product_attention(q, kr, vr, scale=scale)

            want = run_masked().float()
            err = (run_tree().float() - want).abs().max().item()
            t_tree, t_mask, t_eager, t_floor = (bench(fn) for fn in (run_tree, run_masked, run_eager, run_floor))
            t_loop = back_to_back_us(run_tree)
            g_tree, g_mask = graph_us(run_tree, bench), graph_us(run_masked, bench)
            gbs = kv_bytes(B, Hkv, P, T, D, q.element_size()) / (t_tree * 1e-6) / 1e9
            plan = launch_plan(B, Hq, Hkv, T, D, P, dtype, q.device)
            row = {
                "prefix": P, "tree": T, "tree_us": t_tree, "sdpa_mask_us": t_mask, "eager_us": t_eager,
                "sdpa_us": t_floor, "tree_back_to_back_us": t_loop,
                "speedup_vs_sdpa_mask": t_mask / t_tree, "speedup_vs_eager": t_eager / t_tree,
                "tree_vs_sdpa_floor": t_tree / t_floor, "kernel_gbs": gbs, "pct_copy_peak": 100 * gbs / copy_peak,
                "pct_spec_peak": 100 * gbs / spec if spec else None, "max_err_vs_sdpa_mask": err,
                "plan": plan._asdict(),
                "tree_graph_us": g_tree, "sdpa_mask_graph_us": g_mask,
                "kernel_graph_gbs": kv_bytes(B, Hkv, P, T, D, q.element_size()) / (g_tree * 1e-6) / 1e9 if g_tree else None,
            }
            if g_tree:
                row["pct_copy_peak_graph"] = 100 * row["kernel_graph_gbs"] / copy_peak
                row["graph_speedup_vs_sdpa_mask"] = g_mask / g_tree if g_mask else None
            print(f"{P:>6} {T:>4} | {t_tree:7.1f} {gbs:6.0f} {_fmt(row['pct_copy_peak'], '.1f', 5)}% "
                  f"{_fmt(row['pct_spec_peak'], '.1f', 5)}% {t_loop:6.1f} | {t_mask:9.1f} {t_mask / t_tree:6.2f}x |"
                  f" {t_eager:7.1f} {t_eager / t_tree:6.2f}x | {t_floor:7.1f} {t_tree / t_floor:8.2f}x | {err:8.1e}")
            if g_tree:
                print(f"{'':>11} replayed from a CUDA graph (no host launch cost): tree {g_tree:.1f} us, "
                      f"{row['kernel_graph_gbs']:.0f} GB/s, {row['pct_copy_peak_graph']:.1f}% copy; sdpa+mask "
                      f"{_fmt(g_mask, '.1f', 1)} us ({_fmt(row['graph_speedup_vs_sdpa_mask'], '.2f', 1)}x)")
            if args.sweep:
                row["sweep"] = sweep(run_tree, bench, want, lambda **kw: launch_plan(B, Hq, Hkv, T, D, P, dtype,
                                                                                     q.device, **kw))
                print(f"{'':>11} sweep: {row['sweep']['summary']}")
            report["rows"].append(row)
            del q, k, v, kr, vr, dense, out, want


def back_to_back_us(fn, calls: int = 200) -> float:
    """Wall time per call of `calls` back-to-back calls (no L2 flush, one sync at the end): the larger
    of the GPU time and the host's launch cost, i.e. what a layer loop without CUDA graphs pays."""
    fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / calls * 1e6


def graph_us(fn, bench) -> float | None:
    """Median time of `fn` replayed from a CUDA graph: the GPU's time without the host's launch cost,
    which is what a decode step captured in CUDA graphs pays (the plain timings above include the
    Python launcher, hundreds of us on the first H100 run). None where capture fails."""
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm up off the capture stream, as torch's graph docs do
            fn()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        return bench(graph.replay)
    except Exception as exc:  # e.g. a host sync inside fn: report the plain timings alone
        print(f"{'':>11} CUDA graph capture failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
        return None


def sweep(run_tree, bench, want: torch.Tensor, plan_of) -> dict:
    """Kernel time (us) with num_splits forced to each of SWEEP_SPLITS, and for every BLOCK_N x
    num_warps with auto splits; each entry also has the launch plan and the max error vs SDPA.
    A configuration that fails is recorded with its error instead of stopping the benchmark."""

    def one(**kw) -> dict:
        entry = {"plan": plan_of(**kw)._asdict()}
        try:
            entry["max_err"] = (run_tree(**kw).float() - want).abs().max().item()
            entry["us"] = bench(lambda: run_tree(**kw))
        except Exception as exc:  # a compile or launch failure of one configuration
            entry["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        return entry

    splits = {("auto" if s is None else str(s)): one(num_splits=s) for s in SWEEP_SPLITS}
    blocks = {f"block_n={bn},num_warps={nw}": one(block_n=bn, num_warps=nw)
              for bn in SWEEP_BLOCK_N for nw in SWEEP_WARPS}
    timed = [e for e in (*splits.values(), *blocks.values()) if "us" in e]
    best_split = min((k for k in splits if "us" in splits[k]), key=lambda k: splits[k]["us"], default=None)
    best_block = min((k for k in blocks if "us" in blocks[k]), key=lambda k: blocks[k]["us"], default=None)
    auto_us = splits["auto"].get("us")
    summary = (f"best splits={best_split} ({_fmt(splits[best_split]['us'] if best_split else None, '.1f', 1)} us, "
               f"auto {_fmt(auto_us, '.1f', 1)} us = splits={splits['auto']['plan']['splits']}); "
               f"best {best_block} ({_fmt(blocks[best_block]['us'] if best_block else None, '.1f', 1)} us); "
               f"{len(timed)}/{len(splits) + len(blocks)} configs ran")
    return {"splits": splits, "blocks": blocks, "best_splits": best_split, "best_block": best_block,
            "auto_vs_best_split": auto_us / splits[best_split]["us"] if auto_us and best_split else None,
            "summary": summary}


if __name__ == "__main__":
    sys.exit(main())
