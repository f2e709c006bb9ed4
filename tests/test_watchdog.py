"""Issue 37, part 4: a device call that runs past its bound stops the run with a clear error and
status 137, keeping what was saved; the bound follows the predicted step cost within a floor and
a ceiling, so a hostile manifest cannot switch it off."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest
from onnx import helper, numpy_helper

from conftest import ROOT, cli
from edgetrain import watchdog
from test_bad_input import art, refused, resume, rewrite_manifest, saved  # noqa: F401
from test_hostile_graphs import add_to_loss, edit


GUARDED = """
import sys, time
from edgetrain import watchdog
watchdog.enable()
watchdog.set_bound(float(sys.argv[1]))
with watchdog.guard("a quick call"):
    pass
time.sleep(0.3)
print("quick call survived", flush=True)
with watchdog.guard("a slow call"):
    time.sleep(float(sys.argv[2]))
print("slow call survived", flush=True)
"""


def guarded(bound: float, slow: float) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", GUARDED, str(bound), str(slow)],
                          capture_output=True, text=True, cwd=ROOT, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_a_call_past_its_bound_is_stopped_with_its_name_and_a_quick_one_is_not():
    t0 = time.monotonic()
    p = guarded(0.2, 30)
    assert p.returncode == -9 and time.monotonic() - t0 < 20
    assert p.stdout.splitlines() == ["quick call survived"]
    assert "error: a slow call ran for more than 0.2 s" in p.stderr, p.stderr
    assert "--resume" in p.stderr and "Traceback" not in p.stderr
    p = guarded(5, 0.1)
    assert p.returncode == 0 and "slow call survived" in p.stdout, p.stderr


def test_the_bound_follows_the_predicted_cost_within_floor_and_ceiling(monkeypatch):
    monkeypatch.delenv(watchdog.ENV, raising=False)
    assert watchdog.bound_s(None) == watchdog.FLOOR_S
    assert watchdog.bound_s(1000) == watchdog.FLOOR_S
    flops = int(2 * watchdog.FLOOR_S / watchdog.SECONDS_PER_FLOP)
    assert watchdog.bound_s(flops) == pytest.approx(2 * watchdog.FLOOR_S)
    assert watchdog.bound_s(flops, batch_ratio=2.0) == pytest.approx(4 * watchdog.FLOOR_S)
    assert watchdog.bound_s(10 ** 30) == watchdog.CEILING_S  # a hostile manifest's figure
    monkeypatch.setenv(watchdog.ENV, "0.5")
    assert watchdog.bound_s(10 ** 30) == 0.5


STALL = "ran for more than"


def slow_matmul(m):
    """A 1024 x 1024 product in every step: about 2 GFLOP, far past a 10 ms bound."""
    square = numpy_helper.from_array(np.ones((1024, 1024), np.float32), "h_square")
    m.graph.initializer.append(square)
    add_to_loss(m, [helper.make_node("MatMul", ["h_square", "h_square"], ["h_slow"])], "h_slow")


def test_a_stalled_personalise_is_stopped_then_runs_again(art, saved, tmp_path,  # noqa: F811
                                                         monkeypatch):
    edit(art, slow_matmul)
    out = tmp_path / "run"
    args = ("personalise", art, "--data", saved["data"], "--budget", "48MiB", "--epochs", "1",
            "--out", out)
    monkeypatch.setenv(watchdog.ENV, "0.01")
    p = cli(*args)
    assert p.returncode == -9, p.stderr  # SIGKILL: the shell reports 137 (EXIT_STALLED)
    assert STALL in p.stderr and "Traceback" not in p.stderr
    assert not [f for f in out.rglob("*") if ".tmp" in f.name]  # no temporaries left
    monkeypatch.delenv(watchdog.ENV)
    p = cli(*args, "--resume")
    assert p.returncode == 0 and (out / "checkpoint").is_file(), p.stderr


def test_a_stalled_measure_exits_137(art, monkeypatch):  # noqa: F811
    edit(art, slow_matmul)
    monkeypatch.setenv(watchdog.ENV, "0.01")
    p = cli("measure", art, "--batch", "4", "--steps", "1")
    assert p.returncode == watchdog.EXIT_STALLED, p.stderr
    assert STALL in p.stderr and "Traceback" not in p.stderr


def test_a_manifest_step_cost_of_the_wrong_kind_is_refused(art, saved):  # noqa: F811
    predicted = json.loads((art / "manifest.json").read_text())["predicted"]
    assert predicted["step_flops"] > 0  # the exporter records it
    rewrite_manifest(art, predicted={**predicted, "step_flops": "forever"})
    refused(resume(art, saved), saved, "manifest field predicted.step_flops")

