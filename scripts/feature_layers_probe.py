#!/usr/bin/env python
"""Does a feature head agree more with the verifier when it also reads the verifier's lower layers?

EAGLE-3 (Li et al., 2025) feeds its drafter a fusion of a low, a middle and a high layer of the
target instead of the final feature alone. This probe asks that question for SmolLM2-135M at equal
data and training time, depth 1 only (the head reads the verifier's true states of t - 1):

    final   u_t = W_fc [e(x_t); f_{t-1}]                          (the shipped head's input)
    fused   u_t = W_fc [e(x_t); f_{t-1}; n(h^a_{t-1}); n(h^b_{t-1}); n(h^c_{t-1})]

h^i: the residual stream after layer i (0-based; n(.) divides by its RMS, no weight). Both heads
predict f_t with the shipped loss (smooth-L1 + 0.5 CE to the verifier's top-4), the same windows,
batches, lr and wall time; agreement is measured as `feature_probe.py` does (the verifier's greedy
answers to the Vicuna questions and 4 Spec-Bench prompts a category, teacher-forced, depth-1 top-1).

    .venv/bin/python scripts/feature_layers_probe.py --out /work/layers --prompts 600 --budget 420
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from feature_data import PROMPTS, balanced_prompts  # noqa: E402
from feature_probe import agreement, eval_sets  # noqa: E402

from spectui import paths  # noqa: E402
from spectui.engine import lean_model  # noqa: E402
from spectui.engine.feature_head import FeatureHead, FeatureHeadConfig  # noqa: E402
from spectui.engine.lean_model import LeanModel  # noqa: E402
from spectui.engine.loading import load_models  # noqa: E402
from spectui.engine.presets import resolve_model  # noqa: E402
from spectui.engine.tune import feature_train as ft  # noqa: E402
from spectui.engine.tune.data import Example, prompt_ids  # noqa: E402
from spectui.engine.tune.features import write_features  # noqa: E402


class LayerTap:
    """After every run of a LeanModel that keeps its hidden states, `hidden` [B, T, H] becomes
    [B, T, (1 + taps) H]: the final states, then the residual stream entering the layer after each of
    `after`, divided by its RMS. So engine/tune/features.py's feature pass keeps them all as its rows."""

    def __init__(self, runner: LeanModel, after: list[int]) -> None:
        wanted = {id(runner.layers[i + 1].norm_in): n for n, i in enumerate(after)}
        kept: list[torch.Tensor | None] = [None] * len(after)
        plain_norm, plain_run = lean_model.rms_norm, runner.run

        def tapped(h, norm):  # what rms_norm sees at a tapped layer's norm_in is the stream entering it
            n = wanted.get(id(norm))
            if n is not None:
                kept[n] = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)  # [B, T, H], RMS 1
            return plain_norm(h, norm)

        def run(*args, **kwargs):
            logits = plain_run(*args, **kwargs)
            if runner.keep_hidden:
                runner.hidden = torch.cat([runner.hidden, *kept], dim=-1)
            return logits
        lean_model.rms_norm = tapped
        runner.run = run


class FusedHead(FeatureHead):
    """The shipped head with a wider input projection: [e(x_t); f_{t-1}; taps_{t-1}] -> H."""

    def __init__(self, config: FeatureHeadConfig, taps: int) -> None:
        super().__init__(config)
        self.fc = nn.Linear((2 + taps) * config.hidden, config.hidden)


PLAIN_LOSS = ft.batch_loss


def loss_on(H: int, fused: bool):
    """feature_train.batch_loss on the probe's rows: the target is f alone; the input f, or f and the taps."""
    def loss(head, batch, cfg):
        tokens, prev, target, *rest = batch
        return PLAIN_LOSS(head, (tokens, prev if fused else prev[..., :H], target[..., :H], *rest), cfg)
    return loss


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--prompts", type=int, default=600, help="tuning prompts whose text (rendered, no answer) is the training data")
    ap.add_argument("--skip", type=int, default=0, help="start at this prompt of the balanced order")
    ap.add_argument("--layers", type=int, nargs="+", default=[2, 14, 26], help="taps: the residual after these layers")
    ap.add_argument("--budget", type=float, default=420, help="training seconds per head")
    ap.add_argument("--batch", type=int, default=64, help="prompts a data file")
    args = ap.parse_args()
    models = load_models(resolve_model("smollm2-135m"), models_dir=paths.models_dir())
    runner = LeanModel(models.verifier)
    LayerTap(runner, args.layers)
    H = models.verifier.config.hidden_size
    began = time.perf_counter()
    texts = balanced_prompts(PROMPTS, 0, 4000)[args.skip : args.skip + args.prompts]
    for index in range(0, len(texts), args.batch):
        path = args.out / "train" / f"part-{index // args.batch:05d}.safetensors"
        if not path.exists():
            write_features(path, [Example(t, prompt_ids(models.tokenizer, t, models.context_window, 1, None), [], "prompt", False)
                                  for t in texts[index : index + args.batch]], runner)
            print(f"{path.name}: {time.perf_counter() - began:.0f} s", flush=True)
    evals = eval_sets(models, runner, args.out)  # per category: "vicuna-generic", ..., "specbench-qa", ...
    parts = ft.load_parts(args.out / "train")
    print(f"{sum(int(p['starts'][-1]) for p in parts)} training positions, data in {time.perf_counter() - began:.0f} s", flush=True)
    embed, out_w = models.verifier.model.embed_tokens.weight, models.verifier.lm_head.weight
    config = FeatureHeadConfig.for_verifier(models.verifier.config, 8192)
    vocab = ft.draft_vocabulary(parts, 8192)
    for fused in (False, True):
        torch.manual_seed(0)
        head = FusedHead(config, len(args.layers)) if fused else FeatureHead(config)
        head.vocab_ids.copy_(vocab)
        head.attach(embed, out_w, torch.float32)
        ft.batch_loss = loss_on(H, fused)
        cfg = ft.FeatureTrainConfig(second_step=False, lr=3e-3)
        info = ft.train_head(head, parts, cfg, log=lambda s: None, budget_s=args.budget)
        head.eval()
        hits: dict[str, list[float]] = {}  # per prompt set: [hits, answer positions] over its categories
        for key, eparts in evals.items():
            top1, _, n = agreement(head, eparts, ft.batch_loss, second_step=False)
            total = hits.setdefault(key.split("-")[0], [0.0, 0])
            total[0], total[1] = total[0] + top1 * n, total[1] + n
        print(f"{'fused' if fused else 'final'}: {info['steps']} steps, final loss {info['final_loss']}; "
              + ", ".join(f"{name} depth-1 top-1 {h / max(n, 1):.3f} ({n} answer tokens)" for name, (h, n) in hits.items()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
