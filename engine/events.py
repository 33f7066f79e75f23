"""StepEvent: the one contract between the engine and its consumers (TUI, traces, bench, CLI).

The engine yields one StepEvent per verifier forward pass. Step 0 is the prefill: it has no
tree and commits the verifier's first token as its `bonus_token`. Every later step carries the
merged token tree that the drafters proposed and the verifier scored.

A trace file is JSON lines: one RunInfo line (`"kind": "run"`) and then one line per StepEvent
(`"kind": "step"`). `spectui replay` needs nothing else.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from typing import IO, Iterable, Iterator

BONUS_SOURCE = "verifier"  # the origin named for a bonus token


@dataclass
class TreeNode:
    id: int  # index in the step's tree; 0 is the root (the newest committed token)
    parent: int  # -1 for the root
    depth: int  # 0 for the root
    token_id: int
    text: str
    sources: list[str]  # names of the speculators that proposed it ([] for the root)
    draft_prob: float | None  # the proposing speculator's probability (max over sources)
    verifier_prob: float | None  # the verifier's probability of this token at its parent


@dataclass
class StepEvent:
    step: int
    tree: list[TreeNode]  # [] for the prefill step
    accepted: list[int]  # ids of accepted tree nodes, root excluded, in order
    bonus_token: int | None  # the verifier's own token after the accepted branch
    bonus_text: str
    new_tokens: list[int]  # committed this step: accepted tokens then the bonus token
    new_text: str  # decoded text of new_tokens, as it extends the answer so far
    token_origins: list[str]  # per new token: the speculator names that proposed it, or "verifier"
    drafted: int  # tree nodes proposed this step (root excluded)
    accepted_count: int  # drafted tokens accepted this step
    draft_ms: float
    verify_ms: float
    attention_backend: str
    # running figures over the answer so far
    total_tokens: int = 0
    acceptance_rate: float = 0.0  # accepted drafted tokens / drafted tokens
    mean_accepted: float = 0.0  # committed tokens per verifier step (prefill excluded)
    tokens_per_s: float = 0.0
    elapsed_s: float = 0.0
    # measured cost (speedup.py); None where not measured
    step_ms: float = 0.0  # engine time of this step: drafting to event, consumer pauses excluded
    incremental_ms: float | None = None  # the measured one-token step this step is compared with
    speedup: float | None = None  # the answer so far vs incremental decoding, measured
    finished: bool = False
    stop_reason: str | None = None  # "eos" | "length" | "stopped" once finished
    notice: str | None = None  # e.g. history truncated to fit the context window

    def to_json(self) -> str:
        return json.dumps({"kind": "step", **asdict(self)}, ensure_ascii=False)

    @classmethod
    def from_dict(cls, data: dict) -> "StepEvent":
        data = {k: v for k, v in data.items() if k != "kind"}
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown StepEvent fields: {sorted(unknown)}")
        data["tree"] = [TreeNode(**node) for node in data.get("tree", [])]
        return cls(**data)

    @classmethod
    def from_json(cls, line: str) -> "StepEvent":
        return cls.from_dict(json.loads(line))


@dataclass
class RunInfo:
    """What a trace needs besides its steps: the models and the prompt."""

    model: str
    ssms: list[str] = field(default_factory=list)  # speculator names, in source order
    device: str = "cpu"
    quant: str = "none"
    attention_backend: str = "torch"
    prompt: str = ""
    system: str | None = None
    temperature: float = 0.0
    top_p: float = 1.0
    tree_shape: list[int] | str = field(default_factory=list)  # "auto" or the fixed expansion config
    max_new_tokens: int = 0
    merge: str = "union"  # how the speculators' trees were merged: union or vote

    def to_json(self) -> str:
        return json.dumps({"kind": "run", **asdict(self)}, ensure_ascii=False)

    @classmethod
    def from_dict(cls, data: dict) -> "RunInfo":
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


class TraceError(ValueError):
    """A trace file that cannot be read."""


def write_trace(out: IO[str], info: RunInfo, events: Iterable[StepEvent]) -> Iterator[StepEvent]:
    """Write the run line, then each event as it passes through (a pass-through generator)."""
    out.write(info.to_json() + "\n")
    out.flush()
    for event in events:
        out.write(event.to_json() + "\n")
        out.flush()
        yield event


def read_trace(path) -> tuple[RunInfo, list[StepEvent]]:
    """Read a trace file; raise TraceError with one clear line on any malformed content."""
    try:
        with open(path, encoding="utf-8") as fh:
            lines = [line for line in fh if line.strip()]
    except (OSError, UnicodeDecodeError) as exc:
        raise TraceError(f"cannot read trace {path}: {exc}") from None
    if not lines:
        raise TraceError(f"trace {path} is empty")
    info: RunInfo | None = None
    events: list[StepEvent] = []
    for number, line in enumerate(lines, 1):
        try:
            data = json.loads(line)
            if not isinstance(data, dict):
                raise ValueError("not a JSON object")
            if data.get("kind") == "run":
                info = RunInfo.from_dict(data)
            else:
                events.append(StepEvent.from_dict(data))
        except (ValueError, TypeError) as exc:
            raise TraceError(f"trace {path}, line {number}: {exc}") from None
    if info is None:
        raise TraceError(f"trace {path} has no run line (kind: run)")
    return info, events
