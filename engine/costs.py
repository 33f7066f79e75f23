"""CostModel: what a verifier step and a drafting step cost on this machine, in milliseconds.

The adaptive tree (auto_tree.py) trades expected accepted tokens against time, so it needs

    c_verify(T)   one verification step over a tree of T nodes (root included): the tree
                  forward, acceptance and cache compaction, i.e. everything the step does
                  besides drafting. T = 1 is an incremental step.
    c_draft(s)    one forward of speculator s (an SSM step over a few frontier nodes).

Where the numbers come from:

1. `measure_verify` times the engine's own verification path on a synthetic prefix at
   T = 1, 2, 4, 8, 16, 32 (the median of a few passes each); between grid points c_verify is
   linear, beyond the grid it extends the last slope. This takes about a second and is cached in
   a JSON file keyed by machine, model, quantisation, device and thread count (`CostKey`), so a
   second start reads it back; any change of key re-measures.
2. Every real step refines the curve online. One-token steps (the most frequent) move `drift`,
   an exponential moving average of measured / tabulated c_verify(1), so a longer prefix
   (attention grows with it) or a busier machine scales the whole curve:
   `c_verify(T) = table(T) * drift`. A tree step of T nodes reshapes the curve instead: the two
   grid points around T move toward its measured / predicted ratio r, each by its share of the
   interpolation (table[t] *= 1 + EMA * weight * (r - 1)), so a table measured on a noisy
   machine converges to what real steps cost.
3. Drafting costs are moving averages of measured SSM forwards, seeded at load.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
from dataclasses import asdict, dataclass, field
from pathlib import Path

GRID = (1, 2, 4, 8, 16, 32)  # tree sizes timed at load
EMA = 0.1  # weight of one new observation in the moving averages
CACHE_VERSION = 1


@dataclass(frozen=True)
class CostKey:
    """What the measured costs depend on; a cached table is reused only for an equal key."""

    model: str
    quant: str
    device: str
    threads: int
    machine: str = field(default_factory=lambda: f"{platform.machine()}-{platform.processor()}-{os.cpu_count()}cpu")

    def digest(self) -> str:
        text = json.dumps(asdict(self), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass
class CostModel:
    verify_table: dict[int, float]  # T -> ms, measured at load (or read from the cache)
    prefix_len: int = 0  # the synthetic prefix length the table was measured at
    drift: float = 1.0  # measured / tabulated, a moving average over real steps
    draft_ms: dict[str, float] = field(default_factory=dict)  # speculator -> ms per forward (EMA)
    measured_s: float = 0.0  # how long the load-time measurement took (0 when read from cache)
    from_cache: bool = False
    noisy: bool = False  # the load-time passes varied too much to cache the table
    observations: int = 0  # real steps folded in

    # ------------------------------------------------------------------ queries
    def table(self, size: int) -> float:
        """Tabulated c_verify(size) in ms: piecewise linear through the grid, extended by the last slope."""
        points = sorted(self.verify_table.items())
        if size <= points[0][0]:
            return points[0][1]
        for (t0, c0), (t1, c1) in zip(points, points[1:]):
            if size <= t1:
                return c0 + (c1 - c0) * (size - t0) / (t1 - t0)
        (t0, c0), (t1, c1) = points[-2], points[-1]
        return c1 + (c1 - c0) / (t1 - t0) * (size - t1)

    def verify(self, size: int) -> float:
        """Predicted c_verify(size) in ms now (table scaled by the online drift)."""
        return self.table(size) * self.drift

    def draft(self, speculator: str) -> float:
        """Predicted ms of one forward of `speculator` (0 for an unmeasured one that costs nothing, e.g. n-gram)."""
        return self.draft_ms.get(speculator, 0.0)

    # ------------------------------------------------------------------ online refinement
    def observe_verify(self, size: int, ms: float) -> None:
        if ms <= 0:
            return
        self.observations += 1
        if size <= 1:
            self.drift += EMA * (ms / self.table(1) - self.drift)
            return
        ratio = ms / self.verify(size)
        points = sorted(self.verify_table)
        upper = next((t for t in points if t >= size), points[-1])
        lower = max((t for t in points if t < upper), default=upper)
        weight = 1.0 if upper == lower else (min(size, upper) - lower) / (upper - lower)
        for point, share in ((lower, 1 - weight), (upper, weight)):
            if point > 1 and share > 0:  # table[1] stays the anchor that drift scales
                self.verify_table[point] *= 1 + EMA * share * (ratio - 1)

    def observe_draft(self, speculator: str, ms: float) -> None:
        old = self.draft_ms.get(speculator)
        self.draft_ms[speculator] = ms if old is None else old + EMA * (ms - old)

    # ------------------------------------------------------------------ persistence
    def to_dict(self) -> dict:
        return {
            "verify_ms": {str(t): round(c, 3) for t, c in sorted(self.verify_table.items())},
            "verify_ms_now": {str(t): round(self.verify(t), 3) for t in (1, 2, 4, 8, 16, 32, 64)},
            "prefix_len": self.prefix_len,
            "drift": round(self.drift, 4),
            "draft_ms": {k: round(v, 3) for k, v in self.draft_ms.items()},
            "measured_s": round(self.measured_s, 3),
            "from_cache": self.from_cache,
            "noisy": self.noisy,
            "observations": self.observations,
        }

    def save(self, path: Path, key: CostKey) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        data = {"version": CACHE_VERSION, "key": asdict(key), "verify_ms": self.verify_table,
                "prefix_len": self.prefix_len, "draft_ms": self.draft_ms}
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=1), encoding="utf-8")
        tmp.replace(path)

    @classmethod
    def load(cls, path: Path, key: CostKey) -> "CostModel | None":
        """The cached model for `key`, or None if missing, unreadable or measured under another key."""
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            if data.get("version") != CACHE_VERSION or data.get("key") != asdict(key):
                return None
            table = {int(t): float(c) for t, c in data["verify_ms"].items()}
            drafts = {str(k): float(v) for k, v in data.get("draft_ms", {}).items()}
            if not table or any(c <= 0 for c in table.values()):
                return None
            return cls(table, int(data.get("prefix_len", 0)), draft_ms=drafts, from_cache=True)
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return None


def cache_path(folder: Path, key: CostKey) -> Path:
    return Path(folder) / f"costs-{key.digest()}.json"
