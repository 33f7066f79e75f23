"""Make feature-drafter training data in the background: verifier answers and its features.

For prompts from ../shared/data/tune_prompts.jsonl.gz, taken round-robin over its categories (any
prefix of the run is balanced), one shard of BATCH prompts at a time: the verifier answers them
(engine/tune/data.answer_batch, LeanModel batched decoding, greedy and sampled batches alternating),
keeping the verifier's features as it decodes (engine/tune/features.py FeatureRows: the rows a
teacher-forced pass would give over prompt + answer[:-1], with no second pass), with
engine/tune/teacher_head.py's output layer (the same top tokens, 1.3x the shards an hour). Resumable:
a shard or feature file that exists is complete and skipped.

    nohup .venv/bin/python scripts/feature_data.py --out /work/feat --tokens 400000 > /work/feat.log 2>&1 &

--magpie: the prompts are the verifier's own (engine/tune/magpie.py: it continues the chat template's
context before a user's words), sampled in batches of MAGPIE_BATCH as the run needs them, filtered and
deduplicated as `spectui tune` does (the bench prompt files excluded), kept in OUT/prompts.jsonl so a
resumed run answers the same ones. Open chat and writing are thin in the tuning prompts; these fill them.
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
from spectui.engine.batch_generate import generate_batch
from spectui.engine.tune.config import TuneConfig
from spectui.engine.tune.magpie import Deduper, SampleJudge, pre_query_ids, read_excluded

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data"
PROMPTS = DATA / "tune_prompts.jsonl.gz"
BENCH = (DATA / "vicuna_bench_questions.jsonl", DATA / "spec_bench_dev.jsonl")  # measured on, never trained on
MAGPIE_BATCH = 48  # samples a round, as stop 49's run took them (spectui tune: 32)


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


class MagpiePrompts(list):
    """The verifier's own prompts, kept in `path` (one JSON line each) and sampled as more are wanted,
    with `spectui tune`'s sampling settings and rules (TuneConfig, magpie.SampleJudge)."""

    def __init__(self, path: Path, models, runner, seed: int) -> None:
        super().__init__()
        if path.exists():
            self.extend(json.loads(line)["prompt"] for line in path.open(encoding="utf-8"))
        self.path, self.runner, self.seed, self.cfg = path, runner, seed, TuneConfig()
        self.stop = models.stop_token_ids()
        self.head = pre_query_ids(models.tokenizer, models.chat_template)
        excluded = set().union(*(read_excluded(p) for p in BENCH))
        self.judge = SampleJudge.for_template(models.tokenizer, models.chat_template, self.stop, self.cfg,
                                              Deduper(self), excluded)
        self.rounds = 0

    def want(self, count: int) -> None:
        """Sample until `count` prompts are kept, or give up after ~10x the rounds that should take (a
        model that rarely ends its turn): the run then ends where the prompts do."""
        cfg = self.cfg
        give_up = self.rounds + 10 * (max(count - len(self), 0) // MAGPIE_BATCH + 1)
        with self.path.open("a", encoding="utf-8") as handle:
            while len(self) < count and self.rounds < give_up:
                torch.manual_seed(self.seed * 1_000_003 + 7 * len(self) + self.rounds)
                self.rounds += 1
                rows = generate_batch(self.runner, [self.head] * MAGPIE_BATCH, cfg.magpie_max_tokens, self.stop,
                                      greedy=False, temperature=cfg.magpie_temperature, top_p=cfg.magpie_top_p)
                for row, _ in rows:
                    text = self.judge(row)
                    if text is not None:
                        self.append(text)
                        handle.write(json.dumps({"prompt": text}) + "\n")
                handle.flush()


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
    ap.add_argument("--magpie", action="store_true", help="prompts the verifier writes itself (the module docstring)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    models = load_models(resolve_model("smollm2-135m"), models_dir=paths.models_dir())
    runner = use_teacher_head(LeanModel(models.verifier))  # bf16 or int8 output products, the top redone in fp32
    args.out.mkdir(parents=True, exist_ok=True)
    magpie = MagpiePrompts(args.out / "prompts.jsonl", models, runner, args.seed) if args.magpie else None
    prompts = magpie if magpie is not None else balanced_prompts(PROMPTS, args.seed, args.max_chars)[args.skip :]
    cfg = SimpleNamespace(max_answer_tokens=args.max_answer, sample_temperature=0.8, sample_top_p=0.95)
    stop = models.stop_token_ids()
    done, total, index, began = 0, 0, 0, time.perf_counter()
    while args.prompt_only or done < args.tokens:
        path = shard_path(args.out, index)
        positions = 0
        if magpie is not None and not path.exists():
            magpie.want((index + 1) * args.batch)
        if index * args.batch >= len(prompts):
            break
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
              f"{time.perf_counter() - began:.0f} s" + (f", Magpie rejected {magpie.judge.rejected}" if magpie is not None else ""),
              flush=True)
        index += 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
