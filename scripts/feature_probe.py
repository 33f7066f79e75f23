"""Train a FeatureHead on the features made so far and measure its agreement on unseen prompts.

    .venv/bin/python scripts/feature_probe.py --data /work/feat --out /work/head --budget 600

Evaluation: the verifier's greedy answers (64 tokens) to the Vicuna questions and 4 Spec-Bench
prompts a category (the answers `spectui tune-eval` caches), teacher-forced: depth-1 top-1 (the
head reads the verifier's true feature) and two-step top-1 (it reads its own prediction, as its
second draft does).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

from spectui import paths
from spectui.engine.feature_head import FeatureHead, FeatureHeadConfig
from spectui.engine.lean_model import LeanModel
from spectui.engine.loading import load_models
from spectui.engine.presets import resolve_model
from spectui.engine.prompt_files import read_prompt_file
from spectui.engine.tune.feature_train import (FeatureTrainConfig, batch_loss, draft_vocabulary, load_parts,
                                               make_batch, train_head, windows)
from spectui.engine.tune.features import features_path, write_features
from spectui.engine.tune.heldout import greedy_answers

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data"


def eval_sets(models, runner, out: Path) -> dict[str, list[dict]]:
    sets = {}
    specs = {"vicuna": (DATA / "vicuna_bench_questions.jsonl", None), "specbench": (DATA / "spec_bench_dev.jsonl", 4)}
    for name, (path, per_category) in specs.items():
        rows = read_prompt_file(path)
        if per_category:
            seen: dict = {}
            rows = [r for r in rows if seen.setdefault(r[1], []).append(r) or len(seen[r[1]]) <= per_category]
        answered = greedy_answers(models, models.chat_template, rows, 64, paths.cache_dir() / "eval-answers")
        by_cat: dict[str, list] = {}
        for example, category in answered:
            by_cat.setdefault(category or "all", []).append(example)
        for category, examples in by_cat.items():
            key = f"{name}-{category}"
            fpath = features_path(out / "eval" / key, 0)
            if not fpath.exists():
                write_features(fpath, examples, runner)
            sets[key] = load_parts(fpath.parent)
    return sets


@torch.no_grad()
def agreement(head: FeatureHead, parts: list[dict], loss=batch_loss, second_step: bool = True) -> tuple[float, float, int]:
    """-> (depth-1 top-1, two-step top-1 (0 without second_step), answer positions) over the answers
    (prompt weight 0); loss: feature_train.batch_loss or a wrapper of it (feature_layers_probe.py)."""
    vocab_map = torch.full((int(head.embed.shape[0]),), -1, dtype=torch.long)
    vocab_map[head.vocab_ids] = torch.arange(len(head.vocab_ids))
    cfg = FeatureTrainConfig(window=4096, prompt_weight=0.0, second_step=second_step)
    hits = hits2 = n = 0
    for w in windows(parts, cfg.window):
        batch = make_batch(parts, [w], vocab_map, 0.0)
        _, hit, hit2, weights = loss(head, batch, cfg)
        # the verifier's top-1 at the answer positions, inside the draft vocab or not
        answer = weights == 1.0
        hits += int((hit & answer).sum()); n += int(answer.sum())
        hits2 += int((hit2 & answer).sum()) if hit2 is not None else 0
    return hits / max(n, 1), hits2 / max(n, 1), n


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", type=Path, nargs="+", required=True, help="folders made by feature_data.py")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--budget", type=float, default=600)
    ap.add_argument("--epochs", type=float, default=1.0)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--cls-weight", type=float, default=0.5)
    ap.add_argument("--prompt-weight", type=float, default=0.5)
    ap.add_argument("--no-second-step", action="store_true")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--init", type=Path, default=None, help="continue from a saved head")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    models = load_models(resolve_model("smollm2-135m"), models_dir=paths.models_dir())
    runner = LeanModel(models.verifier)
    evals = eval_sets(models, runner, args.out)
    parts = [part for folder in args.data for part in load_parts(folder / "features")]
    print(f"{len(parts)} parts, {sum(int(p['starts'][-1]) for p in parts)} positions", flush=True)
    embed = models.verifier.model.embed_tokens.weight
    head_w = models.verifier.lm_head.weight
    if args.init:
        head = FeatureHead.load(args.init)
    else:
        head = FeatureHead(FeatureHeadConfig.for_verifier(models.verifier.config, args.vocab))
        head.vocab_ids.copy_(draft_vocabulary(parts, args.vocab))
    head.attach(embed, head_w, torch.float32)
    covered = sum(float(torch.isin(p["top_ids"][:, 0].long(), head.vocab_ids).float().sum()) for p in parts)
    print(f"draft vocabulary covers {covered / sum(len(p['top_ids']) for p in parts):.3f} of the verifier's top-1", flush=True)
    cfg = FeatureTrainConfig(epochs=args.epochs, cls_weight=args.cls_weight, prompt_weight=args.prompt_weight,
                             second_step=not args.no_second_step, lr=args.lr)
    began = time.perf_counter()
    info = {"parts": len(parts), "positions": sum(int(p["starts"][-1]) for p in parts), "train": vars(cfg)}
    train_head(head, parts, cfg, log=lambda s: print(s, flush=True), budget_s=args.budget,
               save=lambda: head.save(args.out / "head", info))
    print(f"trained in {time.perf_counter() - began:.0f} s", flush=True)
    head.eval()
    for key, eparts in evals.items():
        a1, a2, n = agreement(head, eparts)
        print(f"{key:28s} depth-1 {a1:.3f}  two-step {a2:.3f}  ({n} answer tokens)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
