"""Memory measured by the runtime's own allocator, asserted in bytes from shapes x itemsize."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from conftest import cli, tiny_data
from edgetrain.budget import ARENA_CHUNK_BYTES, RUNTIME_SCALAR_BYTES
from edgetrain.manifest import load_manifest


def chunk(nbytes: int) -> int:
    return max(ARENA_CHUNK_BYTES, -(-nbytes // ARENA_CHUNK_BYTES) * ARENA_CHUNK_BYTES)


def measure_json(art, *extra) -> dict:
    p = cli("measure", art, "--batch", "4", "--json", *extra)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


@pytest.fixture(scope="module")
def measured(tiny_artifact):
    return [measure_json(tiny_artifact) for _ in range(3)]


def test_breakdown_is_byte_exact_from_shapes(tiny_artifact, measured):
    m = load_manifest(tiny_artifact)
    shapes = {t.name: t.shape for t in m.trainable + m.frozen}
    # conv 4x3x3x3, bn weight/bias/mean/var 4 each, head 3x4 + 3: float32
    assert shapes["conv.weight"] == (4, 3, 3, 3) and shapes["head.weight"] == (3, 4)
    trainable = [4 * 3 * 3 * 3 * 4, 4 * 4, 4 * 4, 3 * 4 * 4, 3 * 4]
    frozen = [4 * 4, 4 * 4]  # bn.running_mean, bn.running_var
    b = measured[0]["breakdown"]
    assert b["parameters"] == sum(chunk(n) for n in trainable + frozen)
    assert b["gradients"] == sum(chunk(n) for n in trainable)
    assert b["optimizer_state"] == 2 * sum(chunk(n) for n in trainable)  # AdamW m and v
    assert b["other"] >= RUNTIME_SCALAR_BYTES
    assert b["activations"] > 0
    assert sum(b.values()) == measured[0]["peak_bytes"]


def test_peak_is_identical_across_runs_and_device_has_no_torch(measured):
    assert len({r["peak_bytes"] for r in measured}) == 1
    assert isinstance(measured[0]["peak_bytes"], int)
    assert all(r["torch_loaded"] is False for r in measured)


def test_budget_at_peak_trains_and_64k_below_fails(tiny_artifact, measured, tmp_path):
    peak = measured[0]["peak_bytes"]
    x, y = tiny_data(16)
    np.savez(tmp_path / "d.npz", x=x, y=y)
    ok = cli("personalise", tiny_artifact, "--data", tmp_path / "d.npz", "--budget", peak,
             "--epochs", "1", "--out", tmp_path / "ok")
    assert ok.returncode == 0, ok.stderr
    # what the run wrote survives a later run that fails on its budget
    before = (tmp_path / "ok" / "checkpoint").read_bytes()
    bad = cli("personalise", tiny_artifact, "--data", tmp_path / "d.npz",
              "--budget", peak - 64 * 1024, "--epochs", "1", "--out", tmp_path / "ok",
              "--resume")
    assert bad.returncode == 3
    assert "needs more memory than the budget" in bad.stderr
    assert "Try a smaller --micro-batch" in bad.stderr
    assert (tmp_path / "ok" / "checkpoint").read_bytes() == before


def test_budget_below_parameters_fails_before_loading(tiny_artifact, tmp_path):
    x, y = tiny_data(8)
    np.savez(tmp_path / "d.npz", x=x, y=y)
    p = cli("personalise", tiny_artifact, "--data", tmp_path / "d.npz", "--budget", "1KiB",
            "--out", tmp_path / "r")
    assert p.returncode == 3
    assert "below the model's parameters" in p.stderr


def test_measure_capped_at_device_reports_within_budget(tiny_artifact):
    r = measure_json(tiny_artifact, "--device", "mcu-2mb")
    assert r["budget_bytes"] == 2 * 1024 * 1024
    assert r["peak_bytes"] <= r["budget_bytes"]


def test_plot_writes_the_timeline_and_the_graph(tiny_artifact, tmp_path):
    doc = measure_json(tiny_artifact, "--budget", "4MiB", "--plot", tmp_path / "plots")
    names = sorted(Path(p).name for p in doc["plots"])
    assert names == ["graph.png", "timeline.png"]
    for p in doc["plots"]:
        assert Path(p).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and Path(p).stat().st_size > 10_000
