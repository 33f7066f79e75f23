"""TuneConfig: every knob of `spectui tune`, with defaults sized for the embedded verifier on a 2-core CPU.

The defaults (measured in docs/tuning.md) finish the whole run for `smollm2-135m` (prompt
synthesis, answers, two SSMs, evaluation) in roughly 60-90 minutes on a 2-core CPU.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path


class TuneConfigError(ValueError):
    """A knob out of range (exit code 2)."""


@dataclass
class TuneConfig:
    out: Path = Path("tuned")
    model: str = "smollm2-135m"
    ssms: int = 2  # number of SSMs, boost-tuned one after the other
    prompts_file: Path | None = None  # None: synthesise prompts with Magpie
    tokens: int = 200_000  # target number of verifier answer tokens (training + held-out data)
    quant: str = "nf4"  # the verifier's weights, as the engine loads them
    device: str = "auto"
    threads: int | None = None  # torch threads; None keeps torch's default
    resume: bool = False
    seed: int = 0
    keep_checkpoints: bool = False  # keep OUT/ssm-K/checkpoint.pt after SSM K is finished

    # Magpie prompt synthesis
    magpie_batch: int = 32
    magpie_max_tokens: int = 80
    magpie_temperature: float = 1.0
    magpie_top_p: float = 0.95
    magpie_require_end: bool = True  # drop samples that hit magpie_max_tokens before the end of the turn
    min_prompt_chars: int = 15
    max_prompt_chars: int = 400
    min_printable: float = 0.95  # fraction of printable characters (whitespace counts as printable)
    exclude_file: Path | None = None  # development prompts, measured on and never trained on: Magpie output
    # that copies one is dropped (the CLI passes the package's copy of the bench questions)
    prompts_margin: float = 1.0  # synthesise this many times the prompts the token target needs up front
    expected_answer_tokens: int = 210  # measured mean answer length (max 256), to size the prompt set;
    # the answer stage synthesises more on demand when answers run shorter

    # verifier answers
    batch_size: int = 32
    max_answer_tokens: int = 256
    greedy_fraction: float = 0.5  # share of batches decoded greedily; the rest are sampled
    sample_temperature: float = 0.8
    sample_top_p: float = 0.95
    eval_fraction: float = 0.05  # prompts held out for evaluation (by a hash of the prompt)

    # the SSM (LLaMA architecture, tied embeddings)
    hidden: int = 128
    layers: int = 2
    heads: int = 4
    kv_heads: int = 2
    intermediate: int = 384

    # training
    epochs: float = 3.0
    lr: float = 3e-3
    min_lr_ratio: float = 0.1  # the cosine schedule ends at lr * min_lr_ratio
    warmup_steps: int = 50
    weight_decay: float = 0.01
    batch_tokens: int = 2048  # padded tokens per optimizer step (length-bucketed batches)
    max_seq_len: int = 1024  # longer examples keep their last max_seq_len tokens
    checkpoint_every: int = 200  # optimizer steps between checkpoints
    hit_weight: float = 0.1  # boost weight of positions an earlier SSM already predicts (misses get 1.0)
    soft_weight: float = 0.7  # share of the loss on the verifier's top-K distribution (distill.py); 0: labels only
    teacher_k: int = 8  # verifier tokens kept per position as soft targets (teacher.py)
    prompt_weight: float = 0.0  # weight of the prompts' positions (soft targets only); 0: answers only
    autocast_bf16: bool = True  # bf16 autocast for the SSM's matmuls on CPU (fp32 master weights)

    # the feature drafter (feature_stage.py): off unless --feature-head
    feature_head: bool = False
    feature_epochs: float = 3.0
    feature_lr: float = 3e-3
    feature_vocab: int = 8192  # tokens the head may draft: those the verifier ranks first most often
    feature_prompt_weight: float = 0.5  # loss weight of prompt positions (answer positions weigh 1)
    feature_prompts: int = 0  # prompts the verifier does not answer whose own features join the head's data

    # evaluation
    top_k: int = 3

    def validate(self) -> "TuneConfig":
        checks = [
            (self.ssms >= (0 if self.feature_head else 1), "--ssms must be at least 1 (0 with --feature-head)"),
            (self.feature_epochs > 0 and self.feature_lr > 0, "--feature-epochs and the feature head's lr must be positive"),
            (self.feature_vocab >= 16, "--feature-vocab must be at least 16"),
            (0 <= self.feature_prompt_weight <= 1, "the feature head's prompt weight must be in [0, 1]"),
            (self.feature_prompts >= 0, "--feature-prompts must be at least 0"),
            (self.tokens >= 1, "--tokens must be at least 1"),
            (self.threads is None or self.threads >= 1, "--threads must be at least 1"),
            (self.magpie_batch >= 1 and self.batch_size >= 1, "--batch-size must be at least 1"),
            (self.magpie_max_tokens >= 1, "magpie_max_tokens must be at least 1"),
            (self.max_answer_tokens >= 1, "--max-answer-tokens must be at least 1"),
            (0 <= self.greedy_fraction <= 1, "--greedy-fraction must be in [0, 1]"),
            (0 < self.sample_top_p <= 1 and 0 < self.magpie_top_p <= 1, "top_p must be in (0, 1]"),
            (self.sample_temperature > 0 and self.magpie_temperature > 0, "sampling temperatures must be positive"),
            (0 <= self.eval_fraction < 1, "--eval-fraction must be in [0, 1)"),
            (min(self.hidden, self.layers, self.heads, self.kv_heads, self.intermediate) >= 1,
             "--hidden, --layers, heads and intermediate size must be at least 1"),
            (self.hidden % self.heads == 0, f"--hidden {self.hidden} must be a multiple of the {self.heads} heads"),
            (self.heads % self.kv_heads == 0, "heads must be a multiple of kv_heads"),
            (self.epochs > 0, "--epochs must be positive"),
            (self.lr > 0 and 0 <= self.min_lr_ratio <= 1, "lr must be positive, min_lr_ratio in [0, 1]"),
            (self.batch_tokens >= 16 and self.max_seq_len >= 8, "batch_tokens and max_seq_len are too small"),
            (self.checkpoint_every >= 1, "checkpoint_every must be at least 1"),
            (0 <= self.hit_weight <= 1, "--hit-weight must be in [0, 1]"),
            (0 <= self.soft_weight <= 1, "--soft-weight must be in [0, 1]"),
            (1 <= self.teacher_k <= 64, "--teacher-k must be in [1, 64]"),
            (0 <= self.prompt_weight <= 1, "--prompt-weight must be in [0, 1]"),
            (self.prompt_weight == 0 or self.soft_weight > 0, "--prompt-weight needs soft targets (--soft-weight > 0)"),
            (self.top_k >= 1, "--top-k must be at least 1"),
            (0 < self.min_prompt_chars <= self.max_prompt_chars, "prompt length bounds are inverted"),
        ]
        for ok, message in checks:
            if not ok:
                raise TuneConfigError(message)
        return self

    def to_json(self) -> str:
        return json.dumps({k: str(v) if isinstance(v, Path) else v for k, v in asdict(self).items()}, indent=2)

    @classmethod
    def knobs(cls) -> list[str]:
        return [f.name for f in fields(cls)]
