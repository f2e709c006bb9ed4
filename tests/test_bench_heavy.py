"""bench/heavy.py: a default `make results` measures every row but ResNet-50's and keeps the
saved ResNet-50 rows with the commit they were measured at; `--full` measures those alone."""
from __future__ import annotations

import json
import sys

import pytest

from conftest import ROOT

sys.path.insert(0, str(ROOT / "bench"))
import common  # noqa: E402
import heavy  # noqa: E402
import steps  # noqa: E402


def at(monkeypatch, commit: str, command: str = "bench/r.py") -> None:
    monkeypatch.setattr(common, "stamp", lambda: {"commit": commit, "date": "2026-11-28",
                                                  "machine": "a CPU, 2 cores"})
    monkeypatch.setattr(common, "command_line", lambda: command)


@pytest.fixture
def results(tmp_path, monkeypatch):
    monkeypatch.setattr(common, "RESULTS", tmp_path)
    at(monkeypatch, "aaa0001")
    return tmp_path


def net(row: dict) -> str:
    return row["network"]


def test_each_part_keeps_the_other_with_the_commit_it_was_measured_at(results, monkeypatch):
    common.save_results("r", [{"network": "resnet50", "v": 1}, {"network": "imu_cnn", "v": 2}])
    at(monkeypatch, "bbb0002")  # a default run: imu_cnn measured again, ResNet-50 kept
    kept = heavy.kept_rows("r", False, net)
    assert kept == [{"network": "resnet50", "v": 1, "commit": "aaa0001",
                     "date": "2026-11-28", "machine": "a CPU, 2 cores",
                     "command": "bench/r.py"}]
    common.save_results("r", [{"network": "imu_cnn", "v": 3}, *kept])
    stamps = common.row_stamps(common.read_stamped("r"))
    assert [s["commit"] for s in stamps] == ["bbb0002", "aaa0001"]
    assert heavy.why_mixed("r", net) == heavy.HEAVY_WHY
    line = common.measured_at(["r"], heavy.why_mixed("r", net))
    assert "`aaa0001`, `bbb0002` (the ResNet-50 rows are measured by" in line
    at(monkeypatch, "ccc0003")  # a --heavy run keeps imu_cnn's row, stamped bbb0002
    assert heavy.kept_rows("r", True, net) == [{"network": "imu_cnn", "v": 3,
                                                "commit": "bbb0002", "date": "2026-11-28",
                                                "machine": "a CPU, 2 cores",
                                                "command": "bench/r.py"}]


def test_the_line_names_the_command_of_each_part(results, monkeypatch):
    """A --heavy run keeps the other rows with the command that measured them: the table's
    line names both commands, not the last run's alone."""
    common.save_results("r", [{"network": "resnet50", "v": 1}, {"network": "imu_cnn", "v": 2}])
    at(monkeypatch, "aaa0001", "bench/r.py --heavy")
    common.save_results("r", [{"network": "resnet50", "v": 3},
                              *heavy.kept_rows("r", True, net)])
    line = common.measured_at(["r"], heavy.why_mixed("r", net))
    assert line.startswith("Measured at commit `aaa0001`")
    assert line.endswith("; `bench/r.py --heavy`, `bench/r.py`.")


def test_rows_kept_from_a_file_without_a_commit_stay_not_recorded(results, monkeypatch):
    (results / "old.json").write_text(json.dumps([{"network": "resnet50", "v": 1},
                                                  {"network": "imu_cnn", "v": 2}]))
    kept = heavy.kept_rows("old", False, net)
    assert kept == [{"network": "resnet50", "v": 1, "commit": "not recorded", "date": None,
                     "machine": None, "command": None}]
    common.save_results("old", [{"network": "imu_cnn", "v": 3}, *kept])
    line = common.measured_at(["old"], heavy.why_mixed("old", net))
    assert line.startswith("Measured at commits `aaa0001`, `not recorded` (the ResNet-50 rows")


def test_a_mix_within_a_part_is_not_excused(results):
    common.save_results("r", [{"network": "imu_cnn", "commit": "aaa0001"},
                              {"network": "imu_cnn", "commit": "bbb0002"},
                              {"network": "resnet50", "commit": "ccc0003"}])
    assert heavy.why_mixed("r", net) is None
    with pytest.raises(SystemExit, match="3 commits"):
        common.measured_at(["r"], heavy.why_mixed("r", net))
    common.save_results("one", [{"network": "imu_cnn"}, {"network": "resnet50"}])
    assert heavy.why_mixed("one", net) is None  # one commit: nothing to excuse
    assert heavy.kept_rows("missing", False, net) == []


def test_resnet50_runs_only_in_full_steps_and_every_table_still_has_a_default_step():
    default = [s for s in steps.STEPS if not s.full]
    for s in steps.STEPS:
        assert s.full == ("--heavy" in s.args or s.args == ("--network", "resnet50")
                          or s.name in ("personalise-recipes-patch", "filing-baseline")), s
    for s in (s for s in steps.STEPS if "--heavy" in s.args):
        assert any(d.script == s.script and d.report_args == s.report_args for d in default), s
    assert heavy.part(["mobilenet_v1", "resnet50"], True) == ["resnet50"]
    assert heavy.part(["mobilenet_v1", "resnet50"], False) == ["mobilenet_v1"]


@pytest.mark.parametrize("script", ["predictor", "recompute", "planner", "convbn",
                                    "eager_race"])
def test_every_bench_with_resnet50_rows_takes_heavy(script):
    import subprocess

    out = subprocess.run([sys.executable, f"bench/{script}.py", "--help"], cwd=ROOT,
                         capture_output=True, text=True)
    assert out.returncode == 0 and "--heavy" in out.stdout, out.stderr


def test_predictor_rows_name_their_network_and_keep_a_whole_runs_order():
    import predictor

    rows = [{"model": m, "part": p} for m, p in (
        ("C7 patch_mobilenet (head)", "stack"), ("imu_cnn", "table"), ("cnn2d", "families"),
        ("resnet50", "table"), ("C4 resnet50 (all)", "stack"), ("mobilenet_v1", "table"))]
    assert [predictor.network_of(r) for r in rows] == [
        "patch_mobilenet", "imu_cnn", "cnn2d", "resnet50", "resnet50", "mobilenet_v1"]
    assert [r["model"] for r in predictor.in_order(rows)] == [
        "mobilenet_v1", "resnet50", "imu_cnn", "C4 resnet50 (all)",
        "C7 patch_mobilenet (head)", "cnn2d"]
    bn = [{"model": "watchos-extension: imu_cnn, update all, micro-batch 8"},
          {"model": "resnet50, --adapt bn, steps of 1"},
          {"model": "mobilenet_v1, --adapt bn, steps of 1"}]
    assert [predictor.network_of(r) for r in predictor.in_order(bn)] == [
        "mobilenet_v1", "resnet50", "watchos-extension"]
