"""The three workflows through the CLI, as a user runs them, and bad input refused clearly."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from conftest import cli, export_tiny, tiny_data


@pytest.fixture(scope="module")
def npz(tmp_path_factory):
    d = tmp_path_factory.mktemp("data")
    x, y = tiny_data(48, seed=1)
    np.savez(d / "train.npz", x=x, y=y)
    xt, yt = tiny_data(30, seed=2)
    np.savez(d / "test.npz", x=xt, y=yt)
    return d


def test_custom_network_exported_in_python_personalises_from_npz(tmp_path, npz):
    art = tmp_path / "custom"
    export_tiny(art, micro_batch=8, lr=5e-2, seed=3)  # not a named network: the Python API
    p = cli("personalise", art, "--data", npz / "train.npz", "--test", npz / "test.npz",
            "--budget", "4MiB", "--epochs", "6", "--out", tmp_path / "run", "--json", "--no-select")
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    assert r["torch_loaded"] is False
    assert r["accuracy_after"] > r["accuracy_before"]
    assert r["accuracy_after"] >= 0.8  # the toy task is easy once trained
    assert r["inference_agreement"] == 1.0
    assert r["optimizer_steps"] == 6 * (48 // 8)
    saved = json.loads((tmp_path / "run" / "result.json").read_text())
    assert saved["accuracy_after"] == r["accuracy_after"]
    assert (tmp_path / "run" / "checkpoint").stat().st_size > 0


def test_micro_batching_accumulates_to_the_same_number_of_samples(tmp_path, npz, tiny_artifact):
    p = cli("personalise", tiny_artifact, "--data", npz / "train.npz", "--budget", "4MiB",
            "--micro-batch", "2", "--accumulate", "4", "--epochs", "1", "--out", tmp_path / "r",
            "--json", "--no-select")
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    assert (r["micro_batch"], r["accumulation_steps"], r["optimizer_steps"]) == (2, 4, 48 // 8)


def test_measure_refuses_a_tampered_artifact(tmp_path, tiny_artifact):
    """(personalise's refusals, with nothing saved lost: test_bad_input.py)"""
    art = tmp_path / "a"
    shutil.copytree(tiny_artifact, art)
    p = art / "eval_model.onnx"
    p.write_bytes(p.read_bytes() + b"\0")
    r = cli("measure", art, "--batch", "2")
    assert r.returncode == 2 and "truncated or replaced" in r.stderr


def test_usage_errors(tmp_path, tiny_artifact, npz):
    r = cli("personalise", tiny_artifact, "--data", npz / "train.npz", "--out", tmp_path / "r")
    assert r.returncode != 0 and "--device NAME or --budget BYTES" in r.stderr
    r = cli("personalise", tiny_artifact, "--user", "10", "--budget", "4MiB",
            "--out", tmp_path / "r")
    assert r.returncode == 2 and "use --data" in r.stderr
    r = cli("measure", tiny_artifact, "--batch", "0")
    assert r.returncode == 2 and "positive" in r.stderr
    for extra in ([], ["--budget", "64MiB", "--device", "mcu-8mb"]):
        r = cli("export", "--model", "patch_mobilenet", "--out", tmp_path / "x",
                "--recompute", "budget", *extra)
        assert r.returncode == 2 and ("need --budget or --device" in r.stderr
                                      or "not both" in r.stderr), r.stderr
    r = cli("export", "--model", "patch_mobilenet", "--out", tmp_path / "x", "--budget", "1MB")
    assert r.returncode == 2 and "apply only to them" in r.stderr
    assert not (tmp_path / "x").exists()


def test_devices_json():
    r = cli("devices", "--json")
    assert r.returncode == 0
    d = json.loads(r.stdout)
    assert d["watchos-extension"]["ram_budget_bytes"] == 15 * 2**20


@pytest.mark.slow
def test_named_patch_mobilenet_end_to_end_on_builtin_user(tmp_path):
    """export (no pretraining epochs, so it is quick) -> personalise user 10 -> measure."""
    art = tmp_path / "pm"
    r = cli("export", "--model", "patch_mobilenet", "--epochs", "0", "--no-cache",
            "--holdout-user", "10", "--out", art, "--json")
    assert r.returncode == 0, r.stderr
    m = json.loads(r.stdout)
    assert m["plan"]["patch_size"] == 32 and m["input"]["image_shape"] == [3, 224, 224]
    assert m["input"]["preprocess"] == "imu_gasf" and 10 not in m["provenance"]["population_subjects"]
    r = cli("personalise", art, "--user", "3", "--budget", "15MiB", "--out", tmp_path / "x")
    assert r.returncode == 2 and "pretraining population" in r.stderr
    r = cli("measure", art, "--batch", "8", "--device", "watchos-extension", "--json")
    assert r.returncode == 0, r.stderr
    peak = json.loads(r.stdout)["peak_bytes"]
    r = cli("personalise", art, "--user", "10", "--budget", peak, "--epochs", "1",
            "--lr-grid", "3e-4", "--out", tmp_path / "u10", "--json")  # one run: quick
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    assert res["inference_agreement"] == 1.0 and res["torch_loaded"] is False
    assert res["train_items"] % 49 == 0  # every window contributes its 49 patches


@pytest.mark.slow
def test_mobilenet_v1_exports_and_measures(tmp_path):
    art = tmp_path / "mb"
    r = cli("export", "--model", "mobilenet_v1", "--epochs", "0", "--no-cache", "--out", art,
            "--micro-batch", "2")
    assert r.returncode == 0, r.stderr
    r = cli("measure", art, "--batch", "2", "--steps", "1", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["torch_loaded"] is False
    assert sum(d["breakdown"].values()) == d["peak_bytes"]
    assert d["breakdown"]["optimizer_state"] == 2 * d["breakdown"]["gradients"]


def test_errors_under_json_are_json_too(tmp_path, tiny_artifact, npz):
    r = cli("personalise", tiny_artifact, "--data", npz / "train.npz", "--budget", "1KiB",
            "--out", tmp_path / "r", "--json")
    assert r.returncode == 3 and "Traceback" not in r.stderr
    err = json.loads(r.stdout)
    assert err["exit_status"] == 3 and "below the model's parameters" in err["error"]
    assert err["error"] in r.stderr  # the same words on stderr for a person


def test_a_budget_that_fails_while_loading_is_a_budget_error(tmp_path, tiny_artifact, npz):
    """A budget just above the parameters, runtime scalars and graph constants passes the
    split but not ORT's loading (the gradient buffers): a budget error (exit 3) naming the
    micro-batch, never an internal error, and no run folder written."""
    from edgetrain.artifactbytes import module_constants_bytes, state_bytes_of
    from edgetrain.budget import RUNTIME_SCALAR_BYTES
    from edgetrain.manifest import load_manifest

    m = load_manifest(tiny_artifact)
    budget = (state_bytes_of(m) + RUNTIME_SCALAR_BYTES
              + module_constants_bytes(tiny_artifact, m) + 1)
    r = cli("personalise", tiny_artifact, "--data", npz / "train.npz", "--budget", str(budget),
            "--out", tmp_path / "r")
    assert r.returncode == 3, r.stderr
    assert "loading the artifact needs more memory than the budget" in r.stderr
    assert f"At micro-batch {m.plan.micro_batch}" in r.stderr
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("args, words", [
    (("measure", "--batch", "8", "--steps", "0"), "steps must be at least 1"),
    (("measure", "--batch", "8", "--accumulate", "0"), "accumulate must be at least 1"),
    (("measure", "--batch", "8", "--threads", "0"), "threads is 0"),
    (("personalise", "--threads", "0"), "threads is 0"),
    (("personalise", "--mask-end", "0.5"), "--mask-end does nothing without --mask-update"),
])
def test_a_zero_or_an_unused_setting_is_refused_not_ignored(tmp_path, tiny_artifact, npz,
                                                            args, words):
    """0 steps once measured nothing and printed a step time of NaN (invalid JSON); 0
    threads or 0 micro-batches a step silently meant the plan's; a mask option without a
    mask updater silently did nothing. Each is bad input now: exit 2, the same words as
    JSON under --json, and no run folder."""
    cmd, *rest = args
    extra = (["--data", npz / "train.npz", "--budget", "4MiB", "--out", tmp_path / "run"]
             if cmd == "personalise" else [])
    r = cli(cmd, tiny_artifact, *extra, *rest, "--json")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    err = json.loads(r.stdout)
    assert err["exit_status"] == 2 and words in err["error"]
    assert not (tmp_path / "run").exists()


def test_measure_refuses_what_it_cannot_run_before_starting_a_process():
    from device_sim.measure import check_settings

    check_settings(8, None, 1, 1, None)  # the plan's threads, uncapped: fine
    for bad, words in [(dict(batch=0), "batch must be"), (dict(budget_bytes=0), "budget_bytes"),
                       (dict(accumulation=0), "accumulate must"), (dict(steps=0), "steps must"),
                       (dict(threads=0), "threads is 0"), (dict(threads=65), "threads is 65")]:
        settings = {"batch": 8, "budget_bytes": None, "accumulation": 1, "steps": 1,
                    "threads": None, **bad}
        with pytest.raises(ValueError, match=words):
            check_settings(**settings)


def test_a_file_given_as_the_artifact_is_named_as_a_file(tiny_artifact):
    r = cli("measure", tiny_artifact / "manifest.json", "--batch", "8")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "is a file, not a folder" in r.stderr
