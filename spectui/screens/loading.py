"""LoadingScreen: progress while models are fetched, converted and loaded.

The load worker's `progress(stage, fraction)` calls arrive as LoadProgress messages; a stage
with a fraction moves the bar, one without makes it indeterminate. Each new stage is logged,
so the first fetch of the embedded default shows its download step by step.
"""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.screen import Screen
from textual.widgets import Label, Log, ProgressBar


class LoadingScreen(Screen):
    BINDINGS = [("escape", "app.skip_loading", "Hide")]

    def __init__(self, title: str) -> None:
        super().__init__()
        self.title_text = title
        self.last_stage = ""

    def compose(self) -> ComposeResult:
        with Vertical(id="loading-box"):
            yield Label(self.title_text, id="loading-title")
            yield Label("starting", id="loading-stage")
            yield ProgressBar(total=None, show_eta=False, id="loading-bar")
            yield Log(id="loading-log", max_lines=200)

    def progress(self, stage: str, fraction: float | None) -> None:
        self.query_one("#loading-stage", Label).update(stage)
        bar = self.query_one(ProgressBar)
        if fraction is None:
            bar.update(total=None)
        else:
            bar.update(total=100, progress=max(0.0, min(fraction, 1.0)) * 100)
        if stage != self.last_stage:
            self.last_stage = stage
            self.query_one(Log).write_line(stage)
