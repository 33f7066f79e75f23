"""StatusLine: model, SSMs, device and memory in use, the engine process's included (refreshed every two seconds)."""

from __future__ import annotations

import os
import resource
import sys

from rich.text import Text
from textual.reactive import reactive
from textual.widgets import Static


def resident_bytes(pid: int | str = "self") -> int | None:
    try:
        with open(f"/proc/{pid}/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def memory_in_use(engine_pid: int = 0) -> str:
    """Resident memory of the UI and of the engine process, plus CUDA memory when torch has a GPU here."""
    ui = resident_bytes()
    if ui is None:
        ui = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    engine = resident_bytes(engine_pid) if engine_pid else None
    text = f"RAM {(ui + (engine or 0)) / 2**20:.0f} MiB"
    if engine is not None:
        text += f" (engine {engine / 2**20:.0f})"
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        text += f", GPU {torch.cuda.memory_allocated() / 2**20:.0f} MiB"
    return text


class StatusLine(Static):
    model: reactive[str] = reactive("no model")
    ssms: reactive[str] = reactive("-")
    device: reactive[str] = reactive("-")
    memory: reactive[str] = reactive("")
    state: reactive[str] = reactive("")

    def __init__(self, live_memory: bool = True, **kwargs) -> None:
        super().__init__(**kwargs)
        self.live_memory = live_memory
        self.engine_pid = 0  # the engine process, once loaded

    def on_mount(self) -> None:
        if self.live_memory:
            self._poll()
            self.set_interval(2.0, self._poll)

    def _poll(self) -> None:
        self.memory = memory_in_use(self.engine_pid)

    def render(self) -> Text:
        out = Text()
        if self.state:
            out.append(f"{self.state}   ", style="bold")
        for name, value in (("model", self.model), ("SSMs", self.ssms), ("device", self.device), ("memory", self.memory)):
            if value:
                out.append(f"{name} ", style="dim")
                out.append(f"{value}   ")
        return out
