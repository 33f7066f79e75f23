"""ThreadGovernor: fewer verifier threads while other processes hold cores, all of them again once free.

Why. spectui's CPU kernels split every one of a pass's ~200 parallel regions over all threads, and
OpenMP's threads wait for each other at the end of each. When another process takes a core, the
scheduler sets one of ours aside in every region and the pass waits for it. Measured on a 2-vCPU AMD
EPYC (3 Vicuna questions, 48 tokens, tokens/s, incremental / auto tree):

    another process                   2 threads      1 thread
    none                              67.2 / 82.2    43.2 / 53.0
    a shell busy loop (one core)      18.4 / 18.0    44.9 / 50.5
    a 1-thread torch matmul loop      26.0 / 22.3    47.2 / 54.2
    a 2-thread torch matmul loop       2.5 /  4.9    27.3 / 29.3

How it decides, from what the passes themselves show (over windows of `window_ms` of pass time;
the same runs; the names are GovernorConfig's):
- At n threads, the process's CPU time over the passes' wall time is the cores it got: 1.98 of 2 on
  the quiet machine, 0.99-1.27 beside those processes. Below `share_floor` x n it drops to the cores
  it got (at least one fewer, at least one).
- Below n, the machine's idle time over the window (/proc/stat) is the cores nobody wanted: 0.98
  beside one thread on the quiet machine, 0.00-0.01 beside those processes. At `idle_free` or more it
  takes that many cores back (at least one). Without /proc/stat it tries all threads again after
  `probe_s` seconds; if the cores are still taken the next window drops them again.
- Where the two readings disagree for good (a container held to fewer CPUs than the machine's idle
  time shows, or a load that comes and goes), it would go up and down every window. A drop within
  `settle_s` of taking cores back doubles the time it waits before taking them again (from 1 s, at
  most `max_hold_s`); cores taken back and kept `settle_s` clear the wait.

A kernel's output bits do not depend on the thread count (tests/kernels: nf4_cpu, packed_4bit,
exact attention), so a switch is lossless; the engine governs only a verifier whose every layer
runs them (LeanModel.thread_invariant). The clocks are arguments, so tests can script them.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class GovernorConfig:
    window_ms: float = 300.0  # pass time a decision looks at
    share_floor: float = 0.8  # of the threads' cores: under it, others hold some
    idle_free: float = 0.5  # idle cores at which one is taken back
    probe_s: float = 10.0  # without an idle reading: seconds before all threads are tried again
    settle_s: float = 5.0  # a raise that lasts this long was right
    max_hold_s: float = 30.0  # the longest wait before taking cores back after raises that did not last


def read_idle_seconds(path: str = "/proc/stat") -> float | None:
    """Seconds all CPUs have been idle since boot (idle + iowait), or None where there is no such file."""
    try:
        with open(path) as f:
            fields = f.readline().split()
        return (int(fields[4]) + int(fields[5])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


class ThreadGovernor:
    """The thread count for the next verifier pass: `begin_pass` / `end_pass` around each pass."""

    def __init__(self, threads: int, config: GovernorConfig = GovernorConfig(),
                 wall: Callable[[], float] = time.perf_counter, cpu: Callable[[], float] = time.process_time,
                 idle: Callable[[], float | None] = read_idle_seconds) -> None:
        self.most = self.threads = max(1, threads)
        self.config = config
        self.wall, self.cpu, self.idle = wall, cpu, idle
        self.switches = 0
        self.since = wall()  # when the count last changed
        self.raised = False  # the last change took cores back
        self.hold = 0.0  # seconds to wait after a change before taking cores back
        self._open_window()

    def _open_window(self) -> None:
        self.pass_wall = self.pass_cpu = 0.0
        self.window_start, self.idle_start = None, None

    def begin_pass(self) -> None:
        if self.window_start is None:  # the count holds for the whole window: the idle time matters only below most
            self.window_start = self.wall()
            self.idle_start = self.idle() if self.threads < self.most else None
        self._wall0, self._cpu0 = self.wall(), self.cpu()

    def end_pass(self) -> int:
        """Account the pass; returns the thread count for the next one (changed only at a window's end)."""
        now = self.wall()
        self.pass_wall += now - self._wall0
        self.pass_cpu += self.cpu() - self._cpu0
        if self.pass_wall * 1000 >= self.config.window_ms:
            self._decide(now)
            self._open_window()
        return self.threads

    def _decide(self, now: float) -> None:
        c = self.config
        cores = self.pass_cpu / self.pass_wall  # the cores our threads got during the passes
        if self.raised and now - self.since >= c.settle_s:
            self.hold = 0.0  # the cores taken back have stayed ours
        if cores < c.share_floor * self.threads and self.threads > 1:
            if self.raised and now - self.since < c.settle_s:  # taking cores back did not last
                self.hold = min(max(2 * self.hold, 1.0), c.max_hold_s)
            self._set(max(1, min(self.threads - 1, int(cores))), now)
        elif self.threads < self.most and now - self.since >= self.hold:
            idle_now = self.idle()
            if idle_now is not None and self.idle_start is not None:
                spare = (idle_now - self.idle_start) / max(now - self.window_start, 1e-9)  # idle cores
                if spare >= c.idle_free:
                    self._set(min(self.most, self.threads + max(1, round(spare))), now)
            elif now - self.since >= c.probe_s:
                self._set(self.most, now)

    def _set(self, threads: int, now: float) -> None:
        if threads != self.threads:
            self.raised = threads > self.threads
            self.threads, self.since = threads, now
            self.switches += 1
