"""Score saved FeatureHeads on the evaluation features scripts/feature_probe.py caches (OUT/eval/<set>-<category>).

    .venv/bin/python scripts/feature_eval.py --eval /work/probe/eval --head ssms/smollm2-feature /work/gpuheads/head-a

Per head: depth-1 top-1 (the head reads the verifier's true feature) and two-step top-1 (it reads its
own prediction) on the verifier's greedy answers, per category and pooled over each set (Vicuna,
Spec-Bench), weighted by answer tokens.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from feature_probe import agreement  # noqa: E402

from spectui import paths  # noqa: E402
from spectui.engine.embedded import embedded_model_dir  # noqa: E402
from spectui.engine.feature_head import FeatureHead  # noqa: E402
from spectui.engine.tune.feature_train import load_parts  # noqa: E402
from spectui.engine.tune.features import verifier_rows  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--eval", type=Path, required=True, help="feature_probe.py's OUT/eval")
    ap.add_argument("--head", type=Path, nargs="+", required=True)
    args = ap.parse_args()
    embed, head_w = verifier_rows(embedded_model_dir(paths.models_dir()))  # [V, H] each
    sets = {d.name: load_parts(d / "features") for d in sorted(args.eval.iterdir()) if (d / "features").is_dir()}
    for folder in args.head:
        head = FeatureHead.load(folder)
        head.attach(embed, head_w, torch.float32)
        pooled = defaultdict(lambda: [0.0, 0.0, 0])
        for key, parts in sets.items():
            a1, a2, n = agreement(head, parts)
            print(f"{folder}  {key:28s} depth-1 {a1:.3f}  two-step {a2:.3f}  ({n})", flush=True)
            total = pooled[key.split("-")[0]]
            total[0] += a1 * n; total[1] += a2 * n; total[2] += n
        for name, (h1, h2, n) in pooled.items():
            print(f"{folder}  {name:28s} depth-1 {h1 / n:.3f}  two-step {h2 / n:.3f}  ({n} answer tokens)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
