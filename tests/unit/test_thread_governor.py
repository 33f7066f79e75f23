"""ThreadGovernor's decisions (engine/threads.py), from scripted clocks: the cores a window's passes got
and the cores the machine left idle, as the governor reads them from its clocks."""

from __future__ import annotations

from spectui.engine.threads import GovernorConfig, ThreadGovernor, read_idle_seconds


class Machine:
    """Clocks for a governor: each pass lasts `ms`, during which the process gets `cores` of CPU time and
    the machine idles `idle` cores (None: no idle reading, as without /proc/stat)."""

    def __init__(self, cores: float, idle: float | None, ms: float = 62.5) -> None:  # exact in binary
        self.t = self.cpu_s = self.idle_s = 0.0
        self.cores, self.idle, self.ms = cores, idle, ms

    def run(self, governor: ThreadGovernor, passes: int) -> list[int]:
        counts = []
        for _ in range(passes):
            governor.begin_pass()
            dt = self.ms / 1000
            self.t += dt
            self.cpu_s += self.cores * dt
            self.idle_s += (self.idle or 0.0) * dt
            counts.append(governor.end_pass())
        return counts

    def governor(self, threads: int, config: GovernorConfig = GovernorConfig()) -> ThreadGovernor:
        return ThreadGovernor(threads, config, wall=lambda: self.t, cpu=lambda: self.cpu_s,
                              idle=lambda: None if self.idle is None else self.idle_s)


def test_a_quiet_machine_keeps_every_thread():
    m = Machine(cores=1.97, idle=0.01)
    g = m.governor(2)
    assert m.run(g, 40) == [2] * 40 and g.switches == 0


def test_another_process_on_a_core_drops_to_one_thread_after_a_window():
    m = Machine(cores=1.27, idle=0.0)  # 2 threads beside a busy loop (threads.py's table)
    g = m.governor(2)
    counts = m.run(g, 10)
    assert counts[:4] == [2] * 4  # a window is 300 ms of passes: the fifth of 62.5 ms closes the first
    assert counts[4:] == [1] * 6 and g.switches == 1


def test_one_thread_stays_while_the_other_core_is_busy_and_returns_once_it_idles():
    m = Machine(cores=1.27, idle=0.0)
    g = m.governor(2)
    m.run(g, 5)
    m.cores = 0.99  # one thread beside the busy loop: nothing idles
    assert m.run(g, 30) == [1] * 30
    m.idle, m.cores = 0.98, 1.97  # the loop ended: the other core idles (and serves a second thread)
    counts = m.run(g, 12)
    assert counts == [1] * 4 + [2] * 8 and g.switches == 2


def test_without_an_idle_reading_all_threads_are_tried_again_after_the_probe_time():
    m = Machine(cores=1.1, idle=None)
    g = m.governor(2, GovernorConfig(probe_s=2.0))
    m.run(g, 5)
    assert g.threads == 1
    m.cores = 1.0
    counts = m.run(g, 60)  # 3 s of passes at one thread
    assert 2 in counts and counts[counts.index(2) - 1] == 1  # tried again ...
    assert counts[-1] == 1  # ... and dropped again: the cores were still taken
    assert g.switches >= 3


def test_many_cores_drop_to_the_cores_got_and_take_back_what_idles():
    m = Machine(cores=5.3, idle=0.0)  # 8 threads, others hold about 3 cores
    g = m.governor(8)
    m.run(g, 5)
    assert g.threads == 5
    m.cores, m.idle = 5.0, 2.1
    m.run(g, 5)
    assert g.threads == 7


def test_one_thread_is_never_governed():
    m = Machine(cores=0.3, idle=0.0)
    g = m.governor(1)
    assert m.run(g, 20) == [1] * 20 and g.switches == 0


def test_the_idle_reading_is_seconds_since_boot_or_none(tmp_path):
    stat = tmp_path / "stat"
    stat.write_text("cpu  100 0 50 1000 20 0 0 0 0 0\ncpu0 50 0 25 500 10 0 0 0 0 0\n")
    import os

    assert read_idle_seconds(str(stat)) == 1020 / os.sysconf("SC_CLK_TCK")
    assert read_idle_seconds(str(tmp_path / "absent")) is None
    stat.write_text("garbage\n")
    assert read_idle_seconds(str(stat)) is None


class Quota(Machine):
    """A container held to about 1.2 CPUs on a machine that idles: two threads get 1.2 cores, and beside
    one thread the machine's idle time still shows most of a core free."""

    def run(self, governor: ThreadGovernor, passes: int) -> list[int]:
        counts = []
        for _ in range(passes):
            self.cores, self.idle = (1.2, 0.0) if governor.threads == 2 else (1.0, 0.9)
            counts += super().run(governor, 1)
        return counts


def test_raises_that_do_not_last_wait_longer_each_time():
    m = Quota(cores=1.2, idle=0.0)
    g = m.governor(2)
    counts = m.run(g, 1600)  # 100 s of passes
    rises = sum(1 for a, b in zip(counts, counts[1:]) if b > a)
    assert 4 <= rises <= 9, rises  # waits of 1, 2, 4, 8, 16 and then 30 s
    assert counts.count(2) < 0.05 * len(counts)  # without the waits: every other window, about half
    assert g.hold == 30.0


def test_a_raise_that_lasts_clears_the_wait():
    m = Quota(cores=1.2, idle=0.0)
    g = m.governor(2)
    m.run(g, 200)
    assert g.hold > 1.0
    quiet = Machine(cores=1.97, idle=0.98)
    quiet.t, quiet.cpu_s, quiet.idle_s = m.t, m.cpu_s, m.idle_s
    g.wall, g.cpu = (lambda: quiet.t), (lambda: quiet.cpu_s)
    g.idle = lambda: quiet.idle_s
    quiet.cores = 0.99  # one thread: the other core idles
    while g.threads == 1:
        quiet.run(g, 1)
    quiet.cores = 1.97
    quiet.run(g, 120)  # 7.5 s at two threads
    assert g.threads == 2 and g.hold == 0.0
