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
from safetensors.torch import save_file
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from feature_data import PROMPTS, balanced_prompts  # noqa: E402
from feature_probe import DATA  # noqa: E402

from spectui import paths  # noqa: E402
from spectui.engine import lean_model  # noqa: E402
from spectui.engine.feature_head import FeatureHead, FeatureHeadConfig  # noqa: E402
from spectui.engine.lean_model import LeanModel  # noqa: E402
from spectui.engine.loading import load_models  # noqa: E402
from spectui.engine.presets import resolve_model  # noqa: E402
from spectui.engine.prompt_files import read_prompt_file  # noqa: E402
from spectui.engine.tune import feature_train as ft  # noqa: E402
from spectui.engine.tune.data import Example, prompt_ids  # noqa: E402
from spectui.engine.tune.features import read_features  # noqa: E402
from spectui.engine.tune.heldout import greedy_answers  # noqa: E402
from spectui.engine.tune.teacher import top_rows  # noqa: E402


class LayerTap:
    """Keeps the residual stream entering chosen layers of a LeanModel (what rms_norm sees at their norm_in)."""

    def __init__(self, runner: LeanModel, after: list[int]) -> None:
        self.wanted = {id(runner.layers[i + 1].norm_in): n for n, i in enumerate(after)}
        self.kept: list[torch.Tensor | None] = [None] * len(after)
        plain = lean_model.rms_norm

        def tapped(h, norm):
            n = self.wanted.get(id(norm))
            if n is not None:
                self.kept[n] = h[0] * torch.rsqrt(h[0].pow(2).mean(-1, keepdim=True) + 1e-6)  # [T, H], RMS 1
            return plain(h, norm)
        lean_model.rms_norm = tapped


@torch.inference_mode()
def feature_rows(runner: LeanModel, tap: LayerTap, seq: list[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """-> (states [L, (1 + layers) H] bf16: f then the tapped layers, top_ids [L, 4], top_logp [L, 4])."""
    runner.reset()
    runner.keep_hidden = True
    logits = runner.forward_chain(list(seq))  # [L, V]
    states = torch.cat([runner.hidden[0], *tap.kept], dim=-1).to(torch.bfloat16)
    top_ids, top_logp = top_rows(logits, 4)
    runner.reset()
    return states, top_ids, top_logp


def write_part(path: Path, runner, tap, examples: list[Example]) -> None:
    rows, ids, starts, answers = [], [], [0], []
    for e in examples:
        seq = list(e.prompt_ids) + list(e.answer_ids)
        rows.append(feature_rows(runner, tap, seq))
        ids.append(torch.tensor(seq, dtype=torch.int32))
        answers.append(starts[-1] + len(e.prompt_ids))
        starts.append(starts[-1] + len(seq))
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({"hidden": torch.cat([r[0] for r in rows]), "top_ids": torch.cat([r[1] for r in rows]),
               "top_logp": torch.cat([r[2] for r in rows]), "ids": torch.cat(ids),
               "starts": torch.tensor(starts), "answer_starts": torch.tensor(answers)}, str(path))


class FusedHead(FeatureHead):
    """The shipped head with a wider input projection: [e(x_t); f_{t-1}; taps_{t-1}] -> H."""

    def __init__(self, config: FeatureHeadConfig, taps: int) -> None:
        super().__init__(config)
        self.fc = nn.Linear((2 + taps) * config.hidden, config.hidden)


PLAIN_LOSS = ft.batch_loss


def loss_on(H: int, fused: bool):
    """feature_train.batch_loss on the probe's rows: the target is f alone; the input f, or f and the taps."""
    plain = PLAIN_LOSS

    def loss(head, batch, cfg):
        tokens, prev, target, *rest = batch
        return plain(head, (tokens, prev if fused else prev[..., :H], target[..., :H], *rest), cfg)
    return loss


@torch.no_grad()
def depth1(head, parts, loss) -> tuple[float, int]:
    vocab_map = torch.full((int(head.embed.shape[0]),), -1, dtype=torch.long)
    vocab_map[head.vocab_ids] = torch.arange(len(head.vocab_ids))
    cfg = ft.FeatureTrainConfig(window=4096, prompt_weight=0.0, second_step=False)
    hits = n = 0
    for w in ft.windows(parts, cfg.window):
        _, hit, _, weights = loss(head, ft.make_batch(parts, [w], vocab_map, 0.0), cfg)
        answer = weights == 1.0
        hits, n = hits + int((hit & answer).sum()), n + int(answer.sum())
    return hits / max(n, 1), n


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
    tap = LayerTap(runner, args.layers)
    H = models.verifier.config.hidden_size
    began = time.perf_counter()
    texts = balanced_prompts(PROMPTS, 0, 4000)[args.skip : args.skip + args.prompts]
    for index in range(0, len(texts), args.batch):
        path = args.out / "train" / f"part-{index // args.batch:05d}.safetensors"
        if not path.exists():
            write_part(path, runner, tap, [Example(t, prompt_ids(models.tokenizer, t, models.context_window, 1, None), [], "prompt", False)
                                           for t in texts[index : index + args.batch]])
            print(f"{path.name}: {time.perf_counter() - began:.0f} s", flush=True)
    evals = {}
    for name, (file, per_category) in {"vicuna": ("vicuna_bench_questions.jsonl", None), "specbench": ("spec_bench_dev.jsonl", 4)}.items():
        rows = read_prompt_file(DATA / file)
        if per_category:
            seen: dict = {}
            rows = [r for r in rows if seen.setdefault(r[1], []).append(r) or len(seen[r[1]]) <= per_category]
        path = args.out / "eval" / f"{name}.safetensors"
        if not path.exists():
            answered = greedy_answers(models, models.chat_template, rows, 64, paths.cache_dir() / "eval-answers")
            write_part(path, runner, tap, [e for e, _ in answered])
        evals[name] = [read_features(path)]
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
        scores = {name: depth1(head, p, ft.batch_loss) for name, p in evals.items()}
        print(f"{'fused' if fused else 'final'}: {info['steps']} steps, final loss {info['final_loss']}; "
              + ", ".join(f"{name} depth-1 top-1 {a:.3f} ({n} answer tokens)" for name, (a, n) in scores.items()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
