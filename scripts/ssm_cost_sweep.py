#!/usr/bin/env python
# Usage: .venv/bin/python scripts/ssm_cost_sweep.py [--threads 2]
"""Drafting cost of SSM shapes on this machine (issue 11's sweep, the cost half).

Each shape is a randomly initialised LLaMA with the embedded verifier's vocabulary (49,152), built
like `spectui tune` builds SSMs, loaded in the dtype the engine drafts in (loading.drafter_dtype),
and timed the way the engine drafts: ModelDrafter.begin (catch up one committed token, top-3 under
the root) then two expand levels of 2 frontier nodes, over a 200-token prefix. Median ms per SSM
forward over 30 steps after 5 untimed ones. Agreement, the other half, comes from `spectui tune`.
"""
import argparse
import statistics
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from spectui.engine.drafters import ModelDrafter
from spectui.engine.loading import drafter_dtype
from spectui.engine.tree import TokenTree

SHAPES = [  # hidden, layers, heads, kv heads, intermediate
    (128, 2, 4, 2, 384), (128, 4, 4, 2, 384), (192, 2, 4, 2, 576), (256, 2, 4, 2, 768),
    (256, 4, 4, 2, 768), (384, 2, 6, 2, 1024), (576, 1, 9, 3, 1536),
]


def step_ms(drafter: ModelDrafter, committed: list[int]) -> float:
    committed.append(100 + len(committed) % 400)
    start = time.perf_counter()
    tree = TokenTree.with_root(committed[-1])
    frontier = drafter.begin(committed, tree, 0, 3)
    for _ in range(2):
        frontier = drafter.expand(tree, 0, frontier[:2], 2)
    drafter.finish()
    return (time.perf_counter() - start) * 1000 / 3


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    dtype = drafter_dtype("cpu")
    print(f"dtype {dtype}, {args.threads} threads; ms per SSM forward while drafting (median of 30 steps)")
    print("| hidden | layers | MLP | parameters (M) | bf16 size (MB) | ms / forward |")
    print("|---:|---:|---:|---:|---:|---:|")
    for hidden, layers, heads, kv, inter in SHAPES:
        config = LlamaConfig(vocab_size=49152, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
                             num_attention_heads=heads, num_key_value_heads=kv, head_dim=hidden // heads,
                             max_position_embeddings=8192, tie_word_embeddings=True)
        model = LlamaForCausalLM(config).to(dtype).eval()
        drafter = ModelDrafter("sweep", model)
        committed = list(range(100, 300))
        for _ in range(5):
            step_ms(drafter, committed)
        ms = statistics.median(step_ms(drafter, committed) for _ in range(30))
        params = sum(p.numel() for p in model.parameters()) / 1e6
        print(f"| {hidden} | {layers} | {inter} | {params:.1f} | {params * 2:.0f} | {ms:.2f} |", flush=True)


if __name__ == "__main__":
    main()
