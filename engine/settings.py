"""A run of the engine: RunSpec (what to load and how to generate) and its GenerationSettings.

The CLI builds a RunSpec from its flags, the app from its config and model picker (spectui/config.py
`Config.run_spec`); load_engine loads one, the engine process gets one in its LoadRequest, bench runs
every method from one. Traces record what ran (events.RunInfo)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .presets import DEFAULT_PRESET

AUTO = "auto"  # the tree chosen each step from measured costs and acceptance (auto_tree.py)
DEFAULT_TREE = AUTO
FIXED_TREE_NODE_BUDGET = 256  # nodes one speculator's fixed expansion may add
DEFAULT_MERGE = "union"
MERGE_POLICIES = ("union", "vote")  # how several speculators' trees merge (engine/merge.py applies them)
MAX_SEED = 2**63 - 1  # torch seeds a generator with a signed 64-bit integer


@dataclass
class GenerationSettings:
    max_new_tokens: int = 256
    temperature: float = 0.0  # 0 means greedy
    top_p: float = 1.0
    seed: int | None = None
    tree_shape: tuple[int, ...] | str = DEFAULT_TREE  # "auto", or children per node at each depth (SpecInfer's expansion config)
    speculate: bool = True  # False: incremental decoding, one token per verifier step (--no-spec)
    merge: str = DEFAULT_MERGE
    detail: bool = False  # fill the events' trees (token text, verifier probabilities): for display and traces
    pipeline: bool = False  # draft the next step's root while the verifier runs (pipeline.py); off: it did not pay here

    def __post_init__(self) -> None:
        if self.tree_shape != AUTO:
            self.tree_shape = check_shape(tuple(self.tree_shape), str(self.tree_shape))
        if self.max_new_tokens < 1:
            raise ValueError("--max-new-tokens must be at least 1")
        if not (math.isfinite(self.temperature) and self.temperature >= 0):  # NaN and inf too
            raise ValueError(f"--temperature {self.temperature}: must be a finite number >= 0 (0 is greedy)")
        if not (math.isfinite(self.top_p) and 0 < self.top_p <= 1):
            raise ValueError(f"--top-p {self.top_p}: must be in (0, 1]")
        if self.seed is not None and not 0 <= self.seed <= MAX_SEED:
            raise ValueError(f"--seed {self.seed}: must be an integer from 0 to {MAX_SEED}")
        if self.merge not in MERGE_POLICIES:
            raise ValueError(f"--merge must be {' or '.join(MERGE_POLICIES)}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def auto(self) -> bool:
        return self.tree_shape == AUTO


@dataclass
class RunSpec:
    """What to load and how to generate. The values are the flags' (checked when loading:
    presets.resolve_model / resolve_ssm, loading.check_quant); the engine process takes the load part
    and each turn's settings (the app's settings change between turns)."""

    model: str = DEFAULT_PRESET  # a preset, hub id, model folder or .gguf file (--model)
    ssms: tuple[str, ...] = ()  # SSMs beside the preset's own (--ssm)
    speculators: str = "default"  # the preset's own, "ngram", "none" or one SSM (presets.choose_speculators)
    quant: str = "nf4"
    device: str = "auto"
    settings: GenerationSettings = field(default_factory=GenerationSettings)

    def __post_init__(self) -> None:
        self.ssms = tuple(self.ssms)


def shape_nodes(shape: tuple[int, ...]) -> int:
    """Nodes one speculator's expansion adds: w1 + w1*w2 + ... (root excluded)."""
    total, level = 0, 1
    for width in shape:
        level *= width
        total += level
    return total


def check_shape(shape: tuple[int, ...], text: str) -> tuple[int, ...]:
    if not shape or any(w < 1 for w in shape) or len(shape) > 16:
        raise ValueError(f"--tree {text!r}: expected auto or 1 to 16 positive integers, e.g. 2,2,1,1")
    nodes = shape_nodes(shape)
    if nodes > FIXED_TREE_NODE_BUDGET:
        raise ValueError(f"--tree {text!r}: {nodes} nodes per speculator, more than the limit of {FIXED_TREE_NODE_BUDGET}")
    return shape


def parse_tree(text: str) -> tuple[int, ...] | str:
    """'auto' -> 'auto'; '2,2,1,1' -> (2, 2, 1, 1); ValueError with the reason otherwise."""
    if text.strip().lower() == AUTO:
        return AUTO
    try:
        shape = tuple(int(part) for part in text.replace(" ", "").split(","))
    except ValueError:
        raise ValueError(f"--tree {text!r}: expected auto or comma-separated positive integers, e.g. 2,2,1,1") from None
    return check_shape(shape, text)


def tree_text(shape: tuple[int, ...] | str = DEFAULT_TREE) -> str:
    """(2, 2, 1, 1) -> '2,2,1,1', the --tree spelling; 'auto' stays."""
    return AUTO if shape == AUTO else ",".join(map(str, shape))
