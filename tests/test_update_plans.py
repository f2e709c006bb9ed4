"""Update plans (exporters/plans/updateplans.py): what trains, what it costs, and that nothing else moves.

A small 1-D CNN (two conv blocks with BatchNorm frozen into an affine map, as shipped networks
are, and a classifier) is exported under several plans. Gradients of the trained tensors must
equal torch's; frozen tensors must leave personalisation bit for bit; gradient and optimizer
bytes must be what the trained tensors' shapes say.
"""
from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
import torch
from torch import nn

from conftest import cli, device_python
from exporters.plans.updateplans import resolve

CLASSES = ["a", "b", "c"]
SAMPLE = (6, 32)  # channels x time, like a raw IMU window


def small_cnn() -> nn.Module:
    torch.manual_seed(0)

    class Small(nn.Module):
        def __init__(self):
            super().__init__()
            self.block1 = nn.Sequential(nn.Conv1d(6, 8, 5, padding=2, bias=False),
                                        nn.BatchNorm1d(8), nn.ReLU())
            self.block2 = nn.Sequential(nn.Conv1d(8, 8, 5, stride=2, padding=2, bias=False),
                                        nn.BatchNorm1d(8), nn.ReLU())
            self.classifier = nn.Linear(8, len(CLASSES))

        def forward(self, x):  # [B, 6, T] -> [B, 3]
            return self.classifier(self.block2(self.block1(x)).mean(dim=2))

    m = Small()
    with torch.no_grad():  # statistics that are not the identity, as after pretraining
        for bn in (m.block1[1], m.block2[1]):
            bn.running_mean.uniform_(-0.5, 0.5)
            bn.running_var.uniform_(0.5, 2.0)
    return m.eval()


def export(tmp_path, update: str, micro_batch: int = 4):
    from edgetrain.manifest import Plan
    from exporters.export import export_artifact

    model = small_cnn()
    m = export_artifact(model, torch.zeros(2, *SAMPLE), tmp_path / update.replace(":", "-"),
                        classes=CLASSES, plan=Plan(micro_batch=micro_batch), lr=1e-2,
                        freeze_batchnorm=True, update=update, layout="CT")
    return model, m


def data(n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, len(CLASSES), n)
    x = rng.normal(0, 0.5, (n, *SAMPLE)).astype(np.float32)
    x[np.arange(n), y] += 1.0
    return x, y.astype(np.int64)


BLOCK2 = ["block2.0.weight", "block2.1.weight", "block2.1.bias"]
HEAD = ["classifier.weight", "classifier.bias"]


