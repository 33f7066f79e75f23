#!/usr/bin/env python
# Usage: .venv/bin/python scripts/draft_calls.py [--prompts FILE] [--every 8] [--max-new-tokens 64]
"""How long a drafter's calls take inside the engine, its dense_cpu kernels on and off.

The engine generates with the auto tree (the default preset's drafters) over every EVERY-th prompt;
per prompt it runs twice, the drafters' kernels/dense_cpu.py products on, then off (torch's own
products), the order alternating per prompt. Every begin (catch-up + first level) and expand (a
deeper level) call is timed. Drafting alone can look faster than it is: between two drafting
calls the verifier streams its weights through the caches (docs/performance.md, stop 27).
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from spectui import paths
from spectui.engine import GenerationSettings, RunSpec, encode_chat, load_engine


ROOT = Path(__file__).resolve().parents[1]


def kernel_switch(engine):
    """-> set(on): put the drafters' dense_cpu kernels in place (on) or take them out (off)."""
    saved = []
    for d in engine.drafters:
        if hasattr(d, "head"):  # a FeatureDrafter
            saved.append((d.head, "kernels", d.head.kernels, {}))
        elif hasattr(getattr(d, "runner", None), "layers"):  # an SSM on LeanModel
            saved.append((d.runner, "output_layer", d.runner.output_layer, None))
            saved += [(p, "dense", p.dense, None) for layer in d.runner.layers for p in (layer.qkv, layer.o, layer.gate_up, layer.down)]

    def set_(on: bool) -> None:
        for obj, name, kernel, off in saved:
            setattr(obj, name, kernel if on else off)
    return set_


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", default=str(ROOT.parent / "shared" / "data" / "vicuna_bench_questions.jsonl"))
    ap.add_argument("--every", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    args = ap.parse_args()
    models, engine = load_engine(RunSpec("smollm2-135m"), cost_cache=paths.costs_dir(), models_dir=paths.models_dir())
    switch, mode, times = kernel_switch(engine), ["on"], {}
    for d in engine.drafters:
        if d.kind != "model":
            continue
        for method in ("begin", "expand"):
            call = getattr(d, method)

            def timed(*a, _call=call, _key=(d.name, method), **kw):
                began = time.perf_counter()
                out = _call(*a, **kw)
                times.setdefault((mode[0], *_key), []).append((time.perf_counter() - began) * 1e3)
                return out
            setattr(d, method, timed)
    questions = [json.loads(line)["turns"][0] for line in open(args.prompts, encoding="utf-8")][:: args.every]
    for k, question in enumerate(questions):
        ids = encode_chat(models.tokenizer, [{"role": "user", "content": question}], models.chat_template)
        for on in ([True, False] if k % 2 else [False, True]):
            mode[0] = "on" if on else "off"
            switch(on)
            for _ in engine.generate(ids, GenerationSettings(max_new_tokens=args.max_new_tokens)):
                pass
    print("kernels  drafter  call  calls  median ms  mean ms")
    for (state, name, method), ms in sorted(times.items()):
        print(f"{state:4s} {name:18s} {method:6s} {len(ms):5d} {statistics.median(ms):8.2f} {statistics.mean(ms):8.2f}")


if __name__ == "__main__":
    main()
