"""Recompute written into the training graph: same gradients, fewer saved tensors."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from torch import nn

from conftest import device_python
from edgetrain.manifest import Plan, load_manifest
from exporters.export import export_artifact
from exporters.recompute import PLANNERS, _is_backward, analyse, make_plan


def chain(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    layers, c = [], 3
    for cout in (8, 8, 16, 16, 16, 16):
        layers += [nn.Conv2d(c, cout, 3, padding=1), nn.ReLU()]
        c = cout
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c, 4))


def export(tmp_path, planner: str):
    out = tmp_path / planner
    m = export_artifact(chain(), torch.zeros(2, 3, 12, 12), out, classes=list("abcd"),
                        plan=Plan(micro_batch=4), recompute=planner)
    return out, m


def one_step_gradients(art) -> dict:
    return device_python(f"""
import json, numpy as np
from edgetrain.runtime import DeviceRuntime
rt = DeviceRuntime({str(art)!r})
rng = np.random.default_rng(0)
x = rng.standard_normal((4, 3, 12, 12)).astype(np.float32); y = np.array([0, 1, 2, 3])
rt.train_micro_batch(x, y)
print(json.dumps({{t.name: rt.state.parameters[t.name].grad.tolist()
                  for t in rt.manifest.trainable}}))
""")


def test_sqrt_recompute_keeps_gradients_and_drops_saved_tensors(tmp_path):
    none_art, none_m = export(tmp_path, "none")
    sqrt_art, sqrt_m = export(tmp_path, "sqrt")
    assert none_m.plan.recomputed == ()
    assert sqrt_m.plan.recompute == "sqrt" and len(sqrt_m.plan.recomputed) > 0
    assert load_manifest(sqrt_art).plan == sqrt_m.plan  # recorded and round-trips
    graph = onnx.load(str(sqrt_art / "training_model.onnx")).graph
    copies = [n for n in graph.node if n.name.endswith("_recompute")]
    assert copies, "no recompute nodes written"
    # backward reads the copies, no longer the recomputed originals
    read_by_backward = {x for n in graph.node if _is_backward(n) for x in n.input}
    assert not set(sqrt_m.plan.recomputed) & read_by_backward
    assert {f"{t}_recompute" for t in sqrt_m.plan.recomputed} <= read_by_backward
    a, b = one_step_gradients(none_art), one_step_gradients(sqrt_art)
    for name in a:
        ga, gb = np.array(a[name]), np.array(b[name])
        assert np.abs(ga - gb).max() <= 1e-6 * max(1e-12, np.abs(ga).max()), name


@pytest.mark.parametrize("planner", sorted(PLANNERS))
def test_every_planner_makes_a_consistent_plan(tmp_path, planner):
    art, _ = export(tmp_path, "none")
    model = onnx.load(str(art / "training_model.onnx"))
    plan = make_plan(model, planner)
    fwd = analyse(model)
    assert set(plan.checkpoints) <= set(fwd.cuts)
    assert set(plan.recomputed) <= fwd.saved


def test_unknown_planner(tmp_path):
    art, _ = export(tmp_path, "none")
    with pytest.raises(ValueError, match="unknown recompute planner 'magic'"):
        make_plan(onnx.load(str(art / "training_model.onnx")), "magic")


@pytest.mark.slow
@pytest.mark.parametrize("name", ["mobilenet_v1", "patch_mobilenet", "resnet50"])
def test_seed_networks_keep_their_gradients_under_sqrt(tmp_path, name):
    """Every network the exporter builds, narrow and at 32x32 so the test stays quick."""
    from exporters.networks import build_network

    arts = {}
    for planner in ("none", "sqrt"):
        model, _ = build_network(name, 4, width=0.125)
        torch.manual_seed(0)
        for p in model.parameters():  # same weights for both exports
            torch.nn.init.normal_(p, std=0.1)
        arts[planner] = tmp_path / planner
        m = export_artifact(model, torch.zeros(2, 3, 32, 32), arts[planner],
                            classes=list("abcd"), plan=Plan(micro_batch=4), recompute=planner,
                            freeze_batchnorm=True)
        if planner == "sqrt":
            assert m.plan.recomputed, "sqrt recomputed nothing"
    code = """
import json, numpy as np
from edgetrain.runtime import DeviceRuntime
rt = DeviceRuntime({art!r})
rng = np.random.default_rng(0)
x = rng.standard_normal((4, 3, 32, 32)).astype(np.float32); y = np.array([0, 1, 2, 3])
rt.train_micro_batch(x, y)
print(json.dumps({{t.name: rt.state.parameters[t.name].grad.tolist()
                  for t in rt.manifest.trainable}}))
"""
    a, b = (device_python(code.format(art=str(arts[p]))) for p in ("none", "sqrt"))
    worst = max(float(np.abs(np.array(a[k]) - np.array(b[k])).max()
                      / max(1e-12, np.abs(np.array(a[k])).max())) for k in a)
    assert worst <= 1e-6, worst
