"""`spectui tune --feature-head`: the feature drafter (engine/feature_head.py) for the verifier.

Two steps after the answers stage, both resumable:

1. features: one teacher-forced verifier pass per training sequence (prompt + answer) keeps its
   final hidden states and top-4 next tokens (features.py), FEATURE_CHUNK sequences a file in
   OUT/features/; a file on disk is complete (written to a temp name, then renamed) and is reused.
2. training (feature_train.py): the head learns f_t from (x_t, f_{t-1}) on every position, answer
   positions weighing 1 and prompt positions `prompt_weight`; its draft vocabulary is the
   `feature_vocab` tokens the verifier ranks first most often in this data. Checkpoints in
   OUT/feature-head/checkpoint.pt let --resume continue exactly; the finished head is written to a
   temp folder and renamed to OUT/feature-head, so that folder exists only complete.

The head is evaluated with the SSMs (evaluate.py: teacher-forced on the held-out answers).
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import torch

from ..feature_head import FeatureHead, FeatureHeadConfig, is_feature_head
from ..lean_model import LeanModel
from .feature_train import FeatureTrainConfig, draft_vocabulary, load_parts, train_head
from .features import features_path, write_features

FEATURE_CHUNK = 64  # training sequences per features file
FOLDER = "feature-head"


def write_all_features(models, examples, out: Path, log) -> int:
    """OUT/features/part-*.safetensors for the training examples; -> files written now."""
    runner = LeanModel(models.verifier)
    written, files, began = 0, -(-len(examples) // FEATURE_CHUNK), time.perf_counter()
    for index in range(0, len(examples), FEATURE_CHUNK):
        path = features_path(out, index // FEATURE_CHUNK)
        if not path.exists():
            positions = write_features(path, examples[index : index + FEATURE_CHUNK], runner)
            written += 1
            log(f"feature head: features file {index // FEATURE_CHUNK + 1}/{files}, {positions} positions "
                f"({time.perf_counter() - began:.0f} s)")
    log(f"feature head: features of {len(examples)} training sequences in {out / 'features'} ({written} files written now)")
    return written


def tune_feature_head(models, train_examples, cfg, out: Path, log, after_step=None) -> dict:
    """Features, then training; -> the head's info (also in OUT/feature-head/spectui-tune.json)."""
    folder = out / FOLDER
    if is_feature_head(folder):
        log(f"feature head: finished earlier, reusing {folder}")
        return json.loads((folder / "spectui-tune.json").read_text(encoding="utf-8"))
    verifier = models.verifier
    write_all_features(models, train_examples, out, log)
    parts = load_parts(out / "features")
    vocab = min(cfg.feature_vocab, verifier.config.vocab_size)
    with torch.random.fork_rng():  # the initial weights from the seed alone: a resumed run starts the same
        torch.manual_seed(cfg.seed * 1_000_003 + 977)
        head = FeatureHead(FeatureHeadConfig.for_verifier(verifier.config, vocab))
    head.vocab_ids.copy_(draft_vocabulary(parts, vocab))
    head.attach(verifier.get_input_embeddings().weight, verifier.get_output_embeddings().weight, dtype=None)
    train_cfg = FeatureTrainConfig(epochs=cfg.feature_epochs, lr=cfg.feature_lr, prompt_weight=cfg.feature_prompt_weight,
                                   seed=cfg.seed)
    checkpoints = out / f".{FOLDER}.training"
    positions = sum(int(p["starts"][-1]) for p in parts)
    log(f"feature head: {sum(p.numel() for p in head.parameters() if p.requires_grad) / 1e6:.2f} M parameters, "
        f"draft vocabulary {vocab}, {positions} positions, training")
    stats = train_head(head.train(), parts, train_cfg, log=log, checkpoints=checkpoints,
                       checkpoint_every=cfg.checkpoint_every, after_step=after_step)
    info = {"verifier": cfg.model, "quant": cfg.quant, "positions": positions, "draft_vocab": vocab,
            "train": {k: v for k, v in vars(train_cfg).items()}, **stats}
    tmp = out / f".{FOLDER}.saving"
    shutil.rmtree(tmp, ignore_errors=True)
    head.eval().save(tmp, {"spectui_tune": info})
    (tmp / "spectui-tune.json").write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
    tmp.rename(folder)
    if not cfg.keep_checkpoints:
        shutil.rmtree(checkpoints, ignore_errors=True)
    log(f"feature head: saved {folder} ({sum(p.stat().st_size for p in folder.iterdir()) / 1e6:.1f} MB)")
    return info
