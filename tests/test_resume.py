"""Crash safety: resume points, SIGKILL at random moments (device_sim/faults.py), disk full."""
from __future__ import annotations

import json
import os
import random
import resource
import signal
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import ROOT, device_python, tiny_data
from device_sim.faults import ENV, FAULT_POINTS, run_until
from edgetrain import resume

EPOCHS = 3


@pytest.fixture(scope="module")
def data_files(tmp_path_factory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("data")
    np.savez(d / "train.npz", x=tiny_data(48, seed=1)[0], y=tiny_data(48, seed=1)[1])
    np.savez(d / "test.npz", x=tiny_data(30, seed=2)[0], y=tiny_data(30, seed=2)[1])
    return d / "train.npz", d / "test.npz"


def personalise_cmd(art: Path, data: tuple[Path, Path], out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "edgetrain.cli", "personalise", str(art), "--data",
            str(data[0]), "--test", str(data[1]), "--budget", "64MiB", "--out", str(out),
            "--epochs", str(EPOCHS), "--checkpoint-every", "1", "--json", *extra]


def env(fault: str | None = None) -> dict:
    e = {**os.environ, "PYTHONPATH": str(ROOT)}
    e.pop(ENV, None)
    if fault:
        e[ENV] = fault
    return e


def weights(checkpoint: Path) -> dict:
    return device_python(f"""
import json
from edgetrain.ort_device import training_api
s = training_api().CheckpointState.load_checkpoint({str(checkpoint)!r})
print(json.dumps({{k: p.data.tolist() for k, p in s.parameters}}))
""")


def assert_resume_points_intact(run: Path) -> int:
    """Every committed resume point's checkpoint is whole; returns the newest step."""
    d = run / resume.RESUME_DIR
    states = sorted(d.glob("state-*.json")) if d.is_dir() else []
    for s in states:
        rs = resume.ResumeState(**json.loads(s.read_text()))
        ckpt = d / rs.checkpoint
        assert ckpt.stat().st_size == rs.checkpoint_bytes, s
        assert resume.sha256_file(ckpt) == rs.checkpoint_sha256, s
    if not states:
        return 0
    rs, _, skipped = resume.latest(run)
    assert skipped == []
    return rs.steps


@pytest.fixture(scope="module")
def uninterrupted(tiny_artifact, data_files, tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("whole") / "run"
    r = run_until(personalise_cmd(tiny_artifact, data_files, out), None, env())
    assert r.returncode == 0, r.stderr
    return {"result": json.loads(r.stdout), "weights": weights(out / "checkpoint")}


def test_resume_after_a_kill_ends_with_the_uninterrupted_weights(tiny_artifact, data_files,
                                                                   uninterrupted, tmp_path):
    out = tmp_path / "run"
    r = run_until(personalise_cmd(tiny_artifact, data_files, out), None, env("step:7"))
    assert r.killed and assert_resume_points_intact(out) == 6
    r = run_until(personalise_cmd(tiny_artifact, data_files, out, "--resume"), None, env())
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    assert res["resumed_from_step"] == 6
    assert res["optimizer_steps"] == uninterrupted["result"]["optimizer_steps"]
    assert res["accuracy_before"] == uninterrupted["result"]["accuracy_before"]
    assert res["accuracy_after"] == uninterrupted["result"]["accuracy_after"]
    got, want = weights(out / "checkpoint"), uninterrupted["weights"]
    assert got.keys() == want.keys()
    for k in want:
        np.testing.assert_array_equal(np.array(got[k]), np.array(want[k]), err_msg=k)


@pytest.mark.parametrize("sig", ["TERM", "INT"])
def test_sigterm_or_sigint_writes_a_resume_point_and_resume_finishes_bit_identical(
        tiny_artifact, data_files, uninterrupted, tmp_path, sig):
    out, every = tmp_path / "run", ("--checkpoint-every", "0")  # epoch ends only, and signals
    r = run_until(personalise_cmd(tiny_artifact, data_files, out, *every), None,
                  env(f"step:7:{sig}"))
    code = 128 + getattr(signal, f"SIG{sig}")
    assert r.returncode == code, (r.returncode, r.stderr)
    assert "resume point" in r.stderr and "Traceback" not in r.stderr
    assert assert_resume_points_intact(out) == 7  # written at the step the signal came in
    r = run_until(personalise_cmd(tiny_artifact, data_files, out, *every, "--resume"), None,
                  env())
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["resumed_from_step"] == 7
    got, want = weights(out / "checkpoint"), uninterrupted["weights"]
    for k in want:
        np.testing.assert_array_equal(np.array(got[k]), np.array(want[k]), err_msg=k)


@pytest.mark.slow
def test_twenty_kills_at_random_moments_lose_nothing(tiny_artifact, data_files, uninterrupted,
                                                     tmp_path):
    """SIGKILL at >= 20 random points, a third of them inside checkpoint writes: every resume
    point on disk stays readable, every resume completes, the end matches the whole run."""
    rnd = random.Random(7)
    out = tmp_path / "run"
    kills, in_writes, last = 0, 0, 0
    for attempt in range(200):
        if kills >= 20:
            fault, delay = None, None
        elif attempt % 3 == 0:  # a kill inside a checkpoint or state write
            fault, delay = f"{rnd.choice(FAULT_POINTS[1:])}:{rnd.randint(1, 3)}", None
        elif attempt % 3 == 1:
            fault, delay = f"step:{rnd.randint(1, 4)}", None
        else:  # from outside, at a random moment
            fault, delay = None, rnd.uniform(0.5, 4.0)
        r = run_until(personalise_cmd(tiny_artifact, data_files, out, "--resume"), delay,
                      env(fault))
        if r.killed:
            kills += 1
            in_writes += fault is not None and not fault.startswith("step")
            now = assert_resume_points_intact(out)
            assert now >= last  # a kill never takes a committed step back
            last = now
            continue
        assert r.returncode == 0, r.stderr
        if kills >= 20:
            break
        # finished before the planned kills: start over in a fresh folder, keep counting
        assert json.loads(r.stdout)["optimizer_steps"] == uninterrupted["result"]["optimizer_steps"]
        out = tmp_path / f"run{attempt}"
        last = 0
    assert kills >= 20 and in_writes >= 5, (kills, in_writes)
    res = json.loads(r.stdout)
    assert abs(res["accuracy_after"] - uninterrupted["result"]["accuracy_after"]) <= 0.01
    got, want = weights(out / "checkpoint"), uninterrupted["weights"]
    for k in want:
        np.testing.assert_array_equal(np.array(got[k]), np.array(want[k]), err_msg=k)
    assert not list((out / resume.RESUME_DIR).glob("*.tmp-*"))  # leftovers cleaned


def _limit_file_size(limit: int):
    def apply() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a failed write, not a killed process
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return apply


def test_a_full_disk_while_checkpointing_fails_cleanly_and_keeps_saved_work(
        tiny_artifact, data_files, tmp_path):
    import subprocess

    out = tmp_path / "run"
    r = run_until(personalise_cmd(tiny_artifact, data_files, out), None, env("step:4"))
    assert r.killed
    before = {p.name: p.read_bytes() for p in (out / resume.RESUME_DIR).iterdir()}
    # Writes beyond 100 bytes fail (EFBIG), as writes to a full disk fail (ENOSPC).
    p = subprocess.run(personalise_cmd(tiny_artifact, data_files, out, "--resume"),
                       capture_output=True, text=True, env=env(),
                       preexec_fn=_limit_file_size(100))
    assert p.returncode == 4, p.stderr
    assert "could not write checkpoint" in p.stderr and "--resume" in p.stderr
    after = {p.name: p.read_bytes() for p in (out / resume.RESUME_DIR).iterdir()}
    assert after == before  # nothing saved was touched, no temporary left behind
    r = run_until(personalise_cmd(tiny_artifact, data_files, out, "--resume"), None, env())
    assert r.returncode == 0 and json.loads(r.stdout)["resumed_from_step"] == 3


def test_a_run_folder_with_progress_is_not_overwritten_without_resume(tiny_artifact,
                                                                        data_files, tmp_path):
    out = tmp_path / "run"
    assert run_until(personalise_cmd(tiny_artifact, data_files, out), None, env("step:3")).killed
    before = {p.name: p.read_bytes() for p in (out / resume.RESUME_DIR).iterdir()}
    r = run_until(personalise_cmd(tiny_artifact, data_files, out), None, env())
    assert r.returncode == 2 and "pass --resume" in r.stderr
    assert {p.name: p.read_bytes() for p in (out / resume.RESUME_DIR).iterdir()} == before


def test_latest_skips_a_tampered_point_and_refuses_when_none_is_intact(tiny_artifact,
                                                                       data_files, tmp_path):
    out = tmp_path / "run"
    assert run_until(personalise_cmd(tiny_artifact, data_files, out), None, env("step:4")).killed
    rs, ckpt, _ = resume.latest(out)
    assert rs.steps == 3
    raw = bytearray(ckpt.read_bytes())
    raw[len(raw) // 2] ^= 0xFF  # tamper with one byte
    ckpt.write_bytes(bytes(raw))
    rs2, _, skipped = resume.latest(out)
    assert rs2.steps == 2 and "sha256" in skipped[0]
    for p in (out / resume.RESUME_DIR).glob("ckpt-*"):
        p.unlink()
    with pytest.raises(resume.ResumeError, match="no intact resume point"):
        resume.latest(out)


@pytest.mark.slow
def test_resume_keeps_masks_and_the_mask_update_schedule(data_files, tmp_path):
    """A sparse run with SET mask updates (random regrowth): the resumed run replays the same
    mask updates from the saved generator state and ends with the same masks and weights."""
    import torch

    from conftest import TINY_CLASSES, TINY_SHAPE, tiny_model
    from edgetrain.manifest import Plan
    from exporters.export import export_artifact

    art = tmp_path / "sparse"
    export_artifact(tiny_model(), torch.zeros(2, *TINY_SHAPE), art, classes=TINY_CLASSES,
                    plan=Plan(micro_batch=4), lr=1e-2, density=0.5, freeze_batchnorm=True)
    masks = ["--mask-update", "set", "--mask-every", "2", "--drop-fraction", "0.3"]
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    r = run_until(personalise_cmd(art, data_files, whole, *masks), None, env())
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["mask_updates"] > 3
    assert run_until(personalise_cmd(art, data_files, cut, *masks), None, env("step:9")).killed
    r = run_until(personalise_cmd(art, data_files, cut, *masks, "--resume"), None, env())
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["resumed_from_step"] == 8
    got, want = weights(cut / "checkpoint"), weights(whole / "checkpoint")
    assert "conv.weight_positions" in want
    for k in want:
        np.testing.assert_array_equal(np.array(got[k]), np.array(want[k]), err_msg=k)


def test_fault_points_are_a_seam_only_the_simulator_arms(monkeypatch):
    """The runtime names its fault points; it never reads EDGETRAIN_FAULT itself."""
    from device_sim.faults import install_from_env, kill_at
    from edgetrain.faultpoints import fault_point, install_hook

    monkeypatch.setenv(ENV, "step:1")
    fault_point("step")  # no hook installed (as on a device): nothing happens
    calls = []
    install_hook(lambda name, path: calls.append(name))
    try:
        fault_point("step")
    finally:
        install_hook(None)
    assert calls == ["step"]
    with pytest.raises(ValueError, match="names no fault point"):
        kill_at("nowhere:1")
    assert install_from_env({}) is False


def test_a_huge_or_linked_state_file_is_skipped_not_read(tmp_path):
    """A state file over the bound, or a link (here to /dev/zero), is never parsed: --resume
    names it damaged and looks at the next."""
    from edgetrain import resume

    d = tmp_path / resume.RESUME_DIR
    d.mkdir()
    (d / "state-00000009.json").symlink_to("/dev/zero")
    with open(d / "state-00000008.json", "wb") as f:
        f.truncate(resume.MAX_STATE_BYTES + 1)
    with pytest.raises(resume.NoIntactPoint) as e:
        resume.latest(tmp_path)
    assert "state-00000009.json: not a regular file" in str(e.value)
    assert f"more than a resume point's {resume.MAX_STATE_BYTES:,}" in str(e.value)


GOOD_STATE = dict(schema=2, artifact_manifest_sha256="a" * 64, run_sha256="b" * 64, steps=4,
                  total_steps=10, epoch=1, step_in_epoch=0, epoch_rng_state={},
                  mask_rng_state={}, mask_updates=0, regrown_weights=0, accuracy_before=0.5,
                  checkpoint="ckpt-00000004", checkpoint_bytes=100, checkpoint_sha256="c" * 64,
                  selection={"candidate": 0, "since_best": 0, "history": []})


@pytest.mark.parametrize("change, reason", [
    ({"epoch": -10**9}, "epoch is -1000000000"),
    ({"steps": 11}, "lie beyond"),
    ({"accuracy_before": "hacked"}, "accuracy_before is 'hacked'"),
    ({"selection": {"candidate": 0, "since_best": 0, "history": [], "best": {}}},
     "of its three scores"),
    ({"selection": {"candidate": "0", "since_best": 0, "history": []}}, "selection.candidate"),
    ({"mask_rng_state": None}, "mask_rng_state is not an object"),
])
def test_a_state_whose_values_cannot_be_right_is_skipped(tmp_path, change, reason):
    """Hashes can be resealed: the values a resume reads are checked for kind and range (a
    negative epoch looped for ever; a string accuracy went into result.json)."""
    from edgetrain import resume

    assert resume.ResumeState(**GOOD_STATE).problem() is None
    d = tmp_path / resume.RESUME_DIR
    d.mkdir()
    (d / "state-00000004.json").write_text(json.dumps({**GOOD_STATE, **change}))
    with pytest.raises(resume.NoIntactPoint, match=reason):
        resume.latest(tmp_path)
