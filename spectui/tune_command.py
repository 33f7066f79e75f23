"""`spectui tune`: boost-tune small speculative models (SSMs) for a verifier (engine/tune/, docs/tuning.md).

Long runs belong in the background (`nohup spectui tune ... &`); OUT/tune.log follows progress and
`--resume` continues an interrupted run where it stopped. Bad input is one line and exit 2, and
every option (the prompts file's content included) is checked before anything is written.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Optional

import typer

from . import paths
from .data import bench_questions, tune_prompts
from .engine.tune import TuneConfig
from .options import DeviceOpt, ModelOpt, QuantOpt, UsageFailure, friendly_errors

D = TuneConfig  # its class attributes are the defaults the help texts quote
MAX_TUNE_SEED = 2**32 - 1  # tune seeds torch with seed * 1_000_003 + offsets, which must stay within 64 bits


def knob(flag: str, text: str):
    """An optional override of a TuneConfig default (None keeps the default)."""
    return typer.Option(None, flag, help=text)


def default_out(model: str) -> Path:
    """<user data dir>/tuned/<model name> ($SPECTUI_HOME/data/tuned/... when SPECTUI_HOME is set)."""
    name = Path(model.rstrip("/")).name or "model"
    return paths.data_dir() / "tuned" / name.removesuffix(".gguf")


def tune(
    model: str = ModelOpt,
    ssms: int = typer.Option(D.ssms, "--ssms", help="how many SSMs to boost-tune, one after the other (0: only --feature-head)"),
    feature_head: bool = typer.Option(False, "--feature-head", help="also train a feature drafter (EAGLE) that reads the verifier's hidden states"),
    feature_epochs: Optional[float] = knob("--feature-epochs", f"feature head training epochs (default {D.feature_epochs:g})"),
    feature_vocab: Optional[int] = knob("--feature-vocab", f"tokens the feature head may draft (default {D.feature_vocab})"),
    feature_prompts: Optional[int] = knob("--feature-prompts", "also the verifier's features over N more prompts of the prompt "
                                          "set, unanswered (a prefill each: about 5x the positions a second of answering)"),
    prompts: Optional[Path] = typer.Option(None, "--prompts", help="prompts file (JSONL or one a line); default: Magpie"),
    shipped_prompts: bool = typer.Option(
        False, "--shipped-prompts", help="tune on the 2,400 real prompts in 8 categories shipped with spectui, not Magpie's",
    ),
    tokens: Optional[int] = knob("--tokens", f"verifier answer tokens to generate (default {D.tokens}: about an hour)"),
    out: Optional[Path] = typer.Option(None, "--out", help="output folder (default: <data dir>/tuned/<model>)"),
    resume: bool = typer.Option(False, "--resume", help="continue the run in --out: skip finished work, load checkpoints"),
    quant: str = QuantOpt,
    device: str = DeviceOpt,
    threads: Optional[int] = typer.Option(None, "--threads", help="torch CPU threads (default: torch's)"),
    hidden: Optional[int] = knob("--hidden", f"SSM hidden size (default {D.hidden})"),
    layers: Optional[int] = knob("--layers", f"SSM layers (default {D.layers})"),
    heads: Optional[int] = knob("--heads", f"SSM attention heads (default {D.heads})"),
    kv_heads: Optional[int] = knob("--kv-heads", f"SSM key/value heads (default {D.kv_heads})"),
    intermediate: Optional[int] = knob("--intermediate", f"SSM MLP size (default {D.intermediate})"),
    epochs: Optional[float] = knob("--epochs", f"training epochs per SSM (default {D.epochs:g})"),
    batch_size: Optional[int] = knob("--batch-size", f"verifier generate batch (default {D.batch_size})"),
    max_answer_tokens: Optional[int] = knob("--max-answer-tokens", f"longest verifier answer (default {D.max_answer_tokens})"),
    batch_tokens: Optional[int] = knob("--batch-tokens", f"padded tokens per training step (default {D.batch_tokens})"),
    checkpoint_every: Optional[int] = knob("--checkpoint-every", f"steps between checkpoints (default {D.checkpoint_every})"),
    hit_weight: Optional[float] = knob("--hit-weight", f"loss weight where earlier SSMs hit (default {D.hit_weight})"),
    soft_weight: Optional[float] = knob("--soft-weight", f"share of the loss on the verifier's top-K probabilities; 0: its tokens only (default {D.soft_weight})"),
    teacher_k: Optional[int] = knob("--teacher-k", f"verifier tokens kept per position as soft targets (default {D.teacher_k})"),
    prompt_weight: Optional[float] = knob("--prompt-weight", f"loss weight of prompt positions, soft targets only; 0: answers only (default {D.prompt_weight})"),
    top_k: Optional[int] = knob("--top-k", f"k of the top-k agreement (default {D.top_k})"),
    seed: int = typer.Option(D.seed, "--seed"),
    keep_checkpoints: bool = typer.Option(False, "--keep-checkpoints", help="keep ssm-K/checkpoint.pt after training"),
) -> None:
    """Synthesise prompts, collect the verifier's answers and boost-tune SSMs on them (SpecInfer);
    with --feature-head, also train a feature drafter (EAGLE) on the verifier's hidden states."""
    from dataclasses import replace

    from .engine import check_quant, pick_device, resolve_model
    from .engine.tune import read_prompt_file, run_tune

    with friendly_errors():
        if prompts is not None and shipped_prompts:
            raise UsageFailure("--prompts and --shipped-prompts: give one of them")
        if prompts is not None and not prompts.is_file():
            raise UsageFailure(f"--prompts {prompts}: no such file")
        check_quant(quant)
        pick_device(device)  # an unknown or unavailable --device: exit 2 here, not after OUT is written
        if not 0 <= seed <= MAX_TUNE_SEED:
            raise UsageFailure(f"--seed {seed}: must be an integer from 0 to {MAX_TUNE_SEED}")
        for flag, value in (("--epochs", epochs), ("--feature-epochs", feature_epochs)):
            if value is not None and not math.isfinite(value):
                raise UsageFailure(f"{flag} {value}: must be a finite number")
        if shipped_prompts:
            prompts = tune_prompts(paths.cache_dir())  # unpacked once from the package
        if prompts is not None:
            read_prompt_file(prompts)  # unreadable or empty: TuneConfigError (exit 2)
        preset = resolve_model(model)
        knobs = dict(
            tokens=tokens, hidden=hidden, layers=layers, heads=heads, kv_heads=kv_heads, intermediate=intermediate,
            epochs=epochs, batch_size=batch_size, max_answer_tokens=max_answer_tokens, hit_weight=hit_weight,
            top_k=top_k, batch_tokens=batch_tokens, checkpoint_every=checkpoint_every, soft_weight=soft_weight,
            teacher_k=teacher_k, prompt_weight=prompt_weight, feature_epochs=feature_epochs, feature_vocab=feature_vocab,
            feature_prompts=feature_prompts,
        )
        overrides = {key: value for key, value in knobs.items() if value is not None}
        if batch_size is not None:
            overrides["magpie_batch"] = batch_size
        if heads is not None and kv_heads is None and heads % D.kv_heads:
            overrides["kv_heads"] = heads  # plain multi-head attention when the default grouping does not divide
        cfg = replace(
            TuneConfig(), out=out or default_out(preset.name), model=model, ssms=ssms, prompts_file=prompts,
            quant=quant, device=device, threads=threads, resume=resume, seed=seed, keep_checkpoints=keep_checkpoints,
            feature_head=feature_head, exclude_file=bench_questions(),  # the package's copy: found wherever it is installed
            **overrides,
        ).validate()
        report = run_tune(cfg, models_dir=paths.models_dir())  # logs the agreement lines itself
    folders = [entry["folder"] for entry in report["ssms"]]
    typer.echo(f"speculators in {report['out']}: " + ", ".join(Path(f).name for f in folders))
    typer.echo("use them with: spectui chat " + " ".join(f"--ssm {f}" for f in folders))
