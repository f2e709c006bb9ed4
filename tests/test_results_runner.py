"""bench/all.py (`make results`): the steps' order, resuming, failing, and the stamps every
result file and table carries (bench/common.py)."""
from __future__ import annotations

import json
import sys

import pytest

from conftest import ROOT

sys.path.insert(0, str(ROOT / "bench"))
import common  # noqa: E402
import steps  # noqa: E402

sys.modules.pop("all", None)
import all as runner  # noqa: E402


def test_every_step_runs_a_bench_that_exists_and_has_a_unique_name():
    names = [s.name for s in steps.STEPS]
    assert len(names) == len(set(names))
    for s in steps.STEPS:
        assert (ROOT / "bench" / s.script).is_file(), s


def test_a_step_that_reads_results_comes_after_the_step_that_writes_them():
    order = {s.name: i for i, s in enumerate(steps.STEPS)}
    for reader, writer in (("feed-paths", "eager-race"), ("filing-baseline", "planner"),
                           ("personalise-report", "personalise-mcu-256kb"),
                           ("personalise-report", "personalise-watch-other-arm"),
                           ("personalise-gate", "personalise-report"),
                           ("personalise-gate", "personalise-nested-mcu-256kb"),
                           ("personalise-int8", "personalise-watchos-extension-int8")):
        assert order[writer] < order[reader], (reader, writer)


def test_unknown_step_names_are_refused_by_name():
    with pytest.raises(SystemExit, match="no bench step nope"):
        steps.by_name(["gradkernels", "nope"])


@pytest.fixture
def fake_repo(tmp_path, monkeypatch):
    """A repository of three tiny benches: b fails while FAIL exists."""
    bench = tmp_path / "bench"
    bench.mkdir()
    for name in ("a", "b", "c"):
        (bench / f"{name}.py").write_text(
            "import pathlib, sys\n"
            f"if '{name}' == 'b' and '--report' not in sys.argv and pathlib.Path('FAIL').exists():"
            "\n"
            "    sys.exit(5)\n"
            f"with open('ran.txt', 'a') as f: f.write('{name}' + ' '.join(sys.argv[1:]) + '\\n')\n")
    (bench / "summary.py").write_text("open('ran.txt', 'a').write('summary\\n')\n")
    fake = tuple(steps.Step(n, f"{n}.py", (), 1, ("--report",)) for n in ("a", "b", "c"))
    monkeypatch.setattr(runner, "ROOT", tmp_path)
    monkeypatch.setattr(runner, "PROGRESS", tmp_path / "progress.json")
    monkeypatch.setattr(runner, "LOGS", tmp_path / "logs")
    monkeypatch.setattr(runner, "STEPS", fake)
    monkeypatch.setattr(runner, "code_commit", lambda: "abc1234")
    return tmp_path


def ran(repo) -> list[str]:
    path = repo / "ran.txt"
    lines = path.read_text().splitlines() if path.is_file() else []
    path.unlink(missing_ok=True)
    return lines


def test_a_failed_step_stops_the_run_and_a_rerun_continues_from_it(fake_repo):
    (fake_repo / "FAIL").write_text("")
    assert runner.main([]) == 1
    assert ran(fake_repo) == ["a"]  # b failed: c did not run, no tables were rebuilt
    progress = json.loads((fake_repo / "progress.json").read_text())
    assert list(progress["steps"]) == ["a"] and progress["code"] == "abc1234"
    (fake_repo / "FAIL").unlink()
    assert runner.main([]) == 0
    assert ran(fake_repo) == ["b", "c", "a--report", "b--report", "c--report", "summary"]
    assert runner.main([]) == 0  # everything done on this code: only the tables again
    assert ran(fake_repo) == ["a--report", "b--report", "c--report", "summary"]


def test_other_code_starts_again_and_only_and_report_do_what_they_say(fake_repo, monkeypatch,
                                                                     capsys):
    assert runner.main([]) == 0
    ran(fake_repo)
    monkeypatch.setattr(runner, "code_commit", lambda: "def5678")
    assert runner.main(["--only", "c"]) == 0
    assert ran(fake_repo) == ["c", "c--report", "summary"]
    assert "starting from the first step" in capsys.readouterr().out
    assert runner.main(["--report"]) == 0
    assert ran(fake_repo) == ["a--report", "b--report", "c--report", "summary"]
    assert runner.main(["--list"]) == 0 and ran(fake_repo) == []
    progress = json.loads((fake_repo / "progress.json").read_text())
    assert list(progress["steps"]) == ["c"]  # done on this code
    assert set(progress["elapsed_s"]) == {"a", "b", "c"}  # last times, kept for the estimates


