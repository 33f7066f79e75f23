"""Make feature-drafter training data in the background: verifier answers and its features.

For prompts from ../shared/data/tune_prompts.jsonl.gz, taken round-robin over its categories (any
prefix of the run is balanced), one shard of BATCH prompts at a time: the verifier answers them
(engine/tune/data.answer_batch, LeanModel batched decoding, greedy and sampled batches alternating),
keeping the verifier's features as it decodes (engine/tune/features.py FeatureRows: the rows a
teacher-forced pass would give over prompt + answer[:-1], with no second pass), with
engine/tune/teacher_head.py's output layer (the same top tokens, 1.3x the shards an hour). Resumable:
a shard or feature file that exists is complete and skipped.

    nohup .venv/bin/python scripts/feature_data.py --out /work/feat --tokens 400000 > /work/feat.log 2>&1 &
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import sys
import time
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace

import torch

from spectui import paths
from spectui.engine.lean_model import LeanModel
from spectui.engine.loading import load_models
from spectui.engine.presets import resolve_model
from spectui.engine.chat import ContextError
from spectui.engine.tune.data import Example, answer_batch, prompt_ids, read_shard, shard_path, write_shard
from spectui.engine.tune.features import FeatureRows, features_path, save_kept_features, write_features
from spectui.engine.tune.teacher_head import use_teacher_head

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = ROOT.parent / "shared" / "data" / "tune_prompts.jsonl.gz"


def balanced_prompts(path: Path, seed: int, max_chars: int) -> list[str]:
    by_category = defaultdict(list)
    with gzip.open(path, "rt", encoding="utf-8") as f:
        for line in f:
            row = json.loads(line)
            text = row["turns"][0]
            if len(text) <= max_chars:
                by_category[row["category"]].append(text)
    rng = random.Random(seed)
    for texts in by_category.values():
        rng.shuffle(texts)
    order, lists = [], [by_category[c] for c in sorted(by_category)]
    for i in range(max(map(len, lists))):
        order += [texts[i] for texts in lists if i < len(texts)]
    return order


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--tokens", type=int, default=400_000, help="answer tokens to generate in all")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--max-answer", type=int, default=160)
    ap.add_argument("--max-chars", type=int, default=4000)
    ap.add_argument("--greedy-fraction", type=float, default=0.5)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--prompt-only", action="store_true",
                    help="no answers: features over the rendered prompts alone (prefill speed, about 5x the positions a second)")
    ap.add_argument("--skip", type=int, default=0, help="start at this prompt (another run's prompts come first)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    models = load_models(resolve_model("smollm2-135m"), models_dir=paths.models_dir())
    runner = use_teacher_head(LeanModel(models.verifier))  # bf16 output products, the top redone in fp32
    prompts = balanced_prompts(PROMPTS, args.seed, args.max_chars)[args.skip :]
    cfg = SimpleNamespace(max_answer_tokens=args.max_answer, sample_temperature=0.8, sample_top_p=0.95)
    stop = models.stop_token_ids()
    done, total, index, began = 0, 0, 0, time.perf_counter()
    while (args.prompt_only or done < args.tokens) and index * args.batch < len(prompts):
        path = shard_path(args.out, index)
        positions = 0
        if path.exists():
            shard = read_shard(path)
        elif args.prompt_only:
            shard = [Example(t, prompt_ids(models.tokenizer, t, models.context_window, 1, None), [], "prompt", False)
                     for t in prompts[index * args.batch : (index + 1) * args.batch]]
            write_shard(path, shard)
        else:
            mode = "greedy" if (index % 2 == 0) == (args.greedy_fraction >= 0.5) else "sample"
            rendered = []
            for text in prompts[index * args.batch : (index + 1) * args.batch]:
                try:
                    rendered.append((text, prompt_ids(models.tokenizer, text, models.context_window, args.max_answer, None)))
                except ContextError:
                    continue
            torch.manual_seed(args.seed * 1_000_003 + index)
            kept = FeatureRows()  # the features as the answers are decoded: no second pass
            answers = answer_batch(models.verifier, [ids for _, ids in rendered], mode, cfg, stop, runner, kept.add)
            shard = [Example(t, ids, a, mode, fin) for (t, ids), (a, fin) in zip(rendered, answers)]
            positions = save_kept_features(features_path(args.out, index), shard, kept)
            write_shard(path, shard)
        fpath = features_path(args.out, index)
        if not fpath.exists():  # a shard answered before its features were kept (an older run)
            positions = write_features(fpath, shard, runner)
        done += sum(len(e.answer_ids) for e in shard)
        total += positions
        print(f"{time.strftime('%H:%M:%S')} shard {index}: {done} answer tokens, {total} positions, "
              f"{time.perf_counter() - began:.0f} s", flush=True)
        index += 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
