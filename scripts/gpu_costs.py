"""Cost curves on a GPU and the projected speed-up of llama-7b NF4 with tree speculation (issue 15).

    python3 scripts/gpu_costs.py [--json PATH] [--prefixes 160,1024]

Measures, with the engine's own verification step (engine/calibrate.py: tree forward through the
compiled Triton kernel, greedy acceptance, cache compaction; fastest of a few passes):
  * c_verify(T) for T = 1 .. 128 of a random LLaMA-7B-shaped verifier, NF4 with fp32 compute (as
    the engine loads it: bf16 is not greedy-identical there), NF4 with bf16 compute (what fp32
    costs) and unquantised fp16, at each prefix length;
  * c_draft: one SSM forward while drafting, for llama-68m and llama-160m shapes (bf16);
and projects, for each published (tree size, tokens per step) of Sequoia and SpecInfer with a
JackFram/llama-68m drafter on LLaMA(2)-7B, the speed-up over incremental decoding here:

    speed-up = a * c_verify(1) / (c_verify(T) + d * c_draft)

a = tokens per step as published (bonus token included), T = tree nodes, d = draft depth (one SSM
forward per level). The auto tree picks, each step, the tree that maximises the same ratio from
measured costs and its own acceptance, so its projection is the best row. Random weights change
no cost: the work per token is the same as for trained weights.
It also reports decode tokens/s of the verifier (1000 / c_verify(1)) against the bandwidth limit,
measured copy bandwidth / weight bytes (every weight is read once per token). The engine's decode
step runs eagerly here (no CUDA graphs).
Order: the engine's NF4 curve, the SSM costs and its projection first, then the bf16 and fp16
comparisons; --json is rewritten after each, so a run cut by gpu_check's timeout keeps what it
measured (the 2026-11-27 run timed out before the SSM costs and wrote nothing).
Without CUDA it prints one line (and writes {"skipped": ...} to --json) and exits 0.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

GRID = (1, 2, 4, 8, 16, 32, 64, 128)
REPEATS = 5
# (source, setting, tree nodes T, draft depth d, tokens per step a), LLaMA(2)-7B target, JF68M drafter, greedy
PUBLISHED = [
    ("Sequoia Table 1 (A100)", "C4, tree (128, 10)", 128, 10, 5.08),
    ("Sequoia Table 1 (A100)", "MT-Bench, tree (128, 10)", 128, 10, 4.98),
    ("Sequoia Table 1 (A100)", "CNN/DailyMail, tree (128, 7)", 128, 7, 4.05),
    ("Sequoia Table 1 (A100)", "OpenWebText, tree (128, 7)", 128, 7, 3.86),
    ("Sequoia Table 4 (L40)", "C4, tree (64, 10)", 64, 10, 4.68),
    ("Sequoia Table 1 (A100)", "C4, SpecInfer 5x8 tree (40 nodes)", 40, 8, 3.96),
    ("SpecInfer Table 2", "Alpaca, width 5, depth 8 (33 nodes)", 33, 8, 3.43),
    ("SpecInfer Table 2", "Alpaca, sequence of 8 (9 nodes)", 9, 8, 2.95),
    ("SpecInfer Table 2", "WebQA, sequence of 8 (9 nodes)", 9, 8, 2.27),
]


def random_prefix(length: int, seed: int = 5) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, 32000, (length,), generator=g).tolist()


def verify_curve(model, tok, prefixes: list[int]) -> dict:
    from spectui.engine.calibrate import measure_costs
    from spectui.engine.speculative import SpeculativeEngine

    engine = SpeculativeEngine(model, tok, [], [2], attention_backend="triton")
    curves = {}
    for length in prefixes:
        cost = measure_costs(engine, grid=GRID, repeats=REPEATS, prefix=random_prefix(max(length, GRID[-1] + 1)))
        curves[str(length)] = {str(t): round(ms, 3) for t, ms in sorted(cost.verify_table.items())}
        print(f"  prefix {length}: " + ", ".join(f"T={t} {ms:.2f}" for t, ms in sorted(cost.verify_table.items())) + " ms",
              flush=True)
    engine.verifier.reset()
    return curves


def draft_cost(shape: str, device: str = "cuda") -> float:
    import gpu_models

    from spectui.engine.calibrate import measure_drafter
    from spectui.engine.drafters import ModelDrafter
    from spectui.engine.loading import drafter_dtype

    model = gpu_models.random_llama(shape, drafter_dtype(device), seed=2, device=device)
    drafter = ModelDrafter(shape, model)
    cost = min(measure_drafter(drafter, random_prefix(160)) for _ in range(REPEATS))
    del drafter, model
    return round(cost, 3)


def project(curve: dict, draft_ms: float) -> list[dict]:
    c1 = curve["1"]
    rows = []
    for source, setting, nodes, depth, tokens in PUBLISHED:
        t = min((int(k) for k in curve if int(k) >= nodes), default=max(int(k) for k in curve))
        step = curve[str(t)] + depth * draft_ms
        rows.append(dict(source=source, setting=setting, nodes=nodes, depth=depth, tokens_per_step=tokens,
                         c_verify_ms=curve[str(t)], c_verify_at=t, step_ms=round(step, 3),
                         speedup=round(tokens * c1 / step, 2)))
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="scripts/gpu_costs.py", description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--prefixes", default="160,1024")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("gpu_costs: no CUDA device here; these cost curves need a GPU.")
        if args.json:
            args.json.write_text(json.dumps({"skipped": "no CUDA"}) + "\n")
        return 0

    import gpu_models

    from spectui.engine.quantization import quant_config
    from spectui.kernels.bench import copy_peak_gbs
    from spectui.kernels.hf_attention import register_tree_attention

    began = time.perf_counter()
    prefixes = [int(x) for x in args.prefixes.split(",")]
    tok = gpu_models.tokenizer()
    attn = register_tree_attention("triton")
    report = dict(date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                  device=torch.cuda.get_device_name(), torch=torch.__version__, grid=list(GRID), repeats=REPEATS,
                  verifier={}, weights_gb={}, draft_ms={}, projection={})
    report["copy_gbs"] = round(copy_peak_gbs(rep=100), 1)
    print(f"copy bandwidth {report['copy_gbs']:.0f} GB/s (read + write)", flush=True)

    def save() -> None:  # after every section: a run cut by its timeout keeps what it measured
        report["seconds"] = round(time.perf_counter() - began, 1)
        if args.json:
            args.json.write_text(json.dumps(report, indent=1) + "\n")

    def projection(label: str) -> None:
        short = str(prefixes[0])
        rows = project(report["verifier"][label][short], report["draft_ms"]["llama-68m"])
        report["projection"][label] = rows
        best = max(rows, key=lambda r: r["speedup"])
        print(f"projection, llama-7b {label} + llama-68m, prefix {short}: best {best['speedup']:.2f}x "
              f"({best['source']}, {best['setting']})", flush=True)
        for r in rows:
            print(f"  {r['speedup']:5.2f}x  a={r['tokens_per_step']:.2f} T={r['nodes']} d={r['depth']} "
                  f"step {r['step_ms']:.1f} ms  [{r['source']}: {r['setting']}]")
        save()

    # The engine's configuration first (NF4, fp32 compute), its SSM costs and projection; then the
    # comparisons (NF4 in bf16, fp16): the 2026-11-27 run ran out of time before the SSM costs.
    base = gpu_models.random_llama("llama-7b", torch.float16, seed=0, attn=attn)
    for label in ("nf4", "nf4-bf16", "fp16"):
        if label == "fp16":
            model = base
        else:  # one NF4 copy at a time: fp32 compute as the engine loads it, then bf16
            model = gpu_models.to_nf4(base, torch.bfloat16 if label == "nf4-bf16" else quant_config("nf4").bnb_4bit_compute_dtype)
        print(f"verifier llama-7b {label}:", flush=True)
        report["weights_gb"][label] = round(gpu_models.weight_bytes(model) / 1e9, 3)
        report["verifier"][label] = verify_curve(model, tok, prefixes)
        c1 = report["verifier"][label][str(prefixes[0])]["1"]
        limit = report["copy_gbs"] / report["weights_gb"][label]
        report.setdefault("decode", {})[label] = dict(tokens_per_s=round(1000 / c1, 1), bandwidth_limit=round(limit, 1),
                                                      share_of_limit=round(1000 / c1 / limit, 3))
        print(f"  decode {1000 / c1:.1f} tokens/s; bandwidth limit {limit:.1f} ({1000 / c1 / limit:.0%})", flush=True)
        del model  # frees an NF4 copy; base itself stays referenced
        torch.cuda.empty_cache()
        save()
        if label == "nf4":
            for shape in ("llama-68m", "llama-160m"):
                report["draft_ms"][shape] = draft_cost(shape)
                print(f"SSM {shape}: {report['draft_ms'][shape]:.2f} ms per drafting forward", flush=True)
            projection("nf4")
    projection("fp16")
    return 0


if __name__ == "__main__":
    sys.exit(main())
