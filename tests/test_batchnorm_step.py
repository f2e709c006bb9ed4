"""RESET over a step of several micro-batches (Plan.batchnorm_adapt "batch", accumulation k):
each batch estimate is the one of the micro-batch x k samples the step stands for, built from
the moments graph one layer per pass, so a plan that micro-batches to fit a smaller device
adapts its statistics exactly as the plan it stands for does."""
from __future__ import annotations

import numpy as np

from conftest import device_python
from test_batchnorm_exact import export, reset_refused, samples

STATS = ("bn_early.running_mean", "bn_early.running_var", "bn_late.running_mean",
         "bn_late.running_var")


def statistics(artifact, x_path, micro_batch: int, group: int) -> dict:
    return device_python(f"""
import json, numpy as np
from edgetrain.runtime import DeviceRuntime
rt = DeviceRuntime({str(artifact)!r}, budget_bytes=8 << 20)
rt.set_micro_batch({micro_batch})
rt.preflight(batchnorm_stats=True, batchnorm_group={group})
x = np.load({str(x_path)!r})
b = {micro_batch}
n = rt.reset_batchnorm(lambda: (x[i:i + b] for i in range(0, len(x) // b * b, b)), {group})
p = rt.state.parameters
print(json.dumps(dict(n=n, **{{k: p[k].data.tolist() for k in {STATS!r}}})))
""")


def test_reset_over_a_step_equals_reset_at_the_step_batch(tmp_path):
    """Micro-batch 2 x 3 gives what RESET at batch 6 gives (and torch's training mode at 6,
    momentum None); a partial last step (14 samples: 2 left over) is left out as RESET leaves
    out a partial batch."""
    import torch

    model, m = export(tmp_path / "art", "batch", micro_batch=2)
    assert {"batchnorm_stats_model", "batchnorm_moments_model"} <= set(m.files)
    x = samples(14)
    np.save(tmp_path / "x.npy", x)
    whole = statistics(tmp_path / "art", tmp_path / "x.npy", 6, 1)
    step = statistics(tmp_path / "art", tmp_path / "x.npy", 2, 3)
    assert whole["n"] == 2 and step["n"] == 2 * 2 * 3  # layers x micro-batches of 2 steps
    for bn in (model.bn_early, model.bn_late):
        bn.momentum = None
        bn.reset_running_stats()
    model.train()
    with torch.no_grad():
        for i in range(0, 12, 6):
            model(torch.from_numpy(x[i:i + 6]))
    for name in STATS:
        layer, stat = name.split(".")
        want = getattr(getattr(model, layer), stat).numpy()
        np.testing.assert_allclose(whole[name], want, rtol=1e-4, atol=1e-5, err_msg=name)
        np.testing.assert_allclose(step[name], want, rtol=1e-4, atol=1e-5, err_msg=name)
    # one micro-batch per estimate differs: what the step's estimate is there for
    single = statistics(tmp_path / "art", tmp_path / "x.npy", 2, 1)
    assert not np.allclose(single["bn_late.running_var"], whole["bn_late.running_var"],
                           rtol=1e-3)


def test_an_older_moments_graph_without_counts_is_refused_for_a_step(tmp_path):
    """A moments graph resealed without one layer's element count (its metadata) serves the
    exact estimate but not RESET over a step: a clear ArtifactError naming the layer,
    statistics untouched."""
    import onnx

    from test_bad_input import reseal

    export(tmp_path / "art", "batch", micro_batch=2)
    path = tmp_path / "art" / "batchnorm_moments_model.onnx"
    g = onnx.load(path)
    kept = [p for p in g.metadata_props if p.key != "bn_late.elements"]
    assert len(kept) == len(g.metadata_props) - 1
    del g.metadata_props[:]
    g.metadata_props.extend(kept)
    onnx.save(g, path)
    reseal(tmp_path / "art", "batchnorm_moments_model")
    out = reset_refused(tmp_path / "art", "rt.reset_batchnorm(lambda: [x[:2], x[2:4]], 2)")
    assert "bn_late" in out["said"] and "re-export" in out["said"] and out["same"]


def test_the_statistics_pass_fits_where_the_preflight_did(tiny_artifact, tmp_path):
    """With label-free adaptation the preflight runs the statistics graph and the step: a
    budget one arena chunk below what `measure --adapt bn` measures fails there, before any
    step or file; at the measured peak the whole run fits."""
    import json

    from conftest import cli, tiny_data

    x, y = tiny_data(32, seed=3)
    np.savez(tmp_path / "d.npz", x=x, y=y)
    m = cli("measure", tiny_artifact, "--batch", "4", "--adapt", "bn", "--json")
    assert m.returncode == 0, m.stderr
    peak = json.loads(m.stdout)["peak_bytes"]
    runs = {}
    for budget in (peak, peak - 256):
        out = tmp_path / f"run-{budget}"
        runs[budget] = (cli("personalise", tiny_artifact, "--data", tmp_path / "d.npz",
                            "--budget", budget, "--adapt", "bn", "--epochs", "1",
                            "--out", out, "--json"), out)
    ok, _ = runs[peak]
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["measured_peak_bytes"] <= peak
    short, out = runs[peak - 256]
    assert short.returncode == 3 and "Traceback" not in short.stderr, short.stderr
    assert not out.exists() or not any(out.iterdir())
