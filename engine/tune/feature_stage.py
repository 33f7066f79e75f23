"""`spectui tune --feature-head`: the feature drafter (engine/feature_head.py) for the verifier.

Two steps after the answers stage, both resumable:

1. features: the verifier's final hidden states and top-4 next tokens over each training sequence
   (features.py), FEATURE_CHUNK sequences a file in OUT/features/; a file on disk is complete
   (written to a temp name, then renamed) and is reused. The answers stage keeps them as it decodes
   (OUT/answer-rows/, over prompt + answer[:-1]: the last answer token is never fed); a sequence
   answered without them (a run started without --feature-head) gets one teacher-forced pass.
   With --feature-prompts N, also over N prompts the verifier did not answer, their rendered text
   alone (OUT/prompt-features/features/): the head models the verifier's dynamics, which its
   features over any text show, at prefill speed (the shipped head's recipe, ssms/README.md).
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
from ..chat import ContextError
from ..lean_model import LeanModel
from .data import Example, is_held_out, prompt_ids
from .feature_train import FeatureTrainConfig, draft_vocabulary, load_parts, train_head
from .features import KeptRows, features_path, kept_features_dir, write_features
from .teacher_head import use_teacher_head

FEATURE_CHUNK = 64  # training sequences per features file
FOLDER = "feature-head"
PROMPT_FOLDER = "prompt-features"


def write_all_features(models, examples, out: Path, log, what: str = "training sequences",
                       kept: Path | None = None) -> int:
    """OUT/features/part-*.safetensors for the examples, from the rows kept while answering (`kept`:
    data.collect_answers keeps them with --feature-head) or teacher-forced passes; -> files written now."""
    runner = use_teacher_head(LeanModel(models.verifier))  # every row's top tokens: teacher_head.py
    rows = KeptRows(kept) if kept is not None and kept.is_dir() else None
    written, files, began = 0, -(-len(examples) // FEATURE_CHUNK), time.perf_counter()
    for index in range(0, len(examples), FEATURE_CHUNK):
        path = features_path(out, index // FEATURE_CHUNK)
        if not path.exists():
            positions = write_features(path, examples[index : index + FEATURE_CHUNK], runner, kept=rows)
            written += 1
            log(f"feature head: features file {index // FEATURE_CHUNK + 1}/{files}, {positions} positions "
                f"({time.perf_counter() - began:.0f} s)")
    log(f"feature head: features of {len(examples)} {what} in {out / 'features'} ({written} files written now)")
    return written


def unanswered_prompts(prompts, examples, cfg, log) -> list[str]:
    """Up to cfg.feature_prompts prompts of the prompt set (pipeline.Prompts) the verifier did not
    answer and evaluation does not hold out (Magpie's are synthesised for it where too few are
    left): the feature head's prompt-only data."""
    answered = {e.prompt for e in examples}

    def left() -> list[str]:
        return [t for t in prompts.texts if t not in answered and not is_held_out(t, cfg.eval_fraction)][: cfg.feature_prompts]
    texts = left()
    if len(texts) < cfg.feature_prompts and not prompts.from_file and not prompts.exhausted:
        prompts.synthesise(cfg.feature_prompts - len(texts))
        texts = left()
    log(f"feature head: {len(texts)} unanswered prompts for prompt-only features (--feature-prompts {cfg.feature_prompts})")
    return texts


def prompt_examples(models, texts: list[str], cfg, template: str | None, log) -> list[Example]:
    """Unanswered prompts rendered as the engine renders them: Examples with no answer."""
    examples = []
    for text in texts:
        try:
            ids = prompt_ids(models.tokenizer, text, models.context_window, cfg.max_answer_tokens, template)
        except ContextError:
            log(f"feature head: prompt skipped, it does not fit the context window: {text[:60]!r}")
            continue
        examples.append(Example(text, ids, [], "prompt", False))
    return examples


def tune_feature_head(models, train_examples, cfg, out: Path, log, after_step=None, prompts: list[str] = (),
                      template: str | None = None) -> dict:
    """Features (of the training sequences, and of `prompts` alone: OUT/prompt-features), then
    training; -> the head's info (also in OUT/feature-head/spectui-tune.json)."""
    folder = out / FOLDER
    if is_feature_head(folder):
        log(f"feature head: finished earlier, reusing {folder}")
        return json.loads((folder / "spectui-tune.json").read_text(encoding="utf-8"))
    verifier = models.verifier
    write_all_features(models, train_examples, out, log, kept=kept_features_dir(out))
    parts = load_parts(out / "features")
    if prompts:
        write_all_features(models, prompt_examples(models, list(prompts), cfg, template, log), out / PROMPT_FOLDER, log,
                           "unanswered prompts")
        parts += load_parts(out / PROMPT_FOLDER / "features")
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
