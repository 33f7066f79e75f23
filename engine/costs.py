"""CostModel: what a verifier step and a drafting step cost on this machine, in milliseconds.

The adaptive tree (auto_tree.py) trades expected accepted tokens against time, so it needs

    c_verify(T)   one verification step over a tree of T nodes (root included): the tree
                  forward, acceptance and cache compaction, i.e. everything the step does
                  besides drafting. T = 1 is an incremental step.
    c_draft(s)    one forward of speculator s (an SSM step over a few frontier nodes).

It is kept as c_verify(T) = c1 * ratio(T):

    c1        the median of the last WINDOW one-token steps (a longer prefix, a busier machine
              move it within a few steps; one slow step does not)
    ratio(T)  c_verify(T) / c1, per tree size the median of the last WINDOW observed ratios,
              piecewise linear between observed sizes, extended by the last slope, and made
              non-decreasing in T

Medians, because this machine's step times jump by +-30 % from one step to the next.

Where the numbers come from:

1. `calibrate.measure_costs` times the engine's own verification path on a synthetic prefix at
   T = 1, 2, 4, 8, 16, 32 at load (about a second). They seed c1 and the ratios, and are cached
   in a JSON file keyed by machine, model, quantisation, device and thread count (`CostKey`), so
   a second start reads them back; any change of key re-measures.
2. Every real step is an observation: a one-token step joins c1's window, a tree step of T
   nodes adds ms / c1 to ratio(T)'s window. Each window starts with PRIOR copies of the load-time
   value (for a size the load did not time, the table interpolated there), so one or two wild
   steps move nothing (a single stalled step at a new size used to set that size's ratio, and
   through the non-decreasing floor every larger size's, for as long as the process ran: trees
   that size were no longer chosen, so nothing corrected it), and real steps take over after a few.
3. Drafting costs are moving averages of measured SSM forwards, seeded at load; one forward counts
   as at most DRAFT_CLIP times the estimate.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import statistics
from collections import deque
from dataclasses import asdict, dataclass, field
from pathlib import Path

GRID = (1, 2, 4, 8, 16, 32)  # tree sizes timed at load
WINDOW = 16  # observations per median
PRIOR = 3  # a window starts with this many copies of the load-time value: one or two wild steps move nothing
EMA = 0.1  # weight of one new observation in the drafting costs' moving averages
DRAFT_CLIP = 3.0  # an observed forward counts as at most this many times the estimate
CACHE_VERSION = 32  # 32: the AVX-512 prefill path takes the rows past a multiple of six in one call (dot2_512 ... dot5_512); 31: the AVX-512 4-bit kernel takes two weight pairs a task for 5-8 input rows too; 30: the AVX-512 4-bit kernel reads 2-7 input rows doubled (nf4_avx512.h double_rows); 29: the AVX2 4-bit kernel prefetches the next task's weight rows (nf4_cpu.c PREFETCH_NEXT); 28: the verifier's 4-bit layers on AMX tiles where the CPU has them (kernels/nf4_amx.c); 27: the feature head's layer reads int8 weights on AVX512-BF16 CPUs too; 26: the feature head's layer reads int8 weights on AVX2 (dense_cpu.c spectui_dense_int8_x16); 25: the AVX2 4-bit kernel's scratch 64-byte aligned (kernels/aligned.h); 24: the exact attention's block by its tiles' empty rows (T = 4: one block of 4); 23: the AVX2 int8 screen without spills, its decision in one C call (screen_decide.c); 22: the AVX2 4-bit kernel decodes 32 weights a step by byte shuffles (nf4_cpu.c decode32); 21: the feature head's layer in one C call on AVX2 too; 20: the last norm in C, rotary from a table, a one-row screen decided in Python; 19: the AVX2 path's decoder stack in one C call (stack_cpu.c); 18: the AVX2 4-bit kernel's call reads bound addresses and adds into the residual in C; 17: the AVX2 4-bit kernel decodes 16 weights a step from per-block tables (nf4_cpu.c); 16: the int8 screen and drafters' int8 output layers on AVX2 too (screen_int8.c vpmaddwd); 15: the verifier's glue in C on the AVX2 4-bit path too (glue_cpu.c fp32 flavour); 14: a chain of drafts verified as a causal pass, no tree mask; 13: the feature head's layer in one C call (kernels/head_layer.c); 12: drafters' output layers in int8 (dense_cpu.Int8Kernel); 11: the screen's candidates with AVX-512, rows in threads; 10: the int8 screen blocked, for every row count; 9: the int8 screen (screen_int8.c); 8: the verifier's glue in C (glue_cpu.c); 7: the screen reads x_hi alone, one column a row; 6: the output screen through dense_cpu.c where AVX512-BF16 lacks AMX; 5: bf16 drafters on dense_cpu.c (AVX512-BF16); 2: SSMs draft in bf16 on CPUs with AVX512-BF16; 3: the key names the 4-bit path; 4: drafters on dense_cpu.c, the AVX2 screen


def interpolate(points: list[tuple[int, float]], size: int) -> float:
    """Piecewise linear through points [(T, ratio)] (sorted by T, the first at T = 1), extended past
    the last one by the last slope."""
    if len(points) == 1:
        return points[0][1]
    for (t0, r0), (t1, r1) in zip(points, points[1:]):
        if size <= t1:
            return r0 + (r1 - r0) * (size - t0) / (t1 - t0)
    (t0, r0), (t1, r1) = points[-2], points[-1]
    return r1 + (r1 - r0) / (t1 - t0) * (size - t1)


@dataclass(frozen=True)
class CostKey:
    """What the measured costs depend on; a cached table is reused only for an equal key."""

    model: str
    quant: str
    device: str
    threads: int
    attention: str = "torch"  # the attention backend, which also decides the 4-bit path on CPU
    runner: str = "CachedModel"  # how the verifier runs: transformers' forward or LeanModel (lean_model.py)
    linear4bit: str = ""  # how its 4-bit layers compute (kernels/nf4_cpu.py's kernel or bitsandbytes'), if 4-bit
    machine: str = field(default_factory=lambda: f"{platform.machine()}-{platform.processor()}-{os.cpu_count()}cpu")

    def digest(self) -> str:
        text = json.dumps(asdict(self), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass
class CostModel:
    verify_table: dict[int, float]  # T -> ms, measured at load (or read from the cache)
    prefix_len: int = 0  # the synthetic prefix length the table was measured at
    draft_ms: dict[str, float] = field(default_factory=dict)  # speculator -> ms per forward (EMA)
    measured_s: float = 0.0  # how long the load-time measurement took (0 when read from cache)
    from_cache: bool = False
    noisy: bool = False  # the load-time passes of one size varied by more than 1.5x
    observations: int = 0  # real steps folded in
    one_token: deque = field(default_factory=lambda: deque(maxlen=WINDOW))  # ms of recent one-token steps
    ratios: dict[int, deque] = field(default_factory=dict)  # T -> recent c_verify(T) / c1
    _curve: tuple | None = field(default=None, repr=False)  # (c1, ratio points): medians, until the next observation

    def __post_init__(self) -> None:
        base = self.verify_table[min(self.verify_table)]
        self.one_token.extend([base] * PRIOR)
        for size in self.verify_table:
            if size > 1:
                self.ratios[size] = self._seeded(size)

    def _seeded(self, size: int) -> deque:
        """A window for tree size `size`: PRIOR copies of the load-time ratio there (the table's own
        value, else interpolated between its sizes or extended by its last slope)."""
        base = self.verify_table[min(self.verify_table)]
        points = [(t, ms / base) for t, ms in sorted(self.verify_table.items())]
        return deque([interpolate(points, size)] * PRIOR, maxlen=WINDOW)

    # ------------------------------------------------------------------ queries
    def curve(self) -> tuple:
        """(c1, [(T, ratio)...]): the medians, computed once per observation (the tree choice asks often)."""
        if self._curve is None:
            points, floor = [(1, 1.0)], 1.0
            for t in sorted(self.ratios):
                floor = max(floor, statistics.median(self.ratios[t]))
                points.append((t, floor))
            self._curve = (statistics.median(self.one_token), points)
        return self._curve

    def c1(self) -> float:
        return self.curve()[0]

    def ratio(self, size: int) -> float:
        """c_verify(size) / c1: through the medians of the observed sizes, non-decreasing in size."""
        return 1.0 if size <= 1 else interpolate(self.curve()[1], size)

    def verify(self, size: int) -> float:
        """Predicted c_verify(size) in ms now."""
        return self.c1() * self.ratio(size)

    def draft(self, speculator: str) -> float:
        """Predicted ms of one forward of `speculator` (0 for an unmeasured one that costs nothing, e.g. n-gram)."""
        return self.draft_ms.get(speculator, 0.0)

    # ------------------------------------------------------------------ online refinement
    def observe_verify(self, size: int, ms: float) -> None:
        if ms <= 0:
            return
        self.observations += 1
        if size <= 1:
            self.one_token.append(ms)
        else:
            ratio = ms / self.c1()
            if size not in self.ratios:
                self.ratios[size] = self._seeded(size)
            self.ratios[size].append(ratio)
        self._curve = None

    def observe_draft(self, speculator: str, ms: float) -> None:
        """Fold one timed forward into the moving average; a wild one (a stall: up to 30x here) counts
        as at most DRAFT_CLIP x the estimate, so one does not make a drafter look too dear to run
        again, while a real rise still moves the estimate within a few steps."""
        old = self.draft_ms.get(speculator)
        self.draft_ms[speculator] = ms if old is None else old + EMA * (min(ms, DRAFT_CLIP * old) - old)

    # ------------------------------------------------------------------ persistence
    def to_dict(self) -> dict:
        return {
            "verify_ms": {str(t): round(c, 3) for t, c in sorted(self.verify_table.items())},
            "verify_ms_now": {str(t): round(self.verify(t), 3) for t in (1, 2, 4, 8, 16, 32, 64)},
            "prefix_len": self.prefix_len,
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
