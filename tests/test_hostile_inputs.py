"""Issue 37, the low cases: files and numbers that were accepted or crashed are refused with
the field, the value and the fix, exit 2, no traceback."""
from __future__ import annotations

import json
import os
import shutil

import pytest

from conftest import cli
from edgetrain.manifest import load_manifest
from edgetrain.specs import ArtifactError
from test_bad_input import art, refused, resume, saved  # noqa: F401
from test_fleet import imu_artifact  # noqa: F401


@pytest.mark.parametrize("content, message", [
    ("[{\"user\": 1}]", "record 0 field 'kind' is None, not str"),
    ("{\"records\": []}", "holds dict, not a list of records"),
    ("[1, 2", "is not valid JSON"),
    ("[{\"user\": 1, \"kind\": \"real\", \"device\": \"mcu-2mb\", \"status\": \"trained\", "
     "\"budget_bytes\": 1, \"gain_points\": \"lots\"}]", "field 'gain_points' is 'lots'"),
    (None, "is a symbolic link (to '/dev/zero')"),
])
def test_a_malformed_fleet_json_is_refused(tmp_path, content, message):
    path = tmp_path / "fleet.json"
    if content is None:
        os.symlink("/dev/zero", path)
    else:
        path.write_text(content)
    p = cli("fleet-report", tmp_path)
    assert p.returncode == 2 and message in p.stderr and "Traceback" not in p.stderr, p.stderr


def test_threads_beyond_reason_are_refused(art, saved):  # noqa: F811
    refused(resume(art, saved, "--threads", "512"), saved, "threads is 512")


@pytest.mark.parametrize("key, values, message", [
    ("scale", [0.0] * 6, "6 non-zero numbers"),
    ("mean", [float("nan")] * 6, "6 finite numbers"),
])
def test_a_preprocessing_that_cannot_standardise_is_refused(imu_artifact, tmp_path, key,  # noqa: F811
                                                            values, message):
    dst = tmp_path / "imu"
    shutil.copytree(imu_artifact, dst)
    d = json.loads((dst / "manifest.json").read_text())
    d["input"]["preprocess_args"][key] = values
    (dst / "manifest.json").write_text(json.dumps(d))
    with pytest.raises(ArtifactError, match=f"input.preprocess_args.{key}.*{message}"):
        load_manifest(dst)


def test_a_device_no_user_drew_keeps_its_row():
    from device_sim.fleetreport import report, table

    rec = {"user": 1000, "kind": "synthetic", "device": "watch-app-low", "status": "trained",
           "budget_bytes": 64 << 20, "gain_points": 1.0, "measured_peak_bytes": 1 << 20}
    rep = report([rec], ["watch-app-low", "mcu-2mb"])
    assert set(rep["devices"]) == {"watch-app-low", "mcu-2mb"}
    assert "mcu-2mb" in table(rep) and "no user drew this device" in table(rep)


def test_fleet_report_keeps_the_row_of_a_device_no_user_drew(tmp_path):
    rec = {"user": 1000, "kind": "synthetic", "device": "watch-app-low", "status": "trained",
           "budget_bytes": 64 << 20}
    (tmp_path / "fleet.json").write_text(json.dumps([rec]))
    (tmp_path / "fleet-spec.json").write_text(json.dumps(
        {"fingerprint": "x", "spec": {"devices": {"watch-app-low": 1, "mcu-2mb": 1}}}))
    p = cli("fleet-report", tmp_path)
    assert p.returncode == 0 and "no user drew this device" in p.stdout, p.stderr
