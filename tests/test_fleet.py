"""The fleet on Ray: a two-node local cluster, a worker killed mid-run, every user x device done
exactly once with the results of an undisturbed run; synthetic users are reproducible; a bad
spec is refused with a clear error."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from device_sim.fleetspec import SpecError, parse_spec
from device_sim.fleettask import OUTCOME_KEYS, result_path
from device_sim.synthusers import SYNTHETIC_BASE, rotation, synthetic_recordings
from edgetrain import data


ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def imu_artifact(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("fleet") / "imu"
    subprocess.run([sys.executable, "-m", "edgetrain.cli", "export", "--model", "imu_cnn",
                    "--epochs", "0", "--update", "head", "--micro-batch", "8", "--out",
                    str(out), "--json"], check=True, capture_output=True, cwd=ROOT)
    return out


def _spec(artifact: Path, faults: dict | None = None):
    return parse_spec({
        "artifact": str(artifact), "users": {"real": [10], "synthetic": 2, "seed": 3},
        "devices": {"watch-app-low": 1, "mcu-256kb": 1}, "every_device": True,
        "micro_batch": {"*": 8},
        "personalise": {"epochs": 2, "lr_grid": [0.003], "checkpoint_every": 1},
        "threads": 1, "max_retries": 2, "faults": faults or {}})


def _running(pid: int) -> bool:
    """Whether process `pid` still runs. A killed orphan is reparented to this machine's init,
    which may reap it late: until then /proc/<pid> exists, in state Z (zombie), having ended
    and released its files (and its run folder's lock)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def _outcomes(records: list[dict]) -> dict:
    return {(r["user"], r["device"]): {k: r.get(k) for k in OUTCOME_KEYS} for r in records}


@pytest.mark.slow
def test_two_node_fleet_survives_a_killed_worker(imu_artifact, tmp_path, monkeypatch):
    import ray
    from ray.cluster_utils import Cluster

    from device_sim.fleet import run_fleet

    monkeypatch.setattr("device_sim.fleet.IN_FLIGHT_PER_CPU", 1)  # 2 in flight: the queue moves
    with monkeypatch.context() as m:  # a stale cluster named (TEST-NET): its own local Ray
        m.setenv("RAY_ADDRESS", "192.0.2.2:6379")
        calm = run_fleet(_spec(imu_artifact), tmp_path / "calm", workers=2)
    assert calm.failed == [] and calm.scheduled == 6

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    try:
        # at its 3rd optimizer step: user 1000's run process is SIGKILLed; user 1001's Ray
        # worker is (its run process must die with it)
        spec = _spec(imu_artifact, {f"{SYNTHETIC_BASE}@watch-app-low": "step:3",
                                    f"{SYNTHETIC_BASE + 1}@watch-app-low": "worker:step:3"})
        run = run_fleet(spec, tmp_path / "storm", address=cluster.address)
    finally:
        ray.shutdown()
        cluster.shutdown()
    assert run.failed == [] and run.scheduled == 6
    recs = run.records
    # every user x device exactly once, with the undisturbed run's outcome
    assert sorted((r["user"], r["device"]) for r in recs) == sorted(spec.pairs())
    assert _outcomes(recs) == _outcomes(calm.records)
    by = {(r["user"], r["device"]): r for r in recs}
    hits = [(u, "watch-app-low") for u in (SYNTHETIC_BASE, SYNTHETIC_BASE + 1)]
    for k in hits:
        assert by[k]["attempts"] == 2 and by[k]["resumed_from_step"] is not None
        first = int((tmp_path / "storm" / "runs" / k[1] / f"u{k[0]}" / "attempts.txt")
                    .read_text().split()[0])
        assert first != by[k]["pid"] and not _running(first)  # no orphan
    assert all(r["attempts"] == 1 for k, r in by.items() if k not in hits)
    # a device too small is recorded once with its error, never retried
    for u in (10, SYNTHETIC_BASE, SYNTHETIC_BASE + 1):
        r = by[(u, "mcu-256kb")]
        assert r["status"] == "does not fit" and "budget" in r["error"]
    # one capped runtime per process; no run over its budget; both nodes used
    pids = [r["pid"] for r in recs]
    assert len(set(pids)) == len(pids)
    assert not {r["worker_pid"] for r in recs} & set(pids)  # no runtime in a Ray worker
    trained = [r for r in recs if r["status"] == "trained"]
    assert len(trained) == 3
    assert all(0 < r["measured_peak_bytes"] <= r["budget_bytes"] for r in trained)
    assert len({r["ray_node"] for r in recs}) == 2
    # what each task declared to Ray covers its process's measured RSS
    assert all(r["peak_rss_bytes"] <= r["declared_memory_bytes"] for r in recs)
    assert not any(r["torch_loaded"] for r in recs)

    # the same command again: nothing runs, nothing is written twice
    files = sorted(p.stat().st_mtime_ns for p in (tmp_path / "storm" / "results").rglob("*.json"))
    again = run_fleet(spec, tmp_path / "storm", workers=1)
    assert again.scheduled == 0 and again.skipped == 6
    assert sorted(p.stat().st_mtime_ns
                  for p in (tmp_path / "storm" / "results").rglob("*.json")) == files
    assert result_path(tmp_path / "storm", 10, "mcu-256kb").is_file()


def test_a_rerun_with_another_spec_is_refused(imu_artifact, tmp_path):
    from device_sim.fleet import prepare

    prepare(_spec(imu_artifact), tmp_path)
    other = parse_spec({"artifact": str(imu_artifact), "users": {"real": [10]},
                        "devices": {"watch-app-low": 1}})
    with pytest.raises(SpecError, match="another spec"):
        prepare(other, tmp_path)


def test_synthetic_users_are_seeded_and_physical():
    recs = data.load_recordings()
    a, wa = synthetic_recordings(recs, SYNTHETIC_BASE + 7, 0, (9, 10))
    b, _ = synthetic_recordings(recs, SYNTHETIC_BASE + 7, 0, (9, 10))
    c, wc = synthetic_recordings(recs, SYNTHETIC_BASE + 7, 1, (9, 10))
    assert all(np.array_equal(x, y) for x, y in zip(a.x, b.x))  # same seed: same arrays
    assert wa != wc  # another seed: another wearer
    assert wa.source_subject == 10 and set(a.subject) == {SYNTHETIC_BASE + 7}
    src = recs.x[int(np.flatnonzero(recs.subject == 10)[0])]
    # resampled by the clock's ratio; every class on both arms stays
    assert abs(len(a.x[0]) - len(src) / wa.rate_ratio) <= 2
    assert set(zip(a.y.tolist(), a.side.tolist())) == {(c_, s) for c_ in range(7) for s in (0, 1)}
    r = rotation(25.0, -5.0, 8.0)  # a rotation keeps gravity's magnitude
    np.testing.assert_allclose(r @ r.T, np.eye(3), atol=1e-12)
    assert abs(np.linalg.det(r) - 1) < 1e-12
    # the arm split works on a synthetic user as on a real one
    split = data.leave_one_subject_out(a, SYNTHETIC_BASE + 7)
    assert len(split.personalise[1]) > 0 and len(split.test[1]) > 0


@pytest.mark.parametrize("doc, message", [
    ({"users": {"real": [10]}, "devices": {"watch-app-low": 1}}, "needs \"artifact\""),
    ({"artifact": "a", "users": {"real": [10]}, "devices": {"no-such": 1}}, "unknown device"),
    ({"artifact": "a", "users": {"real": [10]}, "devices": {"watch-app-low": 0}}, "weight"),
    ({"artifact": "a", "users": {"synthetic": -1}, "devices": {"mcu-2mb": 1}}, "synthetic"),
    ({"artifact": "a", "users": {}, "devices": {"mcu-2mb": 1}}, "no users"),
    ({"artifact": "a", "users": {"real": ["x"]}, "devices": {"mcu-2mb": 1}}, "subject numbers"),
    ({"artifact": "a", "users": {"real": [10]}, "devices": {"mcu-2mb": 1},
      "micro_batch": {"*": -2}}, "micro_batch"),
    ({"artifact": "a", "users": {"real": [10]}, "devices": {"mcu-2mb": 1},
      "personalise": {"epoch": 2}}, "unknown personalise"),
    ({"artifact": "a", "users": {"real": [10]}, "devices": {"mcu-2mb": 1}, "extra": 1},
     "unknown fleet spec keys"),
    ({"artifact": "a", "users": {"real": [10]}, "devices": {"mcu-2mb": 1},
      "faults": {"10@mcu-2mb": "worker:nowhere:1"}}, "names no fault point"),
    # wrong but once accepted: each crashed or misbehaved every run (issue 37)
    ({"artifact": "a", "users": {"real": [10]}, "devices": {"mcu-2mb": 1},
      "personalise": {"epochs": "three"}}, "personalise.epochs is 'three', not a whole number"),
    ({"artifact": "a", "users": {"real": [10]}, "devices": {"mcu-2mb": 1},
      "personalise": {"lr": -1}}, "learning rate must be a finite number above 0"),
    ({"artifact": "a", "users": {"real": [10]}, "devices": {"mcu-2mb": 1},
      "personalise": {"lr_grid": [1e-3, "x"]}}, "list of numbers"),
    ({"artifact": "a", "users": {"real": [10]}, "devices": {"mcu-2mb": 1},
      "personalise": {"val_fraction": 1.5}}, "between 0 and 1"),
    ({"artifact": "a", "users": {"real": [10]}, "devices": {"mcu-2mb": 1},
      "micro_batch": True}, "micro_batch"),
    ({"artifact": "a", "users": {"real": [10]}, "devices": {"mcu-2mb": 1},
      "every_device": "false"}, "every_device must be true or false"),
    ({"artifact": "a", "users": {"real": [10], "seed": [1, 2]}, "devices": {"mcu-2mb": 1}},
     "users.seed must be a whole number"),
    ({"artifact": "a", "users": {"synthetic": 10**12, "sources": [10]},
      "devices": {"mcu-2mb": 1}}, "users.synthetic must be a whole number from 0"),
])
def test_bad_specs_say_what_and_how_to_fix(doc, message):
    with pytest.raises(SpecError, match=message):
        parse_spec(doc)


def test_fleet_users_must_be_subjects_of_the_artifacts_data_set(imu_artifact):
    from device_sim.fleet import check_users

    spec = parse_spec({"artifact": str(imu_artifact), "users": {"real": [99]},
                       "devices": {"watch-app-low": 1}})
    with pytest.raises(SpecError, match="users \\[99\\] are not subjects of the watch data"):
        check_users(spec)


def test_a_fleet_spec_that_is_no_regular_file_or_too_large_is_not_read(tmp_path):
    from device_sim.fleetspec import MAX_SPEC_BYTES, load_spec

    with pytest.raises(SpecError, match="not a regular file"):
        load_spec("/dev/zero")
    big = tmp_path / "big.json"
    with open(big, "wb") as f:
        f.truncate(MAX_SPEC_BYTES + 1)
    with pytest.raises(SpecError, match="more than the 1,048,576 such a file holds"):
        load_spec(big)


def test_fleet_users_must_be_outside_the_pretraining_population(imu_artifact, tmp_path):
    from device_sim.fleet import check_users

    spec = parse_spec({"artifact": str(imu_artifact), "users": {"real": [3]},
                       "devices": {"watch-app-low": 1}})
    with pytest.raises(SpecError, match="pretraining population"):
        check_users(spec)


def test_cli_refuses_bad_fleet_input_with_exit_2(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    cases = [(["fleet", str(tmp_path / "none.json"), "--out", str(tmp_path / "f")],
              "does not exist"),
             (["fleet", str(bad), "--out", str(tmp_path / "f")], "not valid JSON"),
             (["fleet-report", str(tmp_path / "f")], "not a fleet folder")]
    for args, words in cases:
        p = subprocess.run([sys.executable, "-m", "edgetrain.cli", *args], capture_output=True,
                           text=True, cwd=ROOT)
        assert p.returncode == 2, (args, p.stderr)
        assert words in p.stderr and "Traceback" not in p.stderr
    assert not (tmp_path / "f").exists()  # nothing was written
