"""StepEvent: the one contract between the engine and its consumers (TUI, traces, bench, CLI).

The engine yields one StepEvent per verifier forward pass. Step 0 is the prefill: it has no
tree and commits the verifier's first token as its `bonus_token`. Every later step carries the
merged token tree that the drafters proposed and the verifier scored.

A trace file is JSON lines: a RunInfo line (`"kind": "run"`, `"version": TRACE_VERSION`) and then
one line per StepEvent (`"kind": "step"`); `spectui chat --trace` appends one such run per turn.
`spectui replay` needs nothing else. The trace's schema is these dataclasses plus TRACE_VERSION,
one definition for the writer (`to_json`) and the reader (`build` checks every field against the
dataclass annotations, then `check_tree` the tree's links), so a trace that reads is one the
app can show.
"""

from __future__ import annotations

import json
import types
import typing
from dataclasses import MISSING, asdict, dataclass, field, fields, is_dataclass
from functools import cache
from typing import IO, Iterable, Iterator

# The trace format this code writes and the newest it reads; a run line without "version" is 1.
# A new field with a default keeps older traces readable (they get the default): bump the version
# with it, so that an older spectui refuses the newer traces by their version, in one clear line.
TRACE_VERSION = 2  # 2: StepEvent.sampling
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
class SampleTest:
    """One drafted child put to the sampling test (multi-step speculative sampling, engine/accept.py)."""

    node: int  # the tested tree node
    draw: float  # u, uniform on [0, 1)
    accept_prob: float  # min(1, p'(x)/q(x)), q the point mass on the child's token x: p'(x), the residual's share of x
    accepted: bool  # u < accept_prob


@dataclass
class ResidualToken:
    token_id: int
    text: str
    prob: float


@dataclass
class Sampling:
    """What a sampling step's test used: recorded only for display (GenerationSettings.detail)."""

    tests: list[SampleTest]  # in the order the engine ran them
    bonus_node: int  # where the bonus token was drawn: the last accepted node (0: the root)
    removed_mass: float  # the target mass of the children rejected there, taken out of the residual
    bonus_prob: float  # the bonus token's probability in the renormalised residual it was drawn from
    residual_top: list[ResidualToken]  # that residual's most likely tokens, most likely first


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
    threads: int = 0  # the verifier pass's threads: fewer while other processes hold cores (threads.py); 0: not known
    finished: bool = False
    stop_reason: str | None = None  # "eos" | "length" | "stopped" once finished
    notice: str | None = None  # e.g. history truncated to fit the context window
    sampling: Sampling | None = None  # the sampling test's numbers (sampling with detail); None otherwise

    def to_json(self) -> str:
        return json.dumps({"kind": "step", **asdict(self)}, ensure_ascii=False)

    @classmethod
    def from_dict(cls, data: dict) -> "StepEvent":
        """A checked StepEvent (FieldError, a ValueError, names the bad field)."""
        return check_tree(build(cls, {k: v for k, v in data.items() if k != "kind"}))

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
        return json.dumps({"kind": "run", "version": TRACE_VERSION, **asdict(self)}, ensure_ascii=False)

    @classmethod
    def from_dict(cls, data: dict) -> "RunInfo":
        """A checked RunInfo from a run line (FieldError for a bad field or an unreadable version)."""
        check_version(data.get("version", 1))
        return build(cls, {k: v for k, v in data.items() if k not in ("kind", "version")})


# ---- the reader's checks: one schema, the annotations above


class FieldError(ValueError):
    """One field of a trace line that does not fit the schema."""

    def __init__(self, name: str, problem: str):
        super().__init__(f"field {name}: {problem}")
        self.name = name


JSON_NAMES = {bool: "a boolean", int: "an integer", float: "a number", str: "a string", type(None): "null",
              list: "a list", dict: "an object"}


def json_name(value) -> str:
    return next((name for kind, name in JSON_NAMES.items() if isinstance(value, kind)), type(value).__name__)


def describe(hint) -> str:
    """'a list of integers', 'an integer or null', ... for an annotation."""
    if typing.get_origin(hint) in (types.UnionType, typing.Union):
        return " or ".join(describe(option) for option in typing.get_args(hint))
    if typing.get_origin(hint) is list:
        (item,) = typing.get_args(hint)
        noun = "object" if is_dataclass(item) else describe(item).split(" ", 1)[-1]
        return f"a list of {noun}s"
    return "an object" if is_dataclass(hint) else JSON_NAMES.get(hint, str(hint))


@cache
def hints(cls) -> dict:
    return typing.get_type_hints(cls)


