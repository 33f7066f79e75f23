"""The measured speed-up over incremental decoding that events, the app and traces report.

Every decode step's engine time is measured (from the start of its drafting to its event being
built; the consumer's pauses fall outside). A *pure* step is a one-token step that drafted
nothing: exactly what incremental decoding does. For an answer,

    speed-up = sum_i equivalent_i / sum_i step_ms_i          over decode steps (the prefill excluded)

    equivalent_i = step_ms_i                  for a pure step (it is an incremental step)
                 = tokens_i * c1              otherwise, c1 = median engine time of the last
                                              PURE_WINDOW pure steps timed within MAX_PREFIX_GAP
                                              tokens of this step's prefix (this process)

With speculation off every step is pure, so the figure is 1 by construction. Nothing is
estimated from tree passes: c1 is timed. `PureSteps.needs_calibration` tells the engine when its
pure steps are too old (MAX_AGE steps) or were timed at a prefix too far from the current one
(MAX_PREFIX_GAP tokens), or while fewer than MIN_PURE of them are near enough for a median (one
step can be 2x off on this machine, and a slow reference would flatter); the engine then takes a
pure step itself.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field

PURE_WINDOW = 8
MIN_PURE = 3  # pure steps near the prefix before their median is trusted
MAX_AGE = 32
MAX_PREFIX_GAP = 256


@dataclass
class PureSteps:
    """Recent pure steps of one engine, across answers: (step number, prefix length, ms)."""

    recent: deque = field(default_factory=lambda: deque(maxlen=PURE_WINDOW))
    steps: int = 0  # decode steps taken by the engine, all answers

    def near_ms(self, prefix_len: int) -> list[float]:
        """ms of the recent pure steps timed within MAX_PREFIX_GAP of this prefix."""
        return [ms for _, prefix, ms in self.recent if abs(prefix - prefix_len) <= MAX_PREFIX_GAP]

    def needs_calibration(self, prefix_len: int) -> bool:
        if len(self.near_ms(prefix_len)) < MIN_PURE:
            return True
        step, prefix, _ = self.recent[-1]
        return self.steps - step >= MAX_AGE or abs(prefix_len - prefix) > MAX_PREFIX_GAP

    def reference_ms(self, prefix_len: int) -> float | None:
        """Median engine time of the recent pure steps timed near this prefix."""
        near = self.near_ms(prefix_len)
        return statistics.median(near) if near else None

    def record(self, prefix_len: int, ms: float, pure: bool) -> None:
        self.steps += 1
        if pure:
            self.recent.append((self.steps, prefix_len, ms))


@dataclass
class SpeedupMeter:
    """One answer's running speed-up."""

    spent_ms: float = 0.0
    equivalent_ms: float = 0.0
    unknown: bool = False  # a step had no incremental reference

    def add(self, tokens: int, step_ms: float, pure: bool, reference_ms: float | None) -> None:
        self.spent_ms += step_ms
        if pure:
            self.equivalent_ms += step_ms
        elif reference_ms is None:
            self.unknown = True
        else:
            self.equivalent_ms += tokens * reference_ms

    @property
    def speedup(self) -> float | None:
        if self.unknown or self.spent_ms <= 0:
            return None
        return self.equivalent_ms / self.spent_ms
