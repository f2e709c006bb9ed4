"""What else the host did while a bench timed something: the CPU time that processes outside
this bench's own process tree used (from /proc/stat's busy time, less this process's and its
waited-for children's), and the time the hypervisor gave this VM's CPUs to others (steal).

A timed bench measures the host's speed of the moment, and on 2 shared cores anything else
running slows it: a doc test run beside bench/recompute.py --heavy once made a ResNet-50
`sqrt` step 5.96 s instead of about 2.6. `run_quiet` times a function under `watch`, and
when the host was not quiet (OTHER_CORES_LIMIT, STEAL_LIMIT) waits for it to be and runs it
again, up to TRIES times; what it returns says what the last try saw, so that a bench's
rows can carry it. Linux only (/proc/stat); elsewhere nothing is seen and nothing retried.
"""
from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

STAT = Path("/proc/stat")
HZ = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
OTHER_CORES_LIMIT = 0.15  # other processes' average use, in cores, a quiet host stays under
STEAL_LIMIT = 0.05  # share of this VM's CPU time taken by the hypervisor for others
TRIES = 3  # runs of a timed function at most (run_quiet)
SETTLE_S, SETTLE_MAX_S = 2.0, 120.0  # a quiet sample's length; the longest wait for one


@dataclass(frozen=True)
class HostLoad:
    """What the host did during `wall_s` seconds beside this process tree."""
    wall_s: float
    other_cpu_s: float  # CPU time of processes outside this bench's tree
    steal_s: float  # CPU time the hypervisor gave to other guests

    @property
    def other_cores(self) -> float:
        return self.other_cpu_s / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def steal_ratio(self) -> float:
        cpus = os.cpu_count() or 1
        return self.steal_s / (self.wall_s * cpus) if self.wall_s > 0 else 0.0

    def quiet(self) -> bool:
        return self.other_cores <= OTHER_CORES_LIMIT and self.steal_ratio <= STEAL_LIMIT

    def as_json(self) -> dict:
        return {**{k: round(v, 3) for k, v in asdict(self).items()},
                "other_cores": round(self.other_cores, 3),
                "steal_ratio": round(self.steal_ratio, 3), "quiet": self.quiet()}


def cpu_ticks() -> tuple[int, int] | None:
    """(busy, steal) clock ticks of all CPUs since boot, from /proc/stat's first line; busy
    counts user, nice, system, irq and softirq (guest time is inside user). None where there
    is no /proc/stat."""
    try:
        fields = [int(x) for x in STAT.read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
    return user + nice + system + irq + softirq, steal


def own_cpu_s() -> float:
    """CPU time of this process and of the children it has waited for."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


class watch:
    """`with watch() as w: ...` then `w.load`: the HostLoad of the block. Children the block
    starts must be waited for inside it (subprocess.run does), or their time counts as
    other processes'."""

    def __enter__(self) -> "watch":
        self.load: HostLoad | None = None
        self._start = (time.perf_counter(), own_cpu_s(), cpu_ticks())
        return self

    def __exit__(self, *exc) -> None:
        wall0, own0, ticks0 = self._start
        wall, own, ticks = time.perf_counter() - wall0, own_cpu_s() - own0, cpu_ticks()
        if ticks0 is None or ticks is None:
            self.load = HostLoad(wall, 0.0, 0.0)
            return
        busy_s, steal_s = ((b - a) / HZ for a, b in zip(ticks0, ticks))
        # ticks are counted at HZ, own time finer: a tick's worth of rounding either way
        self.load = HostLoad(wall, max(0.0, busy_s - own), steal_s)


def wait_quiet(sample_s: float = SETTLE_S, max_s: float = SETTLE_MAX_S) -> HostLoad:
    """Sleep in samples of `sample_s` until one shows the host quiet, for at most `max_s`;
    the last sample's load."""
    deadline = time.monotonic() + max_s
    while True:
        with watch() as w:
            time.sleep(sample_s)
        if w.load.quiet() or time.monotonic() >= deadline:
            return w.load


def run_quiet(fn, tries: int = TRIES):
    """fn()'s result and a dict of what the host did while it ran: the last try's load
    (HostLoad.as_json) and "tries". A try the host was not quiet for is run again, after
    wait_quiet, up to `tries` in all; the last is kept whatever it saw."""
    for attempt in range(1, tries + 1):
        with watch() as w:
            result = fn()
        if w.load.quiet() or attempt == tries:
            return result, {**w.load.as_json(), "tries": attempt}
        wait_quiet()