@pytest.fixture
def results(tmp_path, monkeypatch):
    monkeypatch.setattr(common, "RESULTS", tmp_path)
    monkeypatch.setattr(common, "stamp", lambda: {"commit": "abc1234", "date": "2026-11-27",
                                                  "machine": "a CPU, 2 cores"})
    return tmp_path


def test_a_result_file_carries_its_stamp_and_command_and_loads_as_its_rows(results):
    common.save_results("x", [{"v": 1}])
    doc = json.loads((results / "x.json").read_text())
    assert doc["stamp"]["commit"] == "abc1234" and "python" in doc["stamp"]["command"]
    assert common.load_results("x") == [{"v": 1}]
    assert common.load_results("missing", []) == []
    (results / "old.json").write_text(json.dumps([{"v": 2}]))  # from before the stamp
    assert common.load_results("old") == [{"v": 2}]
    assert common.measured_at(["old"]) == "Measured at a commit not recorded."
    line = common.measured_at(["x"])
    assert line.startswith("Measured at commit `abc1234`, 2026-11-27, a CPU, 2 cores; `")


def test_the_same_rows_saved_again_keep_the_stamp_of_where_they_were_made(results,
                                                                           monkeypatch):
    common.save_results("x", [{"v": (1, 2)}], derived=True)
    common.save_results("m", [{"v": 1}])
    monkeypatch.setattr(common, "stamp", lambda: {"commit": "fff0000", "date": "2026-11-28",
                                                  "machine": "a CPU, 2 cores"})
    common.save_results("x", [{"v": [1, 2]}], derived=True)  # a report of the same results
    assert common.read_stamped("x")["stamp"]["commit"] == "abc1234"
    common.save_results("x", [{"v": [1, 3]}], derived=True)  # new results: the new stamp
    assert common.read_stamped("x")["stamp"]["commit"] == "fff0000"
    common.save_results("m", [{"v": 1}])  # measured again: stamped where it was measured
    assert common.read_stamped("m")["stamp"]["commit"] == "fff0000"


def test_a_table_refuses_rows_of_two_commits_unless_it_says_why(results):
    common.save_results("x", [{"v": 1, "commit": "abc1234"}, {"v": 2, "commit": "fff0000"}])
    with pytest.raises(SystemExit, match="2 commits .*abc1234, fff0000"):
        common.measured_at(["x"])
    line = common.measured_at(["x"], why_mixed="C1 was not raced again")
    assert "`abc1234`, `fff0000` (C1 was not raced again)" in line
    with pytest.raises(SystemExit, match="no results for nothing"):
        common.measured_at(["nothing"])


def test_a_table_goes_between_its_markers_under_its_stamp(results, tmp_path):
    common.save_results("x", [{"v": 1}])
    doc = tmp_path / "doc.md"
    doc.write_text("before\n<!-- t -->\nold\n<!-- /t -->\nafter\n")
    common.replace_table(doc, ["| a |", "|---|"], "t", sources=["x"])
    text = doc.read_text()
    assert text.startswith("before\n<!-- t -->\nMeasured at commit `abc1234`")
    assert "old" not in text and text.endswith("| a |\n|---|\n<!-- /t -->\nafter\n")


def test_committing_results_docs_or_the_readme_keeps_the_code_commit(tmp_path):
    import subprocess

    def git(*args: str) -> str:
        return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
                              cwd=tmp_path, capture_output=True, text=True,
                              check=True).stdout.strip()

    git("init", "-q")
    (tmp_path / "code.py").write_text("x = 1\n")
    git("add", "."), git("commit", "-qm", "code")
    code = git("log", "-1", "--format=%h")
    for name in ("README.md", "docs/results.md", "bench/results/demo.json"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("figures\n")
    git("add", "."), git("commit", "-qm", "results")
    assert common.code_commit(tmp_path) == code
    (tmp_path / "code.py").write_text("x = 2\n")
    assert common.code_commit(tmp_path) == code + "+changes"
    git("commit", "-qam", "more code")
    assert common.code_commit(tmp_path) == git("log", "-1", "--format=%h")
