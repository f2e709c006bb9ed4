"""Issue 37, part 6: SIGINT and SIGTERM stop a fleet cleanly (exit 130 / 143, no traceback),
the same command then finishes it, and what a killed driver left half-written is swept."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import ROOT
from test_fleet import imu_artifact  # noqa: F401



def fleet(spec, out) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "edgetrain.cli", "fleet", str(spec), "--out",
                             str(out), "--workers", "2"], cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, "PYTHONPATH": str(ROOT),
                                 # another cluster named (unreachable, TEST-NET): the fleet
                                 # still starts its own local Ray, as documented
                                 "RAY_ADDRESS": "192.0.2.2:6379"})


@pytest.mark.slow
@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_stops_the_fleet_and_the_same_command_finishes_it(imu_artifact, tmp_path,  # noqa: F811
                                                                   sig, code):
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({
        "artifact": str(imu_artifact), "users": {"synthetic": 4, "sources": [10], "seed": 5},
        "devices": {"watch-app-low": 1}, "micro_batch": {"*": 8},
        "personalise": {"epochs": 3, "lr_grid": [0.003], "checkpoint_every": 1},
        "threads": 1}))
    out = tmp_path / "out"
    p = fleet(spec, out)
    deadline = time.monotonic() + 300
    while not list((out / "runs").glob("*/*/resume/state-*.json")):  # runs are under way
        assert p.poll() is None and time.monotonic() < deadline, p.communicate()
        time.sleep(0.2)
    p.send_signal(sig)
    _, err = p.communicate(timeout=120)
    assert p.returncode == code, err
    assert "the fleet was stopped by" in err and "run the same command again" in err
    assert "Traceback" not in err
    stale = out / ".fleet.json.tmp-999999999-1"  # a killed driver's half-written merge
    stale.write_text("[")
    p = fleet(spec, out)
    _, err = p.communicate(timeout=600)
    assert p.returncode == 0, err
    records = json.loads((out / "fleet.json").read_text())
    assert len(records) == 4 and all(r["status"] == "trained" for r in records), records
    assert not stale.exists()
