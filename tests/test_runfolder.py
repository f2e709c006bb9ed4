"""Issue 17: a run folder is never an artifact and serves one run at a time; values that
cannot train are refused or stop the run with a clear error, and nothing saved is lost."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from conftest import ROOT, cli, tiny_data
from test_bad_input import art, refused, rewrite_manifest, saved, snapshot  # noqa: F401


def personalise(artifact, data, out, *extra):
    return cli("personalise", artifact, "--data", data, "--budget", "4MiB", "--epochs", "1",
               "--out", out, *extra)


def test_out_is_never_the_artifact_folder_or_inside_it(art, saved):  # noqa: F811
    before = snapshot(art)
    for out in (art, art / "runs" / "u1"):
        p = personalise(art, saved["data"], out)
        assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
        assert "artifact folder" in p.stderr and "nothing was written" in p.stderr
        assert snapshot(art) == before  # the artifact is byte for byte what it was


def test_reset_bn_never_replaces_a_finished_run(saved):  # noqa: F811
    p = cli("reset-bn", saved["artifact"], "--data", saved["data"], "--budget", "4MiB",
            "--out", saved["run"])
    refused(p, saved, "already holds a run's outputs")


def test_two_runs_started_together_on_one_folder(tiny_artifact, tmp_path):
    """Both start at once: one trains, the other is refused at once naming the running process;
    a kill of the holder frees the folder (the kernel drops the lock), and --resume goes on."""
    x, y = tiny_data(48, seed=2)
    np.savez(tmp_path / "d.npz", x=x, y=y)
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "edgetrain.cli", "personalise", str(tiny_artifact), "--data",
           str(tmp_path / "d.npz"), "--budget", "4MiB", "--epochs", "2000",
           "--checkpoint-every", "50", "--out", str(out), "--json"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    runs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             cwd=ROOT, env=env) for _ in range(2)]
    try:
        t0 = time.perf_counter()
        while all(r.poll() is None for r in runs) and time.perf_counter() - t0 < 120:
            time.sleep(0.05)
        loser = next(r for r in runs if r.poll() is not None)
        holder = next(r for r in runs if r is not loser)
        err = loser.stderr.read()
        assert loser.returncode == 2 and "Traceback" not in err, err
        assert f"in use by another run (process {holder.pid})" in err, err
        assert holder.poll() is None  # the other one is still training
        while not list((out / "resume").glob("state-*.json")):  # it has saved progress
            assert holder.poll() is None and time.perf_counter() - t0 < 300
            time.sleep(0.05)
    finally:
        for r in runs:
            r.kill()
            r.wait()
    p = personalise(tiny_artifact, tmp_path / "d.npz", out, "--resume", "--epochs", "2000")
    assert p.returncode == 0, p.stderr  # the lock was free; the run finished from its point


@pytest.mark.parametrize("lr", ["inf", "nan", "-1"])
def test_a_learning_rate_that_cannot_train_is_refused(tiny_artifact, tmp_path, lr):
    x, y = tiny_data(24, seed=2)
    np.savez(tmp_path / "d.npz", x=x, y=y)
    p = personalise(tiny_artifact, tmp_path / "d.npz", tmp_path / "run", "--lr", lr)
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
    assert "learning rate" in p.stderr and not (tmp_path / "run").exists()


def test_a_manifest_learning_rate_of_nan_is_refused(art, tmp_path):  # noqa: F811
    import json
    d = json.loads((art / "manifest.json").read_text())
    rewrite_manifest(art, optimizer={**d["optimizer"], "lr": float("nan")})
    x, y = tiny_data(24, seed=2)
    np.savez(tmp_path / "d.npz", x=x, y=y)
    p = personalise(art, tmp_path / "d.npz", tmp_path / "run")
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
    assert "the manifest's lr is nan" in p.stderr


def test_float64_data_beyond_float32_is_refused(tiny_artifact, tmp_path):
    x, y = tiny_data(24, seed=2)
    x = x.astype(np.float64)
    x[3, 0, 0, 0] = 1e39  # finite in float64, inf once cast to float32
    np.savez(tmp_path / "d.npz", x=x, y=y)
    p = personalise(tiny_artifact, tmp_path / "d.npz", tmp_path / "run")
    assert p.returncode == 2 and "beyond float32's range" in p.stderr, p.stderr
    assert "Traceback" not in p.stderr


def test_a_diverging_run_stops_with_exit_5_and_keeps_its_last_resume_point(tiny_artifact,
                                                                            tmp_path):
    x, y = tiny_data(48, seed=2)
    np.savez(tmp_path / "d.npz", x=x, y=y)
    out = tmp_path / "run"
    p = personalise(tiny_artifact, tmp_path / "d.npz", out, "--lr", "1e30",
                    "--checkpoint-every", "1")
    assert p.returncode == 5 and "training diverged" in p.stderr, p.stderr
    assert "Traceback" not in p.stderr and not (out / "checkpoint").exists()
    points = sorted((out / "resume").iterdir())
    assert points  # the resume points written before the loss went bad are all there


def test_a_checkpoint_data_file_beside_the_checkpoint_is_refused(art, saved):  # noqa: F811
    (art / "checkpoint.data").write_bytes(b"\0" * 64)
    p = personalise(art, saved["data"], art.parent / "run")
    assert p.returncode == 2 and "checkpoint.data" in p.stderr, p.stderr
    assert "Traceback" not in p.stderr


def test_a_symlinked_artifact_file_is_refused(art, saved, tmp_path):  # noqa: F811
    outside = tmp_path / "elsewhere.onnx"
    outside.write_bytes((art / "eval_model.onnx").read_bytes())
    (art / "eval_model.onnx").unlink()
    (art / "eval_model.onnx").symlink_to(outside)
    p = personalise(art, saved["data"], art.parent / "run")
    assert p.returncode == 2 and "symbolic link" in p.stderr, p.stderr


def test_external_data_in_a_function_default_attribute_is_refused(art, saved):  # noqa: F811
    import onnx
    from onnx import helper

    m = onnx.load(str(art / "eval_model.onnx"))
    t = helper.make_tensor("w", onnx.TensorProto.FLOAT, [1], [0.0])
    t.data_location = onnx.TensorProto.EXTERNAL
    t.external_data.add(key="location", value="../../../etc/passwd")
    del t.float_data[:]
    f = helper.make_function("custom", "f", ["x"], ["y"], [helper.make_node("Identity", ["x"], ["y"])],
                             [helper.make_opsetid("", 17)])
    f.attribute_proto.append(helper.make_attribute("value", t))
    m.functions.append(f)
    data = m.SerializeToString()
    from edgetrain.onnxscan import external_data
    assert external_data(data) == [("w", "../../../etc/passwd")]