@pytest.mark.parametrize("update, trained", [
    ("all", ["block1.0.weight", "block1.1.weight", "block1.1.bias", *BLOCK2, *HEAD]),
    ("head", HEAD),
    ("last:2", BLOCK2 + HEAD),
    ("bias", ["block1.1.weight", "block1.1.bias", "block2.1.weight", "block2.1.bias",
              "classifier.bias"]),
    ("head,block1.1", ["block1.1.weight", "block1.1.bias", *HEAD]),
])
def test_plans_choose_the_tensors_and_backward_stops_at_the_lowest(tmp_path, update, trained):
    _, m = export(tmp_path, update)
    assert sorted(t.name for t in m.trainable) == sorted(trained)
    assert m.plan.update == update
    assert not {t.name for t in m.trainable} & {t.name for t in m.frozen}
    graph = onnx.load(str(tmp_path / update.replace(":", "-") / m.files["training_model"].path))
    # backward reaches a convolution only when it or something below it trains (a frozen
    # one's input gradient is a ConvTranspose: exporters/passes/frozenconvgrad.py)
    grads = [n.op_type for n in graph.graph.node if n.op_type in ("ConvGrad", "ConvTranspose")]
    assert len(grads) == {"all": 2, "head": 0, "last:2": 1, "bias": 1, "head,block1.1": 1}[update]
    # gradients and moments: exactly the trained tensors' bytes, in 256-byte arena chunks
    chunk = lambda n: -(-n // 256) * 256  # noqa: E731
    expected = sum(chunk(t.nbytes) for t in m.trainable)
    assert m.predicted["breakdown"]["gradients"] == expected
    assert m.predicted["breakdown"]["optimizer_state"] == 2 * expected


def test_resolve_orders_layers_by_the_graph_and_refuses_what_it_cannot_read():
    shapes = {"emb": (4, 4), "a.w": (4, 4), "a.b": (4,), "norm.w": (4,), "head.w": (3, 4),
              "head.b": (3,)}
    use = {"emb": 0, "a.w": 5, "a.b": 5, "norm.w": 7, "head.w": 9, "head.b": 9}
    assert resolve("head", shapes, use) == ["head.w", "head.b"]
    assert resolve("last:2", shapes, use) == ["a.w", "a.b", "norm.w", "head.w", "head.b"]
    assert resolve("last:99", shapes, use) == list(shapes)
    assert resolve("bias", shapes, use) == ["a.b", "norm.w", "head.b"]
    named = {"conv.weight": (4, 2, 3), "conv.bias": (4,), "bn.weight": (4,), "bn.bias": (4,),
             "fc.weight": (3, 4), "fc.bias": (3,)}
    assert resolve("bias-only", named, dict.fromkeys(named, 0)) == [
        "conv.bias", "bn.bias", "fc.bias"]  # a norm's scale (bn.weight) is not a bias
    assert resolve("a, head", shapes, use) == ["a.w", "a.b", "head.w", "head.b"]
    for bad, says in [("last:0", "at least 1"), ("last:x", "whole number"), ("", "empty"),
                      ("head,", "empty"), ("nosuch", "neither a plan")]:
        with pytest.raises(ValueError, match=says):
            resolve(bad, shapes, use)


@pytest.mark.parametrize("update", ["last:2", "bias"])
def test_gradients_of_trained_tensors_equal_torchs(tmp_path, update):
    model, m = export(tmp_path, update, micro_batch=6)
    x, y = data(6, seed=1)
    np.savez(tmp_path / "batch.npz", x=x, y=y)
    trained = [t.name for t in m.trainable]
    for n, p in model.named_parameters():
        p.requires_grad_(n in trained)
    loss = nn.functional.cross_entropy(model.eval()(torch.from_numpy(x)), torch.from_numpy(y))
    loss.backward()
    out = device_python(f"""
import json, numpy as np
from edgetrain.runtime import DeviceRuntime
rt = DeviceRuntime({str(tmp_path / update.replace(':', '-'))!r})
z = np.load({str(tmp_path / 'batch.npz')!r})
loss = rt.train_micro_batch(z['x'], z['y'])
P = rt.state.parameters
print(json.dumps({{'loss': loss, 'grads': {{t.name: P[t.name].grad.tolist()
                                          for t in rt.manifest.trainable}}}}))
""")
    assert abs(out["loss"] - loss.item()) < 1e-5
    assert sorted(out["grads"]) == sorted(trained)
    for n, p in model.named_parameters():
        if n in trained:
            np.testing.assert_allclose(np.array(out["grads"][n]), p.grad.numpy(), rtol=1e-4,
                                       atol=1e-6, err_msg=n)
            assert np.abs(p.grad.numpy()).max() > 0  # not vacuous


def test_frozen_tensors_leave_personalisation_bit_for_bit(tmp_path):
    _, m = export(tmp_path, "last:2")
    x, y = data(24)
    np.savez(tmp_path / "train.npz", x=x, y=y)
    p = cli("personalise", tmp_path / "last-2", "--data", tmp_path / "train.npz", "--budget",
            "8MiB", "--no-select", "--epochs", "2", "--out", tmp_path / "run", "--json")
    assert p.returncode == 0, p.stderr
    out = device_python(f"""
import json
from onnxruntime.training.api import CheckpointState
a = CheckpointState.load_checkpoint({str(tmp_path / 'last-2' / m.files['checkpoint'].path)!r})
b = CheckpointState.load_checkpoint({str(tmp_path / 'run' / 'checkpoint')!r})
print(json.dumps({{n: [a.parameters[n].data.tobytes().hex(), b.parameters[n].data.tobytes().hex()]
                  for n in {[t.name for t in m.trainable + m.frozen]!r}}}))
""")
    frozen = {t.name for t in m.frozen}
    moved = [n for n, (before, after) in out.items() if before != after]
    assert frozen and not frozen & set(moved), moved
    assert set(moved) == {t.name for t in m.trainable}  # and what trains did move


@pytest.mark.slow
def test_export_cli_takes_a_plan_and_refuses_a_bad_one(tmp_path):
    p = cli("export", "--model", "imu_cnn", "--update", "nosuch.layer", "--epochs", "1",
            "--out", tmp_path / "art")
    assert p.returncode == 2, p.stderr
    assert "nosuch.layer" in p.stderr and "Traceback" not in p.stderr
    assert not (tmp_path / "art").exists()


def test_search_takes_the_best_gain_that_fits_and_says_when_nothing_fits():
    from types import SimpleNamespace

    from edgetrain.budget import BudgetError
    from exporters.plans.updatesearch import UpdateScore, candidate_plans, search

    assert candidate_plans(5) == ["head", "bias-only", "bias-only,head", "bias", "bias,head",
                                  "last:2", "last:3", "last:4", "bias,last:2", "bias,last:3",
                                  "bias,last:4", "all"]
    peaks = {"head": 100, "bias-only": 250, "bias-only,head": 260, "bias": 300,
             "bias,head": 310, "last:2": 200, "last:3": 290, "bias,last:2": 320, "all": 400}
    gains = {("head",): 1.0, ("last:2",): 2.5, ("last:3",): 2.5, ("bias",): 9.0}

    def export_one(update, folder):  # a plan -> its (fake) manifest
        same = {"last:4": "all", "bias,last:3": "all", "bias,last:4": "all"}.get(update, update)
        return SimpleNamespace(trainable=[SimpleNamespace(name=same)], trainable_bytes=1,
                               predicted={"peak_bytes": peaks[same], "complete": True})

    r = search(export_one, 5, 295, UpdateScore(lambda names: gains.get(names, 0.0), (1, 2)))
    assert r.chosen == "last:2"  # 2.5 ties last:3; the smaller peak wins; bias (9.0) is over
    # plans that train the same tensors count once (the first name kept)
    assert [c.update for c in r.candidates] == ["head", "bias-only", "bias-only,head", "bias",
                                                "bias,head", "last:2", "last:3", "last:4",
                                                "bias,last:2"]
    assert {c.update: c.fits for c in r.candidates}["bias"] is False
    assert r.inner_users == (1, 2)
    with pytest.raises(BudgetError, match="smallest predicted peak is 100 bytes .plan head"):
        search(export_one, 5, 99, UpdateScore(lambda names: 0.0, (1, 2)))


@pytest.mark.slow
def test_export_update_auto_chooses_a_plan_that_fits_and_measures_it(tmp_path):
    p = cli("export", "--model", "imu_cnn", "--epochs", "1", "--update", "auto", "--budget",
            "1.1MiB", "--out", tmp_path / "art", "--json")
    assert p.returncode == 0, p.stderr
    m = json.loads(p.stdout)
    search = m["provenance"]["update_search"]
    assert m["plan"]["update"] == search["chosen"] == "head"  # the only plan under 1.1 MiB
    assert search["measured_peak_bytes"] <= search["budget_bytes"] == int(1.1 * 2**20)
    chosen = next(c for c in search["candidates"] if c["update"] == "head")
    assert abs(search["measured_peak_bytes"] / chosen["predicted_peak_bytes"] - 1) < 0.05
    assert all(c["gain_points"] is None for c in search["candidates"] if not c["fits"])


def test_sparse_layers_follow_the_plan_and_frozen_ones_take_no_mask_update(tmp_path):
    """A masked layer is ordered where its layer runs (not where its values are scattered
    into the dense weight), trains as its values when the plan picks it, and stays frozen
    otherwise: no mask-gradient graph for it, and mask updates are refused with the reason."""
    from edgetrain.manifest import Plan
    from exporters.export import export_artifact

    def sparse(update):
        return export_artifact(small_cnn(), torch.zeros(2, *SAMPLE), tmp_path / update,
                               classes=CLASSES, plan=Plan(micro_batch=4), lr=1e-2,
                               freeze_batchnorm=True, update=update, layout="CT", density=0.5)

    head = sparse("head")
    assert [m.weight for m in head.masks] == ["block1.0.weight", "block2.0.weight"]
    assert [t.name for t in head.trainable] == HEAD
    assert head.trained_masks == () and "mask_grad_model" not in head.files
    last2 = sparse("last:2")
    assert [t.name for t in last2.trainable] == ["block2.0.weight_values", "block2.1.weight",
                                                 "block2.1.bias", *HEAD]
    assert [m.weight for m in last2.trained_masks] == ["block2.0.weight"]
    assert "mask_grad_model" in last2.files
    x, y = data(24)
    np.savez(tmp_path / "train.npz", x=x, y=y)
    args = ["--data", tmp_path / "train.npz", "--budget", "8MiB", "--no-select", "--epochs", "1"]
    ok = cli("personalise", tmp_path / "head", *args, "--out", tmp_path / "r1")
    assert ok.returncode == 0, ok.stderr
    refused = cli("personalise", tmp_path / "head", *args, "--mask-update", "rigl",
                  "--out", tmp_path / "r2")
    assert refused.returncode == 2 and "freezes every one" in refused.stderr
    grown = cli("personalise", tmp_path / "last:2", *args, "--mask-update", "rigl",
                "--mask-every", "1", "--out", tmp_path / "r3")
    assert grown.returncode == 0, grown.stderr
