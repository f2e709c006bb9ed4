"""Bad input, one test each: a clear message, exit status != 0, and a run folder whose saved
checkpoints and resume points are byte for byte what they were before."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest

from conftest import cli, tiny_data
from edgetrain.manifest import MANIFEST_NAME, file_entry


def snapshot(run: Path) -> dict[str, bytes]:
    return {str(p.relative_to(run)): p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def saved(tiny_artifact, tmp_path_factory) -> dict:
    """A run folder holding a finished personalisation: checkpoint, resume points, result."""
    d = tmp_path_factory.mktemp("saved")
    x, y = tiny_data(48, seed=1)
    np.savez(d / "train.npz", x=x, y=y)
    run = d / "run"
    p = cli("personalise", tiny_artifact, "--data", d / "train.npz", "--budget", "4MiB",
            "--epochs", "2", "--checkpoint-every", "4", "--out", run)
    assert p.returncode == 0, p.stderr
    assert (run / "resume").is_dir() and (run / "checkpoint").is_file()
    return {"artifact": tiny_artifact, "run": run, "data": d / "train.npz",
            "snapshot": snapshot(run)}


def resume(artifact, saved, *extra, data=None, budget="4MiB"):
    return cli("personalise", artifact, "--data", data or saved["data"], "--budget", budget,
               "--epochs", "2", "--checkpoint-every", "4", "--out", saved["run"], "--resume",
               *extra)


def refused(p, saved, message: str, code: int = 2) -> None:
    assert p.returncode == code, (p.returncode, p.stderr)
    assert message in p.stderr, p.stderr
    assert "Traceback" not in p.stderr
    assert snapshot(saved["run"]) == saved["snapshot"]  # nothing saved was lost or changed


@pytest.fixture
def art(tiny_artifact, tmp_path) -> Path:
    dst = tmp_path / "art"
    shutil.copytree(tiny_artifact, dst)
    return dst


def rewrite_manifest(art: Path, **changes) -> None:
    path = art / MANIFEST_NAME
    d = json.loads(path.read_text())
    d.update(changes)
    path.write_text(json.dumps(d))


def reseal(art: Path, role: str) -> None:
    """Update the manifest's size and hash of one file: a hostile artifact is consistent."""
    d = json.loads((art / MANIFEST_NAME).read_text())
    entry = file_entry(art, d["files"][role]["path"])
    d["files"][role].update(size_bytes=entry.size_bytes, sha256=entry.sha256)
    (art / MANIFEST_NAME).write_text(json.dumps(d))


# ---- the artifact ----------------------------------------------------------------------------
def test_manifest_missing(art, saved):
    (art / MANIFEST_NAME).unlink()
    refused(resume(art, saved), saved, "manifest.json is missing")


def test_manifest_malformed(art, saved):
    (art / MANIFEST_NAME).write_text("{not json")
    refused(resume(art, saved), saved, "is not valid JSON")


def test_manifest_of_another_schema_version(art, saved):
    rewrite_manifest(art, schema_version=99)
    refused(resume(art, saved), saved, "schema_version is 99, this runtime reads 1")


def test_manifest_listing_more_classes_than_the_logits(art, tmp_path):
    """The manifest is not hashed: one more class than the graph's logits lets a label reach
    ORT's loss past the logits (a crash). The preflight compares them first."""
    rewrite_manifest(art, classes=["a", "b", "c", "d"])
    x, y = tiny_data(24)
    y[-1] = 3  # a label the manifest allows, beyond the graph's three logits
    np.savez(tmp_path / "d.npz", x=x, y=y)
    p = cli("personalise", art, "--data", tmp_path / "d.npz", "--budget", "4MiB", "--no-select",
            "--out", tmp_path / "run")
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert "logits of shape (4, 3), but the manifest lists 4 classes" in p.stderr
    assert "Traceback" not in p.stderr
    assert not (tmp_path / "run" / "checkpoint").exists()


def test_file_truncated(art, saved):
    p = art / "training_model.onnx"
    p.write_bytes(p.read_bytes()[:-10])
    refused(resume(art, saved), saved, "truncated or replaced")


