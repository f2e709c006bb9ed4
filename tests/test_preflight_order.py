"""Which runs first where a run adapts BatchNorm (Plan.preflight_order, exporters/plans/
preflight.py): the exporter writes the order of the lower predicted peak, the runtime runs it,
and each order's cycle is predicted as the allocator measures it."""
from __future__ import annotations

import json
import shutil

import pytest

from conftest import cli, device_python
from edgetrain.manifest import PREFLIGHT_ORDERS, load_manifest
from exporters.plans.preflight import order_peaks
from test_batchnorm_exact import CLASSES, SHAPE, two_norm_model


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    """The two-norm 1-D CNN at micro-batch 2 x 2 (the statistics pass runs the moments
    graph, once per layer and micro-batch)."""
    import torch

    from edgetrain.manifest import Plan
    from exporters.export import export_artifact

    out = tmp_path_factory.mktemp("preflight") / "art"
    export_artifact(two_norm_model(), torch.zeros(2, *SHAPE), out, classes=CLASSES,
                    plan=Plan(micro_batch=2, accumulation_steps=2), model_name="two-norm")
    return out


def with_order(artifact, out, order: str):
    """A copy of `artifact` whose plan says `order` (the manifest is not among the files it
    hashes: what ORT reads is unchanged)."""
    shutil.copytree(artifact, out)
    d = json.loads((out / "manifest.json").read_text())
    d["plan"]["preflight_order"] = order
    (out / "manifest.json").write_text(json.dumps(d))
    return out


def test_the_export_writes_the_order_of_the_lower_prediction(artifact):
    m = load_manifest(artifact)
    peaks = m.predicted["preflight_orders"]
    assert set(peaks) == set(PREFLIGHT_ORDERS) and all(isinstance(p, int) for p in peaks.values())
    assert peaks[m.plan.preflight_order] == min(peaks.values())
    assert peaks == order_peaks(artifact, m)


def test_each_order_is_predicted_as_the_allocator_measures_it(tmp_path):
    """mcu-1mb's plan (imu_cnn's head at micro-batch 2 x 4, one thread), untrained: each
    order's measured cycle with the statistics pass is its prediction to within 1%, and the
    exporter chose the step first, which measures lower."""
    out = tmp_path / "imu"
    r = cli("export", "--model", "imu_cnn", "--update", "head", "--micro-batch", "2",
            "--accumulate", "4", "--threads", "1", "--epochs", "0", "--out", out, "--json")
    assert r.returncode == 0, r.stderr
    m = load_manifest(out)
    assert m.plan.preflight_order == "step-first"
    measured = {}
    for order in PREFLIGHT_ORDERS:
        art = with_order(out, tmp_path / order, order)
        r = cli("measure", art, "--batch", "2", "--adapt", "bn", "--json")
        assert r.returncode == 0, r.stderr
        d = json.loads(r.stdout)
        assert d["predicted_peak_bytes"] == m.predicted["preflight_orders"][order]
        assert abs(d["predicted_peak_bytes"] - d["peak_bytes"]) <= 0.01 * d["peak_bytes"]
        measured[order] = d["peak_bytes"]
    assert measured["step-first"] < measured["statistics-first"]


def test_an_unknown_order_is_refused_before_anything_runs(artifact, tmp_path):
    art = with_order(artifact, tmp_path / "art", "sideways")
    r = cli("measure", art, "--batch", "2", "--adapt", "bn", "--json")
    assert r.returncode == 2, r.stderr
    assert "preflight_order" in r.stderr and "sideways" in r.stderr
    assert "Traceback" not in r.stderr


def test_side_graph_outputs_hold_no_arena_memory(artifact):
    """A side run's outputs are copies: ORT's own arrays would keep their arena chunks while
    the next run allocates (the grouped RESET keeps each run's moments), splitting the free
    space it takes."""
    d = device_python(f"""
import json, numpy as np
from edgetrain import names
from edgetrain.runtime import DeviceRuntime
rt = DeviceRuntime({str(artifact)!r}, budget_bytes=8 << 20)
x = np.zeros((2, *rt.manifest.input.sample_shape), np.float32)
outs = rt.side.run(names.BATCHNORM_MOMENTS_MODEL, {{rt.manifest.input.name: x}}, "a test")
print(json.dumps(dict(n=len(outs), own=all(v.flags.owndata for v in outs.values()))))
""")
    assert d["n"] > 0 and d["own"]
