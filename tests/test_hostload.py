"""bench/hostload.py: what else the host did while a bench timed something, and the retry
of a measurement the host was busy for."""
from __future__ import annotations

import subprocess
import sys

from conftest import ROOT

sys.path.insert(0, str(ROOT / "bench"))
import hostload  # noqa: E402


def _ticks(monkeypatch, busy: list[int], steal: list[int], own: list[float]) -> None:
    """/proc/stat's busy and steal ticks, and this process tree's CPU time, as successive
    reads return them."""
    ticks = iter(zip(busy, steal))
    owns = iter(own)
    monkeypatch.setattr(hostload, "cpu_ticks", lambda: next(ticks))
    monkeypatch.setattr(hostload, "own_cpu_s", lambda: next(owns))
    monkeypatch.setattr(hostload, "HZ", 100)


def test_other_processes_cpu_is_busy_time_less_the_bench_trees(monkeypatch):
    # 150 busy ticks (1.5 s) of which the bench tree used 1.2 s: 0.3 s by others
    _ticks(monkeypatch, [1000, 1150], [50, 50], [10.0, 11.2])
    with hostload.watch() as w:
        pass
    assert abs(w.load.other_cpu_s - 0.3) < 1e-9 and w.load.steal_s == 0
    load = hostload.HostLoad(wall_s=2.0, other_cpu_s=0.3, steal_s=0.0)
    assert load.other_cores == 0.15 and load.quiet()  # at the limit: still quiet
    assert not hostload.HostLoad(2.0, 0.32, 0.0).quiet()


def test_steal_is_a_share_of_all_cpus_time(monkeypatch):
    monkeypatch.setattr(hostload.os, "cpu_count", lambda: 2)
    load = hostload.HostLoad(wall_s=10.0, other_cpu_s=0.0, steal_s=2.0)
    assert load.steal_ratio == 0.1 and not load.quiet()
    assert load.as_json()["quiet"] is False and load.as_json()["steal_ratio"] == 0.1


def test_a_busy_try_is_run_again_after_the_host_is_quiet(monkeypatch):
    loads = iter([hostload.HostLoad(1.0, 0.9, 0.0), hostload.HostLoad(1.0, 0.0, 0.0)])
    monkeypatch.setattr(hostload, "watch", lambda: _Fixed(next(loads)))
    waited = []
    monkeypatch.setattr(hostload, "wait_quiet", lambda: waited.append(1))
    calls = []
    result, seen = hostload.run_quiet(lambda: calls.append(1) or len(calls))
    assert result == 2 and seen["tries"] == 2 and seen["quiet"] and waited == [1]


def test_the_last_try_is_kept_busy_or_not(monkeypatch):
    monkeypatch.setattr(hostload, "watch", lambda: _Fixed(hostload.HostLoad(1.0, 0.9, 0.0)))
    monkeypatch.setattr(hostload, "wait_quiet", lambda: None)
    calls = []
    result, seen = hostload.run_quiet(lambda: calls.append(1) or len(calls), tries=3)
    assert result == 3 and seen["tries"] == 3 and not seen["quiet"]
    assert seen["other_cores"] == 0.9


def test_a_busy_loop_beside_the_block_is_seen_and_the_blocks_own_child_is_not():
    spin = subprocess.Popen([sys.executable, "-c", "import time\nt=time.time()\n"
                             "while time.time() - t < 3: pass"])
    try:
        with hostload.watch() as w:  # a child of the block's own, waited for: not "other"
            subprocess.run([sys.executable, "-c", "import time\nt=time.time()\n"
                            "while time.time() - t < 1: pass"], check=True)
    finally:
        spin.wait()
    assert w.load.other_cores > 0.5  # the spinning process: about one core
    assert w.load.other_cpu_s < w.load.wall_s * 1.5  # not the block's own child as well


class _Fixed:
    """A watch that sees a given load."""

    def __init__(self, load):
        self.load = load

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None