def convert(value, hint, name: str):
    """value checked against the annotation (nested dataclasses built); FieldError otherwise."""
    origin = typing.get_origin(hint)
    if origin in (types.UnionType, typing.Union):
        nested = None  # an object that fits no option: the dataclass option's own error names the field
        for option in typing.get_args(hint):
            try:
                return convert(value, option, name)
            except FieldError as exc:
                nested = exc if is_dataclass(option) and isinstance(value, dict) else nested
        if nested is not None:
            raise nested
    elif origin is list:
        if isinstance(value, list):
            (item,) = typing.get_args(hint)
            return [convert(v, item, f"{name}[{i}]") for i, v in enumerate(value)]
    elif is_dataclass(hint):
        if isinstance(value, dict):
            return build(hint, value, f"{name}.")
    elif hint is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif hint is type(None):
        if value is None:
            return None
    elif isinstance(value, hint) and (hint is bool or not isinstance(value, bool)):
        return value
    raise FieldError(name, f"expected {describe(hint)}, got {json_name(value)}")


def build(cls, data: dict, prefix: str = ""):
    """cls(**data) with every field checked: no unknown field, no required one missing, types right."""
    names = {f.name for f in fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise FieldError(prefix + unknown[0], f"unknown to this version of the trace format ({TRACE_VERSION})")
    values = {}
    for f in fields(cls):
        if f.name in data:
            values[f.name] = convert(data[f.name], hints(cls)[f.name], prefix + f.name)
        elif f.default is MISSING and f.default_factory is MISSING:
            raise FieldError(prefix + f.name, "missing")
    return cls(**values)


def check_tree(event: StepEvent) -> StepEvent:
    """The links the app follows: node i has id i, its parent comes before it, accepted ids are nodes."""
    for i, node in enumerate(event.tree):
        if node.id != i:
            raise FieldError(f"tree[{i}].id", f"expected {i} (a node's id is its index), got {node.id}")
        if not (node.parent == -1 if i == 0 else 0 <= node.parent < i):
            raise FieldError(f"tree[{i}].parent", f"{node.parent} is not an earlier node" if i else "the root's parent must be -1")
    bad = [i for i in event.accepted if event.tree and not 0 < i < len(event.tree)]
    if bad:
        raise FieldError("accepted", f"node {bad[0]} is not a drafted node of this step's tree")
    if event.sampling is not None:
        for k, test in enumerate(event.sampling.tests):
            if not 0 < test.node < len(event.tree):
                raise FieldError(f"sampling.tests[{k}].node", f"node {test.node} is not a drafted node of this step's tree")
        if not 0 <= event.sampling.bonus_node < max(len(event.tree), 1):
            raise FieldError("sampling.bonus_node", f"node {event.sampling.bonus_node} is not a node of this step's tree")
    return event


def check_version(version) -> None:
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise FieldError("version", f"expected a positive integer, got {version!r}")
    if version > TRACE_VERSION:
        raise FieldError("version", f"trace format {version} is newer than this spectui reads ({TRACE_VERSION}): upgrade spectui")


# ---- trace files


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


def parse_line(line: str) -> RunInfo | StepEvent:
    try:
        data = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON ({exc.msg}, column {exc.colno})") from None
    except (ValueError, RecursionError) as exc:  # e.g. an integer of more digits than Python converts
        raise ValueError(f"not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ValueError(f"expected a JSON object, got {json_name(data)}")
    kind = data.get("kind")
    if kind == "run":
        return RunInfo.from_dict(data)
    if kind == "step":
        return StepEvent.from_dict(data)
    raise FieldError("kind", f'expected "run" or "step", got {json.dumps(kind)}')


def read_runs(path) -> list[tuple[RunInfo, list[StepEvent]]]:
    """Every run of a trace file with its steps, all checked; TraceError (one line: where, which field) otherwise."""
    try:
        with open(path, encoding="utf-8") as fh:
            lines = fh.read().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise TraceError(f"cannot read trace {path}: {getattr(exc, 'strerror', None) or exc}") from None
    runs: list[tuple[RunInfo, list[StepEvent]]] = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = parse_line(line)
        except ValueError as exc:
            raise TraceError(f"trace {path}, line {number}: {exc}") from None
        if isinstance(record, RunInfo):
            runs.append((record, []))
        elif not runs:
            raise TraceError(f"trace {path}, line {number}: a step before the run line (kind: run)")
        else:
            runs[-1][1].append(record)
    if not runs:
        raise TraceError(f"trace {path} is empty")
    return runs


def read_trace(path) -> tuple[RunInfo, list[StepEvent]]:
    """The trace's last run line and all its steps (TraceError with one clear line on bad content)."""
    runs = read_runs(path)
    return runs[-1][0], [event for _, events in runs for event in events]
