"""Run the tuning stages in order: prompts -> answers -> SSM 1..K (boosted) -> feature head -> evaluation.

Everything lands in OUT:
  tune.log          timestamped log (stage starts, throughput, losses, checkpoints, agreement)
  tune-config.json  the knobs of the latest run
  prompts.jsonl     {"prompt": str} per line (Magpie output, appended as it is kept, or the user's file)
  data/             the verifier's answers (data.py)
  ssm-K/            SSM K: config.json, model.safetensors (bf16), tokenizer, spectui-tune.json;
                    checkpoint.pt while it trains (kept afterwards only with keep_checkpoints)
  features/         with --feature-head: the verifier's features of the training sequences
  prompt-features/  with --feature-prompts N: its features over N unanswered prompts (features/ inside)
  feature-head/     the feature drafter (feature_stage.py); .feature-head.training/ while it trains
  report.json       agreement with the verifier per SSM and together, data sizes, timings
With cfg.resume every stage skips what is on disk: kept prompts, finished shards, finished SSMs,
feature files and a finished head, and training (an SSM's, the head's) continues from its checkpoint.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Callable, Iterator

import torch
from tqdm import tqdm

from .config import TuneConfig, TuneConfigError

LOGGER = "spectui.tune"


class OutputNotEmpty(TuneConfigError):
    """OUT holds files and --resume was not given."""


class Progress:
    """A tqdm bar on stderr that also logs its state (to tune.log) at most every `every_s` seconds."""

    def __init__(self, log: logging.Logger, desc: str, total: int | None, unit: str, every_s: float = 60.0):
        interactive = sys.stderr.isatty()
        self.bar = tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, dynamic_ncols=True,
                        mininterval=0.5 if interactive else 30.0, unit_scale=unit == "tok")
        self.log, self.desc, self.unit, self.every_s = log, desc, unit, every_s
        self.last = time.monotonic()

    def __call__(self, n: int) -> None:
        if self.bar.total is not None and self.bar.n + n > self.bar.total:
            self.bar.total = self.bar.n + n  # the last answer batch overshoots the token target
        self.bar.update(n)
        if time.monotonic() - self.last >= self.every_s:
            self.last = time.monotonic()
            rate = self.bar.format_dict.get("rate") or 0.0
            total = f"/{self.bar.total}" if self.bar.total else ""
            noun = {"tok": "tokens", "prompt": "prompts"}.get(self.unit, self.unit)
            self.log.info(f"{self.desc}: {self.bar.n}{total} {noun} ({rate:.1f} {noun}/s)", extra={"file_only": True})

    def close(self) -> None:
        self.bar.close()


class _TqdmHandler(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        if getattr(record, "file_only", False):  # progress (the bar shows it) or a failure the CLI reports
            return
        tqdm.write(f"tune: {record.getMessage()}", file=sys.stderr)


@contextlib.contextmanager
def tune_logger(out: Path) -> Iterator[logging.Logger]:
    """Log lines go to OUT/tune.log (timestamped) and to stderr (above the progress bars)."""
    log = logging.getLogger(LOGGER)
    log.setLevel(logging.INFO)
    log.propagate = False
    file_handler = logging.FileHandler(out / "tune.log", encoding="utf-8")
    file_handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%Y-%m-%d %H:%M:%S"))
    handlers = [file_handler, _TqdmHandler()]
    for h in handlers:
        log.addHandler(h)
    try:
        yield log
    finally:
        for h in handlers:
            log.removeHandler(h)
            h.close()


def check_output(out: Path, resume: bool) -> None:
    if out.exists() and not out.is_dir():
        raise TuneConfigError(f"--out {out} is a file, not a folder")
    if not resume and out.exists() and any(out.iterdir()):
        raise OutputNotEmpty(f"--out {out} is not empty: pass --resume to continue the run there, or pick another --out")


def read_prompt_file(path: Path) -> list[str]:
    """The prompts of a prompts file (engine/prompt_files.py: JSONL or one a line); TuneConfigError if bad."""
    from ..prompt_files import PromptFileError, read_prompt_file as read_rows

    try:
        return [text for text, _ in read_rows(path)]
    except PromptFileError as exc:
        raise TuneConfigError(str(exc)) from None


def read_kept_prompts(path: Path) -> list[str]:
    """OUT/prompts.jsonl; a line cut short by a killed run is skipped."""
    texts = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            texts.append(json.loads(line)["prompt"])
        except (ValueError, KeyError, TypeError):
            continue
    return texts


class Prompts:
    """OUT/prompts.jsonl: the user's prompts, or Magpie's, grown on demand; batch(i) for the data stage."""

    def __init__(self, out: Path, cfg: TuneConfig, models, template: str | None, log: logging.Logger):
        self.path = out / "prompts.jsonl"
        self.cfg, self.models, self.template, self.log = cfg, models, template, log
        self.texts: list[str] = []
        self.from_file = cfg.prompts_file is not None
        self.rounds = 0
        self.exhausted = False
        self.seconds = 0.0
        self.synthesised = 0
        if self.path.exists():
            self.texts = read_kept_prompts(self.path)

    def prepare(self) -> None:
        cfg = self.cfg
        if self.from_file:
            if self.texts:
                self.log.info(f"prompts: {len(self.texts)} from {self.path} (copied from the prompts file earlier)")
                return
            from .magpie import normalise, read_excluded

            self.texts = read_prompt_file(cfg.prompts_file)
            self.path.write_text("".join(json.dumps({"prompt": t}) + "\n" for t in self.texts), encoding="utf-8")
            self.log.info(f"prompts: {len(self.texts)} from {cfg.prompts_file}")
            bench = read_excluded(cfg.exclude_file)
            copied = sum(normalise(t) in bench for t in self.texts)
            if copied:
                self.log.info(f"prompts: warning: {copied} of them are bench questions ({cfg.exclude_file}); "
                              "SSMs tuned on them will look better on that bench than they are")
            return
        wanted = math.ceil(cfg.tokens / cfg.expected_answer_tokens * cfg.prompts_margin)
        wanted = math.ceil(wanted / cfg.batch_size) * cfg.batch_size  # whole answer batches
        if len(self.texts) >= wanted:
            self.log.info(f"prompts: {len(self.texts)} already synthesised")
            return
        self.synthesise(wanted - len(self.texts))

    def synthesise(self, count: int) -> int:
        from .magpie import Deduper, synthesise

        cfg, models = self.cfg, self.models
        self.log.info(f"prompts: synthesising {count} with Magpie ({len(self.texts)} kept so far)")
        bar = Progress(self.log, "prompts", count, "prompt")
        rejected: dict[str, int] = {}
        began = time.perf_counter()
        with self.path.open("a", encoding="utf-8") as handle:

            def keep(text: str) -> None:
                self.texts.append(text)
                handle.write(json.dumps({"prompt": text}) + "\n")
                handle.flush()

            kept = synthesise(
                models.verifier, models.tokenizer, self.template, models.stop_token_ids(), count, cfg,
                Deduper(self.texts), keep, rejected, bar, round_offset=len(self.texts) * 7919 + self.rounds,
            )
        bar.close()
        self.rounds += 1
        elapsed = time.perf_counter() - began
        self.seconds += elapsed
        self.synthesised += kept
        self.log.info(f"prompts: kept {kept} in {elapsed:.0f} s ({kept / max(elapsed, 1e-9):.2f} prompts/s); "
                      f"rejected {dict(sorted(rejected.items()))}")
        if kept < count:
            self.log.info("prompts: the verifier rarely wrote usable prompts; continuing with fewer")
        return kept

    def batch(self, index: int) -> tuple[list[str], bool]:
        """The prompts of answer batch `index` and whether they repeat earlier ones.

        A user file is cycled pass after pass (later passes are repeats); Magpie prompts are grown on
        demand instead, so every batch gets fresh prompts.
        """
        size = self.cfg.batch_size
        if self.from_file:
            per_pass = math.ceil(len(self.texts) / size)
            repeat, within = divmod(index, per_pass)
            return self.texts[within * size : (within + 1) * size], repeat > 0
        end = (index + 1) * size
        if end > len(self.texts) and not self.exhausted:
            if self.synthesise(end - len(self.texts)) == 0:
                self.exhausted = True
        return self.texts[index * size : end], False


def folder_size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.iterdir() if p.is_file() and p.name != "checkpoint.pt")


def run_tune(cfg: TuneConfig, after_step: Callable[[int, int, float], None] | None = None,
             models_dir: Path | None = None) -> dict:
    """All stages; -> the report (also in OUT/report.json). after_step(ssm, step, loss) observes training;
    the verifier is loaded from the model cache models_dir (engine/loading.py)."""
    from ..presets import resolve_model

    cfg.validate()
    out = Path(cfg.out).expanduser()
    check_output(out, cfg.resume)
    preset = resolve_model(cfg.model)  # bad names fail before OUT is created
    if cfg.prompts_file is not None and not Path(cfg.prompts_file).is_file():
        raise TuneConfigError(f"--prompts {cfg.prompts_file}: no such file")
    out.mkdir(parents=True, exist_ok=True)
    threads = torch.get_num_threads()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    with tune_logger(out) as log:
        try:
            return run_stages(cfg, out, preset, log, after_step, models_dir)
        except KeyboardInterrupt:
            log.info(f"interrupted: continue with the same command plus --resume (--out {out})")
            raise
        except Exception as exc:
            log.info(f"failed: {type(exc).__name__}: {exc}", extra={"file_only": True})
            raise
        finally:
            torch.set_num_threads(threads)


def tune_ssm(
    k: int, folder: Path, models, cfg: TuneConfig, verifier_name: str, train_seqs, earlier_top1, log, after_step,
    teacher=None,
) -> dict:
    """Boost-weight the data by what SSMs 1..k-1 miss, train SSM k, save its folder; -> its info."""
    from .boost import boost_weights
    from .ssm import build_ssm, parameter_count
    from .train import checkpoint_path, planned_tokens, save_final, train_ssm

    weights = [boost_weights(torch.tensor(s.targets), [p[i] for p in earlier_top1], cfg.hit_weight)
               for i, s in enumerate(train_seqs)]  # per sequence [A_i]
    if earlier_top1:
        missed = sum(int((w == 1).sum()) for w in weights) / max(1, sum(w.numel() for w in weights))
        log.info(f"ssm-{k}: the earlier SSMs miss {missed:.1%} of the training positions "
                 f"(weight 1; hits weigh {cfg.hit_weight})")
    model = build_ssm(models.verifier, cfg, seed=cfg.seed + k).to(models.device)
    log.info(f"ssm-{k}: {parameter_count(model) / 1e6:.2f} M parameters, training")
    bar = Progress(log, f"ssm-{k}", planned_tokens(train_seqs, cfg), "tok")
    began = time.perf_counter()
    observe = None if after_step is None else (lambda step, loss: after_step(k, step, loss))
    stats = train_ssm(model, train_seqs, weights, cfg, k, folder, bar, log.info, observe, teacher)
    bar.close()
    info = {"ssm": k, "verifier": verifier_name, "quant": cfg.quant, "train_sequences": len(train_seqs),
            "hit_weight": cfg.hit_weight, "soft_weight": cfg.soft_weight if teacher else 0.0, **stats, "seconds": round(time.perf_counter() - began, 1),
            "architecture": {n: getattr(cfg, n) for n in ("hidden", "layers", "heads", "kv_heads", "intermediate")}}
    save_final(model, models.tokenizer, folder, info)
    if not cfg.keep_checkpoints:
        checkpoint_path(folder).unlink(missing_ok=True)
    log.info(f"ssm-{k}: saved {folder} ({folder_size(folder) / 1e6:.1f} MB)")
    return info


def load_speculator(folder: Path, models, device: str):
    """An SSM folder or a feature head (given the verifier), as the engine loads it."""
    from ..feature_head import is_feature_head
    from ..loading import load_drafter, load_feature_head

    if is_feature_head(folder):
        return load_feature_head(folder.name, folder, models.verifier, device)
    return load_drafter(folder, device)


def run_stages(cfg: TuneConfig, out: Path, preset, log: logging.Logger, after_step, models_dir: Path | None) -> dict:
    from ..loading import load_drafter, load_models
    from .data import collect_answers, split
    from .evaluate import evaluate, predict_topk, report_lines
    from .train import is_finished, to_sequences

    timings: dict[str, float] = {}
    throughput: dict[str, float] = {}
    log.info(f"tune {preset.name}: {cfg.ssms} SSM(s), {cfg.tokens} answer tokens, out {out}"
             f"{' (resuming)' if cfg.resume else ''}, {torch.get_num_threads()} threads")
    (out / "tune-config.json").write_text(cfg.to_json() + "\n", encoding="utf-8")
    began = time.perf_counter()
    models = load_models(replace(preset, ssms=()), quant=cfg.quant, device=cfg.device, models_dir=models_dir)  # the verifier alone
    timings["load"] = time.perf_counter() - began
    if cfg.feature_head:
        from ..lean_model import supports

        if not supports(models.verifier):
            raise TuneConfigError("--feature-head: the feature drafter runs with a LLaMA verifier on the CPU path only")
    template = models.chat_template
    device = models.device

    # 1. prompts
    prompts = Prompts(out, cfg, models, template, log)
    prompts.prepare()

    # 2. the verifier's answers
    log.info(f"data: answering with the verifier ({cfg.quant}), batches of {cfg.batch_size}, "
             f"up to {cfg.max_answer_tokens} tokens, {cfg.greedy_fraction:.0%} greedy")
    bar = Progress(log, "answers", cfg.tokens, "tok")
    examples, fresh, seconds = collect_answers(models, template, prompts.batch, cfg, out, bar, log.info)
    bar.close()
    if fresh:
        throughput["answer_tokens_per_s"] = round(fresh / seconds, 1)
        log.info(f"data: generated {fresh} answer tokens in {seconds:.0f} s ({fresh / seconds:.1f} tokens/s)")
    if prompts.synthesised:
        throughput["magpie_prompts_per_s"] = round(prompts.synthesised / prompts.seconds, 3)
        timings["prompts"] = prompts.seconds
    timings["answers"] = seconds
    train_ex, held_ex = split(examples, cfg.eval_fraction)
    train_seqs, held_seqs = to_sequences(train_ex, cfg.max_seq_len), to_sequences(held_ex, cfg.max_seq_len)
    if not train_seqs:
        raise TuneConfigError("no training data: the prompts gave no answers")
    log.info(f"data: {len(examples)} examples, {sum(len(e.answer_ids) for e in examples)} answer tokens; "
             f"{len(train_seqs)} for training, {len(held_seqs)} held out")

    # 3. the verifier's soft targets (teacher.py), then SSMs boosted one after the other
    teacher = None
    if cfg.soft_weight > 0 and cfg.ssms > 0:  # only SSMs learn from them (the feature head has its own targets)
        from .teacher import ensure_teacher

        began, bar = time.perf_counter(), Progress(log, "teacher", sum(len(s.ids) for s in train_seqs), "tok")
        teacher = ensure_teacher(models.verifier, train_seqs, out, cfg.teacher_k, cfg.batch_tokens, bar, log.info)
        bar.close()
        timings["teacher"] = time.perf_counter() - began
    earlier_top1: list[list[torch.Tensor]] = []  # per earlier SSM, per training sequence [A_i]
    ssm_entries = []
    for k in range(1, cfg.ssms + 1):
        folder = out / f"ssm-{k}"
        if is_finished(folder):
            log.info(f"ssm-{k}: finished earlier, reusing {folder}")
            info = json.loads((folder / "spectui-tune.json").read_text()) if (folder / "spectui-tune.json").exists() else {}
        else:
            info = tune_ssm(k, folder, models, cfg, preset.name, train_seqs, earlier_top1, log, after_step, teacher)
            timings[f"ssm-{k}"] = info["seconds"]
            if info.get("tokens_per_s"):
                throughput[f"ssm-{k}_train_tokens_per_s"] = round(info["tokens_per_s"], 1)
        if k < cfg.ssms:  # the next SSM's boost weights need this one's top-1, as the engine runs it
            ssm = load_drafter(folder, device)
            earlier_top1.append([p[:, 0] for p in predict_topk(ssm, train_seqs, 1, cfg.batch_tokens)])
            del ssm
        ssm_entries.append({"name": f"ssm-{k}", "folder": str(folder), "size_mb": round(folder_size(folder) / 1e6, 2),
                            "train": {key: info.get(key) for key in ("steps", "final_loss", "tokens_per_s", "seconds")}})

    # 4. the feature drafter (feature_stage.py)
    if cfg.feature_head:
        from .feature_stage import tune_feature_head, unanswered_prompts

        began = time.perf_counter()
        observe = None if after_step is None else (lambda step, loss: after_step(0, step, loss))
        extra = unanswered_prompts(prompts, examples, cfg, log.info) if cfg.feature_prompts else []
        info = tune_feature_head(models, train_ex, cfg, out, log.info, observe, extra, template)
        timings["feature-head"] = time.perf_counter() - began
        folder = out / "feature-head"
        ssm_entries.append({"name": "feature-head", "folder": str(folder), "size_mb": round(folder_size(folder) / 1e6, 2),
                            "train": {key: info.get(key) for key in ("steps", "final_loss", "seconds")}})

    # 5. agreement on held-out answers
    began = time.perf_counter()
    loaded = [(e["name"], load_speculator(Path(e["folder"]), models, device)) for e in ssm_entries]
    agreement = evaluate(loaded, held_seqs, cfg.top_k, cfg.batch_tokens)
    timings["evaluate"] = time.perf_counter() - began
    for part in ("all", "greedy"):
        for entry, row in zip(ssm_entries, agreement[part]["ssms"]):
            entry.setdefault("agreement", {})[part] = {k: v for k, v in row.items() if k != "name"}
    report = {
        "model": preset.name,
        "quant": cfg.quant,
        "out": str(out),
        "top_k": cfg.top_k,
        "data": {
            "prompts": len(prompts.texts),
            "examples": len(examples),
            "answer_tokens": sum(len(e.answer_ids) for e in examples),
            "greedy_examples": sum(e.mode == "greedy" for e in examples),
            "train_sequences": len(train_seqs),
            "held_out_sequences": len(held_seqs),
            "held_out_positions": agreement["all"]["positions"],
        },
        "ssms": ssm_entries,
        "together": {part: agreement[part]["together"] for part in ("all", "greedy")},
        "timings_s": {key: round(v, 1) for key, v in timings.items()},
        "throughput": throughput,
    }
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    for line in report_lines(report):
        log.info(line)
    return report
