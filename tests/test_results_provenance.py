"""What docs/results.md says about where its results come from (bench/summary.py), and the
fleet bench's one-worker part that only `--full` measures (bench/fleet.py)."""
from __future__ import annotations

import importlib
import json
import sys

import pytest

from conftest import ROOT

sys.path.insert(0, str(ROOT / "bench"))
import common  # noqa: E402
import summary  # noqa: E402
from steps import Step  # noqa: E402

bench_all = importlib.import_module("all")


def at(monkeypatch, commit: str) -> None:
    monkeypatch.setattr(common, "stamp", lambda: {"commit": commit, "date": "2026-11-28",
                                                  "machine": "a CPU, 2 cores"})


@pytest.fixture
def repo(tmp_path, monkeypatch):
    """Steps a (default, writes x), h (--full, shares x: heavy rows) and f (--full, writes y),
    results under tmp_path, progress.json there too."""
    monkeypatch.setattr(common, "RESULTS", tmp_path)
    monkeypatch.setattr(summary, "RESULTS", tmp_path)
    monkeypatch.setattr(bench_all, "PROGRESS", tmp_path / "progress.json")
    monkeypatch.setattr(summary, "STEPS", (
        Step("a", "a.py", writes=("x",)), Step("h", "a.py", ("--heavy",), full=True,
                                               writes=("x",)),
        Step("f", "f.py", full=True, writes=("y",))))
    at(monkeypatch, "old0001")
    common.save_results("y", [{"v": 1}])
    common.save_results("x", [{"network": "resnet50", "commit": "old0001"},
                              {"network": "imu_cnn", "commit": "new0002"}])
    return tmp_path


def progress(repo, code: str, steps: list[str]) -> None:
    (repo / "progress.json").write_text(json.dumps({"code": code, "steps": {
        s: {"elapsed_s": 1.0, "finished": f"2026-11-28T0{i}:00:00"}
        for i, s in enumerate(steps)}}))


def test_a_whole_default_run_names_its_commit_and_the_full_steps_kept_rows(repo):
    progress(repo, "new0002", ["a"])
    assert summary.whole_run() == ("new0002", "2026-11-28T00:00:00")
    line = summary.provenance_line()
    assert line.startswith("A whole `make results` ran at commit `new0002` (finished "
                           "2026-11-28T00:00:00)")
    assert line.endswith(": `old0001` (h, f).")  # the run's own commit is not listed again
    progress(repo, "new0002", ["a", "f"])  # a --full step finished later: not the run's end
    assert summary.whole_run() == ("new0002", "2026-11-28T00:00:00")


def test_without_a_whole_run_every_commit_is_named(repo):
    progress(repo, "new0002", [])  # step a has not finished at this code
    assert summary.whole_run() is None
    line = summary.provenance_line()
    assert "has not yet run whole" in line
    assert "`new0002` (a, h)" in line and "`old0001` (a, h, f)" in line


def test_a_default_steps_file_of_another_commit_is_not_a_whole_run(repo, monkeypatch):
    monkeypatch.setattr(summary, "STEPS", (*summary.STEPS, Step("b", "b.py", writes=("z",))))
    common.save_results("z", [{"v": 2}])  # stamped old0001, not the run's code
    progress(repo, "new0002", ["a", "b"])
    assert summary.whole_run() is None


def test_the_run_time_names_the_machine_of_the_runs_rows(repo, monkeypatch):
    monkeypatch.setattr(summary, "STEPS", (*summary.STEPS, Step("b", "b.py", writes=("z",))))
    monkeypatch.setattr(common, "stamp", lambda: {"commit": "new0002", "date": "2026-11-28",
                                                  "machine": "B CPU, 2 cores"})
    common.save_results("z", [{"v": 2}])
    progress(repo, "new0002", ["a", "b"])
    line = summary.duration_line()
    assert "takes about 0.0 h on B CPU, 2 cores (where the run of this page's commit" in line
    assert "a CPU" not in line  # the --full step's rows of old0001 ran elsewhere
    progress(repo, "other03", ["a", "b"])  # no rows of this code: no machine to name
    assert "takes about 0.0 h on 2 cores: " in summary.duration_line()


def test_the_fleets_one_worker_part_is_the_only_one_that_may_be_of_another_commit():
    import fleet

    parts = {"throughput_1": {"commit": "new0002"}, "fleet_1000": {"commit": "new0002"},
             "fleet_1000_one_worker": {"commit": "old0001"}}
    assert fleet.why_mixed(parts) == fleet.HEAVY_WHY
    assert fleet.why_mixed({**parts, "fleet_1000_one_worker": {"commit": "new0002"}}) is None
    assert fleet.why_mixed({**parts, "throughput_1": {"commit": "mid0003"}}) is None


def test_every_full_step_declares_the_files_its_scripts_default_steps_write():
    """A `--full` step's rows land in the files its script's default steps write (a heavy
    part kept beside a default run's rows); undeclared, a whole run would never be named."""
    import steps

    default = [s for s in steps.STEPS if not s.full]
    for s in (s for s in steps.STEPS if s.full):
        shared = {n for d in default if d.script == s.script for n in d.writes}
        assert shared <= set(s.writes), (s.name, shared - set(s.writes))