def test_file_tampered_same_size(art, saved):
    p = art / "checkpoint"
    raw = bytearray(p.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    p.write_bytes(bytes(raw))
    refused(resume(art, saved), saved, "the file was modified")


def test_graph_far_larger_than_the_manifest_says(art, saved):
    p = art / "training_model.onnx"
    with open(p, "rb+") as f:
        f.truncate(2**30)  # 1 GiB (sparse on disk): refused by its size, never read
    refused(resume(art, saved), saved, f"is {2**30} bytes, the manifest says")


@pytest.mark.parametrize("where", ["initializer", "subgraph"])
def test_graph_with_external_data_outside_the_folder(art, saved, where):
    path = art / "eval_model.onnx"
    m = onnx.load(str(path))
    t = onnx.numpy_helper.from_array(np.zeros(4, np.float32), "stolen")
    onnx.external_data_helper.set_external_data(t, location="../../../etc/passwd")
    t.data_location = onnx.TensorProto.EXTERNAL
    t.ClearField("raw_data")
    if where == "initializer":
        m.graph.initializer.append(t)
    else:  # hidden in a node attribute's subgraph
        m.graph.node[0].attribute.append(
            onnx.helper.make_attribute("body", onnx.helper.make_graph([], "g", [], [], [t])))
    path.write_bytes(m.SerializeToString())
    reseal(art, "eval_model")  # manifest hashes match: only the graph scan can catch it
    refused(resume(art, saved), saved, "'../../../etc/passwd'")


def test_resume_with_another_artifact(saved, tmp_path):
    from conftest import export_tiny

    other = tmp_path / "other"
    export_tiny(other, seed=5)  # same shapes, other weights
    refused(resume(other, saved), saved, "trained from another artifact")


def test_resume_point_holding_another_artifacts_checkpoint(saved, tmp_path):
    """A resume point whose checkpoint (hash and all) is another model's is refused on load."""
    import torch

    from edgetrain.manifest import Plan
    from exporters.export import export_artifact

    other = tmp_path / "other"
    export_artifact(torch.nn.Sequential(torch.nn.Conv2d(3, 5, 3), torch.nn.Flatten(),
                                        torch.nn.Linear(180, 3)),
                    torch.zeros(2, 3, 8, 8), other, classes=list("abc"), plan=Plan(micro_batch=4))
    forged = tmp_path / "forged"
    shutil.copytree(saved["run"], forged)
    state_path = sorted((forged / "resume").glob("state-*.json"))[-1]
    state = json.loads(state_path.read_text())
    ckpt = forged / "resume" / state["checkpoint"]
    ckpt.write_bytes((other / "checkpoint").read_bytes())
    entry = file_entry(ckpt.parent, ckpt.name)
    state.update(checkpoint_bytes=entry.size_bytes, checkpoint_sha256=entry.sha256)
    state_path.write_text(json.dumps(state))
    before = snapshot(forged)
    p = cli("personalise", saved["artifact"], "--data", saved["data"], "--budget", "4MiB",
            "--epochs", "2", "--checkpoint-every", "4", "--out", forged, "--resume")
    assert p.returncode == 2 and "belongs to another artifact" in p.stderr, p.stderr
    assert snapshot(forged) == before


# ---- the data ----------------------------------------------------------------------------------
def bad_data(tmp_path, x, y) -> Path:
    path = tmp_path / "bad.npz"
    np.savez(path, x=x, y=y)
    return path


@pytest.mark.parametrize("make, message", [
    (lambda x, y: (x[:, :, :4], y), "the artifact expects"),  # wrong shape
    (lambda x, y: (x.astype(np.int32), y), "expected a float array"),  # wrong dtype
    (lambda x, y: (np.where(np.arange(x.size).reshape(x.shape) == 5, np.nan, x), y), "NaN/Inf"),
    (lambda x, y: (np.where(np.arange(x.size).reshape(x.shape) == 7, np.inf, x), y), "NaN/Inf"),
    (lambda x, y: (np.where(np.arange(x.size).reshape(x.shape) == 9, 3e30, x), y),
     "magnitude 3e+30 (the first beyond 1e+15"),  # finite, but float32 training overflows
    (lambda x, y: (x, np.where(np.arange(len(y)) == 3, 9, y)), "label 9 is out of range"),
    (lambda x, y: (x, y - 1), "label -1 is out of range"),
    (lambda x, y: (x[:0], y[:0]), "holds no samples"),
], ids=["shape", "dtype", "nan", "inf", "huge", "label-high", "label-negative", "empty"])
def test_bad_data(tiny_artifact, saved, tmp_path, make, message):
    x, y = tiny_data(16, seed=3)
    refused(resume(tiny_artifact, saved, data=bad_data(tmp_path, *make(x, y))), saved,
            message)


def test_resume_with_other_data(tiny_artifact, saved, tmp_path):
    x, y = tiny_data(48, seed=9)
    refused(resume(tiny_artifact, saved, data=bad_data(tmp_path, x, y)), saved,
            "other settings or other data")


# ---- the budget --------------------------------------------------------------------------------
@pytest.mark.parametrize("budget, message, code", [
    ("0", "'0' is not a positive number of bytes", 2),  # a usage mistake: 2 in every command
    ("-5MB", "'-5MB' is not a positive number of bytes", 2),
    ("1KiB", "below the model's parameters", 3),  # a real budget the model cannot fit
])
def test_bad_budget(tiny_artifact, saved, budget, message, code):
    refused(resume(tiny_artifact, saved, budget=budget), saved, message, code=code)
