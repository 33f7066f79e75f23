"""The GPU suite's engine checks and cost script, exercised on this CPU with tiny shapes (issue 15).

tests/gpu/test_engine_cuda.py checks a random LLaMA-7B-shaped NF4 verifier on a GPU; here the same
`check_greedy` (every speculation config against transformers' generate) runs on a 2-layer model of
the same construction (scripts/gpu_models.py: random weights, NF4 through bitsandbytes on CPU), and
scripts/gpu_costs.py's cost curve, SSM cost and projection run on tiny shapes, so a GPU session
finds working code. Attention takes the torch path (masked SDPA) here.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
TINY = {"llama-7b": (64, 128, 2, 4, 4), "llama-68m": (32, 64, 1, 2, 2), "llama-160m": (32, 64, 2, 2, 2)}


def load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def tiny_shapes(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    monkeypatch.setenv("SPECTUI_ATTENTION", "torch")
    import gpu_models

    for name, shape in TINY.items():
        monkeypatch.setitem(gpu_models.SHAPES, name, shape)
    return gpu_models


@pytest.mark.slow
def test_gpu_engine_check_runs_on_cpu(tiny_shapes, monkeypatch):
    from spectui.kernels.hf_attention import register_tree_attention

    gpu = load(ROOT / "tests" / "gpu" / "test_engine_cuda.py", "gpu_engine_checks")
    monkeypatch.setattr(gpu, "MAX_NEW", 16)
    base = tiny_shapes.random_llama("llama-7b", torch.float32, seed=0, device="cpu", attn=register_tree_attention("torch"))
    bad = tiny_shapes.random_llama("llama-68m", torch.float32, seed=1, device="cpu")
    verifier = tiny_shapes.to_nf4(base, torch.float32)
    import bitsandbytes as bnb

    assert sum(isinstance(m, bnb.nn.Linear4bit) for m in verifier.modules()) == 2 * 7
    results, mismatches = gpu.check_greedy(verifier, bad, tiny_shapes.tokenizer(), backend="torch")
    assert not mismatches, mismatches
    assert set(results) == set(gpu.CONFIGS) and results["incremental"] == 1.0
    assert results["self-deep"] > 2.5  # the verifier drafting for itself is accepted deep


def test_gpu_costs_functions_run_on_cpu(tiny_shapes, monkeypatch):
    from spectui.kernels.hf_attention import register_tree_attention

    costs = load(ROOT / "scripts" / "gpu_costs.py", "gpu_costs_script")
    monkeypatch.setattr(costs, "REPEATS", 1)
    monkeypatch.setattr(costs, "GRID", (1, 2, 4, 8))
    model = tiny_shapes.random_llama("llama-7b", torch.float32, seed=0, device="cpu", attn=register_tree_attention("torch"))
    curve = costs.verify_curve(model, tiny_shapes.tokenizer(), [16])
    assert set(curve["16"]) == {"1", "2", "4", "8"} and all(ms > 0 for ms in curve["16"].values())
    assert list(curve["16"].values()) == sorted(curve["16"].values())  # made non-decreasing in T
    draft = costs.draft_cost("llama-68m", device="cpu")
    assert draft > 0
    rows = costs.project(curve["16"], draft)
    assert len(rows) == len(costs.PUBLISHED)
    for row in rows:  # speed-up = a * c(1) / (c(T') + d * c_draft), T' the first measured size >= T (else the largest)
        step = curve["16"][str(row["c_verify_at"])] + row["depth"] * draft
        assert row["speedup"] == round(row["tokens_per_step"] * curve["16"]["1"] / step, 2)
