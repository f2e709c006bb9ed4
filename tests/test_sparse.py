"""Sparse masks: the artifact holds kept values only, ORT trains them like torch, bytes shrink."""
from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
import torch
from torch import nn

from conftest import cli, device_gradients
from edgetrain import names
from edgetrain.budget import arena_rounded
from edgetrain.manifest import Plan, load_manifest
from exporters.export import export_artifact
from exporters.passes.scatterindices import int32_scatter_indices
from exporters.plans.sparse import ALLOCATIONS, INITS, dense_weight, sparsify


def net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(),
                         nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 4))


@pytest.mark.parametrize("allocation", sorted(ALLOCATIONS))
@pytest.mark.parametrize("init", sorted(INITS))
def test_every_allocation_and_init_hits_the_density(allocation, init):
    model, masks = sparsify(net(), 0.2, allocation, init)
    dense_total = sum(p.numel() for n, p in net().named_parameters() if n.endswith("weight"))
    kept = sum(m.nnz for m in masks) + sum(
        p.numel() for n, p in model.named_parameters() if n.endswith(".weight"))
    assert abs(kept / dense_total - 0.2) < 0.01
    state = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    for m in masks:
        w = dense_weight(state[m.values], state[m.positions], m.shape)
        assert w.shape == m.shape and int((w != 0).sum()) <= m.nnz  # nothing off the mask
        assert len(set(state[m.positions].tolist())) == m.nnz  # positions distinct


def test_cli_offers_exactly_the_registries():
    from edgetrain.cli import export

    choices = {o.name: o.type.choices for o in export.params if o.name.startswith("mask_")}
    assert sorted(choices["mask_allocation"]) == sorted(ALLOCATIONS)
    assert sorted(choices["mask_init"]) == sorted(INITS)


def test_global_allocation_is_one_magnitude_threshold():
    original = net()
    model, masks = sparsify(original, 0.3, "global", "magnitude")
    kept = torch.cat([model.get_submodule(m.weight.removesuffix(".weight")).weight_values.abs()
                      for m in masks])
    dropped = torch.cat([
        w.detach().abs().reshape(-1)[np.setdiff1d(
            np.arange(w.numel()),
            model.get_submodule(m.weight.removesuffix(".weight")).weight_positions.long().numpy())]
        for m in masks for w in [original.get_submodule(m.weight.removesuffix(".weight")).weight]])
    assert kept.min() >= dropped.max()


def test_magnitude_init_keeps_the_largest_weights():
    original = net()
    model, masks = sparsify(original, 0.3, "uniform", "magnitude")
    w = original[2].weight.detach().abs().reshape(-1)
    kept = model[2].weight_positions.long()
    assert w[kept].min() >= w[np.setdiff1d(np.arange(w.numel()), kept.numpy())].max()


def test_unknown_allocation_init_and_bad_density():
    with pytest.raises(ValueError, match="unknown mask allocation 'dense-ish'"):
        sparsify(net(), 0.5, "dense-ish")
    with pytest.raises(ValueError, match="unknown mask initialisation 'oracle'"):
        sparsify(net(), 0.5, "erk", "oracle")
    with pytest.raises(ValueError, match=r"density must be in \(0, 1\]"):
        sparsify(net(), 0.0)


def test_ort_gradients_of_kept_values_equal_torch(tmp_path):
    m = export_artifact(net(), torch.zeros(2, 3, 8, 8), tmp_path / "a", classes=list("abcd"),
                        plan=Plan(micro_batch=4), density=0.25, mask_allocation="uniform")
    assert {k.weight for k in m.masks} == {"0.weight", "2.weight", "6.weight"}
    assert load_manifest(tmp_path / "a").masks == m.masks
    # the scatters read the stored int32 positions: no cast to int64 is left in the graph
    # but those MaxUnpool needs (exporters/passes/densebuild.py), one per dense-weight build
    assert m.provenance["passes"]["int32_scatter_indices"] == 3
    train = onnx.load(tmp_path / "a" / m.files[names.TRAINING_MODEL].path)
    casts = [n for n in train.graph.node if n.op_type == "Cast" and
             helper.get_attribute_value(n.attribute[0]) == TensorProto.INT64]
    unpools = [n for n in train.graph.node if n.op_type == "MaxUnpool"]
    assert len(casts) == len(unpools) == m.provenance["passes"]["dense_builds"] >= 3
    assert all(c.name.endswith("_unpool/Cast") for c in casts)
    model, _ = sparsify(net(), 0.25, "uniform")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 3, 8, 8)).astype(np.float32)
    y = np.array([0, 1, 2, 3])
    loss = nn.functional.cross_entropy(model(torch.from_numpy(x)), torch.from_numpy(y))
    loss.backward()
    out = device_gradients(tmp_path / "a", x, y)
    assert abs(out["loss"] - loss.item()) < 1e-5
    for name, p in model.named_parameters():
        assert np.array(out["grads"][name]).shape == tuple(p.shape)
        np.testing.assert_allclose(out["grads"][name], p.grad.numpy(), rtol=1e-4, atol=1e-6,
                                   err_msg=name)


