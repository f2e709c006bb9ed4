"""Convolution + frozen BatchNorm folded into one convolution (exporters/passes/convbn.py): which
layers fold, the graph it leaves, and gradients equal to torch's unfolded model."""
from __future__ import annotations

import numpy as np
import onnx
import torch
from torch import nn

from conftest import device_gradients
from edgetrain.manifest import Plan
from exporters.passes.convbn import fold_conv_batchnorms
from exporters.export import export_artifact
from exporters.models.norms import freeze_batchnorm_layers
from exporters.export.torchonnx import torch_to_onnx


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(),  # folds
        nn.Conv2d(8, 8, 3, padding=1, groups=8, bias=True), nn.BatchNorm2d(8), nn.ReLU(),  # folds
        nn.AvgPool2d(4),  # 8 x 8 -> 2 x 2
        nn.Conv2d(8, 64, 1), nn.BatchNorm2d(64), nn.ReLU(),  # 512 weights > 256 outputs: kept
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 3))


def _with_stats(model: nn.Module) -> nn.Module:
    """Running statistics and affine parameters away from their defaults, so a wrong fold
    shows in the values."""
    g = torch.Generator().manual_seed(1)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            with torch.no_grad():
                m.running_mean.copy_(torch.randn(m.num_features, generator=g))
                m.running_var.copy_(torch.rand(m.num_features, generator=g) + 0.5)
                m.weight.copy_(torch.randn(m.num_features, generator=g))
                m.bias.copy_(torch.randn(m.num_features, generator=g))
    return model


def test_fold_keeps_the_forward_values_and_skips_a_layer_whose_weight_outweighs_it():
    model = freeze_batchnorm_layers(_with_stats(_net()))
    x = torch.randn(1, 3, 8, 8)
    saved = {n: t.detach().clone() for n, t in
             list(model.named_parameters()) + list(model.named_buffers())}
    fwd = torch_to_onnx(model, x, saved)
    before = _logits(fwd, x)
    assert fold_conv_batchnorms(fwd, micro_batch=1) == 2
    convs = [n for n in fwd.graph.node if n.op_type == "Conv"]
    assert [len(n.input) for n in convs] == [3, 3, 3]  # the folded ones gained a bias
    readers = {i: n.op_type for n in fwd.graph.node for i in n.input}
    assert [readers[c.output[0]] for c in convs] == ["Relu", "Relu", "Mul"]
    np.testing.assert_allclose(_logits(fwd, x), before, rtol=1e-5, atol=1e-5)
    assert fold_conv_batchnorms(fwd, micro_batch=1) == 0  # nothing left to fold


def _logits(fwd: onnx.ModelProto, x: torch.Tensor) -> np.ndarray:
    import onnxruntime as ort

    s = ort.InferenceSession(fwd.SerializeToString(), providers=["CPUExecutionProvider"])
    return s.run(None, {s.get_inputs()[0].name: x.numpy()})[0]


def test_a_folded_artifact_trains_with_torch_gradients(tmp_path):
    model = _with_stats(_net())
    m = export_artifact(model, torch.zeros(2, 3, 8, 8), tmp_path / "art", classes=["a", "b", "c"],
                        model_name="convbn", plan=Plan(micro_batch=4), freeze_batchnorm=True)
    assert m.provenance["passes"]["fold_conv_batchnorms"] == 2
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 3, 8, 8)).astype(np.float32)
    y = rng.integers(0, 3, 4)
    out = device_gradients(tmp_path / "art", x, y)
    ref = freeze_batchnorm_layers(model)
    loss = nn.functional.cross_entropy(ref(torch.from_numpy(x)), torch.from_numpy(y))
    loss.backward()
    assert abs(out["loss"] - loss.item()) < 1e-4
    params = dict(ref.named_parameters())
    assert set(out["grads"]) == set(params)
    for name, p in params.items():  # the folded layers' weights, scales and shifts included
        g = p.grad.numpy()
        assert np.abs(np.array(out["grads"][name]) - g).max() <= 1e-6 + 1e-4 * np.abs(g).max(), name


def test_a_frozen_weight_keeps_its_batchnorm_pair(tmp_path):
    """Under `head` (the convolutions frozen) nothing folds: folded, ORT would hold a scaled
    copy of each frozen weight as a constant; under `bias` the scale's gradient would need
    the convolution's weight gradient."""
    for update in ("head", "bias"):
        m = export_artifact(_with_stats(_net()), torch.zeros(2, 3, 8, 8), tmp_path / update,
                            classes=["a", "b", "c"], model_name="convbn",
                            plan=Plan(micro_batch=4), freeze_batchnorm=True, update=update)
        assert m.provenance["passes"]["fold_conv_batchnorms"] == 0, update
