"""AcceptancePanel: per-step acceptance chart and the running figures of the answer.

The chart has a fixed 0-100 % scale, one bar per verifier step (steps averaged into buckets
when the answer outgrows the width). The speed-up is the engine's measured one (StepEvent.speedup,
engine/speedup.py): the answer's engine time against real one-token steps timed in the same
process; it reads 1.00x with speculation off, and n/a where nothing was measured (old traces).
"""

from __future__ import annotations

import statistics

from rich.text import Text
from textual.containers import Vertical
from textual.reactive import reactive
from textual.widget import Widget
from textual.widgets import Static

from ..engine import StepEvent

BLOCKS = " ▁▂▃▄▅▆▇█"


def step_rate(event: StepEvent) -> float:
    return event.accepted_count / event.drafted if event.drafted else 0.0


def bucket(values: list[float], width: int) -> list[float]:
    if len(values) <= width or width <= 0:
        return values
    size = len(values) / width
    return [statistics.fmean(values[int(i * size): max(int((i + 1) * size), int(i * size) + 1)]) for i in range(width)]


class AcceptanceChart(Widget):
    """Bars of per-step acceptance rate, 0 at the bottom, 100 % at the top."""

    rates: reactive[tuple[float, ...]] = reactive(tuple)

    def render(self) -> Text:
        height, width = max(self.size.height, 1), max(self.size.width, 1)
        values = bucket(list(self.rates), width)
        if not values:
            return Text("acceptance per step appears here", style="dim")
        colour = self.app.theme_variables.get("success", "green")
        rows = []
        for row in range(height - 1, -1, -1):
            line = ""
            for v in values:
                level = v * height * 8 - row * 8
                line += BLOCKS[int(min(max(level, 0), 8))]
            rows.append(line)
        return Text("\n".join(rows), style=colour)


def summary(events: list[StepEvent], quant: str) -> str:
    if not events:
        return "no answer yet"
    last = events[-1]
    steps = [e for e in events if e.step > 0]
    verify = sum(e.verify_ms for e in steps)
    draft = sum(e.draft_ms for e in steps)
    ratio = last.speedup
    engine_s = last.total_tokens / last.tokens_per_s if last.tokens_per_s > 0 else 0.0
    rows = [
        f"acceptance   {last.acceptance_rate:6.0%}  ({sum(e.accepted_count for e in steps)}/{sum(e.drafted for e in steps)} drafted)",
        f"tokens/step  {last.mean_accepted:6.2f}",
        f"tokens/s     {last.tokens_per_s:6.1f}  ({last.total_tokens} tokens, {engine_s:.1f} s)",
        f"verify       {verify:6.0f} ms   draft {draft:.0f} ms",
        f"speed-up     {ratio:5.2f}x  (vs timed one-token steps)" if ratio is not None else "speed-up       n/a  (not measured)",
        f"attention    {last.attention_backend}   quant {quant}" + (f"   threads {last.threads}" if last.threads else ""),
    ]
    if last.finished:
        rows.append(f"finished: {last.stop_reason}")
    return "\n".join(rows)


class AcceptancePanel(Vertical):
    quant: reactive[str] = reactive("none")

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.events: list[StepEvent] = []
        self.border_title = "acceptance"

    def compose(self):
        yield AcceptanceChart(id="chart")
        yield Static("no answer yet", id="figures")

    def reset(self) -> None:
        self.events = []
        self.sync()

    def add(self, event: StepEvent) -> None:
        self.events.append(event)

    def sync(self) -> None:
        """Redraw from the recorded steps (the caller throttles this)."""
        self.query_one(AcceptanceChart).rates = tuple(step_rate(e) for e in self.events if e.step > 0)
        self.query_one("#figures", Static).update(summary(self.events, self.quant))