def test_trainable_state_bytes_scale_with_kept_weights(tmp_path):
    """Measured by ORT's allocator, asserted from shapes x itemsize."""
    breakdown = {}
    for density in (1.0, 0.1):
        art = tmp_path / str(density)
        m = export_artifact(net(), torch.zeros(2, 3, 8, 8), art, classes=list("abcd"),
                            plan=Plan(micro_batch=4), density=density,
                            mask_allocation="uniform")
        p = cli("measure", art, "--batch", "4", "--json")
        assert p.returncode == 0, p.stderr
        b = json.loads(p.stdout)["breakdown"]
        trained = sum(arena_rounded(t.nbytes) for t in m.trainable)
        assert b["gradients"] == trained and b["optimizer_state"] == 2 * trained
        assert b["parameters"] == trained + sum(arena_rounded(t.nbytes) for t in m.frozen)
        breakdown[density] = b
    state = {d: b["parameters"] + b["gradients"] + b["optimizer_state"]
             for d, b in breakdown.items()}
    assert state[0.1] < 0.3 * state[1.0]


def _scatter_graph(extra_reader: bool) -> onnx.ModelProto:
    pos = "w" + names.MASK_POSITIONS_SUFFIX
    nodes = [helper.make_node("Cast", [pos], ["p64"], to=TensorProto.INT64),
             helper.make_node("ScatterElements", ["zeros", "p64", "v"], ["dense"], axis=0)]
    outs = [helper.make_tensor_value_info("dense", TensorProto.FLOAT, [6])]
    if extra_reader:  # the int64 tensor read as data, not as indices: the cast must stay
        nodes.append(helper.make_node("Neg", ["p64"], ["n"]))
        outs.append(helper.make_tensor_value_info("n", TensorProto.INT64, [2]))
    ins = [helper.make_tensor_value_info("zeros", TensorProto.FLOAT, [6]),
           helper.make_tensor_value_info(pos, TensorProto.INT32, [2]),
           helper.make_tensor_value_info("v", TensorProto.FLOAT, [2])]
    return helper.make_model(helper.make_graph(nodes, "g", ins, outs),
                             opset_imports=[helper.make_opsetid("", 17)])


def test_int32_indices_scatter_the_same_values_and_other_casts_stay():
    import onnxruntime as ort

    feed = {"zeros": np.zeros(6, np.float32), "w" + names.MASK_POSITIONS_SUFFIX:
            np.array([1, 4], np.int32), "v": np.array([2.5, -1.0], np.float32)}
    m = _scatter_graph(False)
    before = ort.InferenceSession(m.SerializeToString()).run(None, feed)[0]
    assert int32_scatter_indices(m) == 1
    assert [n.op_type for n in m.graph.node] == ["ScatterElements"]
    after = ort.InferenceSession(m.SerializeToString()).run(None, feed)[0]
    np.testing.assert_array_equal(after, before)
    np.testing.assert_array_equal(after, [0, 2.5, 0, 0, -1.0, 0])
    kept = _scatter_graph(True)
    assert int32_scatter_indices(kept) == 0
    assert [n.op_type for n in kept.graph.node] == ["Cast", "ScatterElements", "Neg"]


def test_eval_graph_builds_each_dense_weight_after_its_layer_input(tmp_path):
    """The inference check runs the model exported from the eval graph: each masked weight's
    zeros come from its layer's input shape, so ORT cannot build every weight up front."""
    m = export_artifact(net(), torch.zeros(2, 3, 8, 8), tmp_path / "a", classes=list("abcd"),
                        plan=Plan(micro_batch=2), density=0.25, mask_allocation="uniform")
    g = onnx.load(tmp_path / "a" / m.files[names.EVAL_MODEL].path).graph
    producer = {o: n for n in g.node for o in n.output}
    expands = [producer[n.input[0]] for n in g.node if n.op_type == "ScatterElements"]
    assert len(expands) == len(m.masks) == 3
    for e in expands:
        chain, t = [], e.input[0]
        while t in producer and (not chain or chain[-1].op_type != "Shape"):
            chain.append(producer[t])
            t = producer[t].input[0]
        assert [n.op_type for n in chain] == ["Mul", "Cast", "Shape"]
        # the Shape reads an activation (the graph input for the first layer), not a weight
        assert t in producer or t in {i.name for i in g.input} - {i.name for i in g.initializer}
