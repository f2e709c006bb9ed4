"""Frozen layers keep no float input for backward (issue 40): a frozen-weight convolution's
input gradient is a ConvTranspose of dY (exporters/passes/frozenconvgrad.py), and a ReLU
output only its gradient reads is kept as a 1-byte mask (exporters/passes/relugrad.py). The
rewrites compute ORT's values, leave what they cannot prove alone, and give torch's gradients
inside an exported artifact."""
from __future__ import annotations

import itertools

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from conftest import device_gradients
from exporters.passes.frozenconvgrad import output_padding, rewrite_frozen_conv_grads


def conv_grad_model(x_shape, channels, kernel, stride, pads, dilation, group, outputs):
    """A graph of one ConvGrad (its outputs named by `outputs`, "" for one not wanted) and a
    random feed for it."""
    rank = len(kernel)
    y_side = [(s + pads[i] + pads[i + rank] - dilation * (k - 1) - 1) // stride + 1
              for i, (s, k) in enumerate(zip(x_shape[2:], kernel))]
    shapes = {"dy": [x_shape[0], channels, *y_side], "x": list(x_shape),
              "w": [channels, x_shape[1] // group, *kernel]}
    io = [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in shapes.items()]
    out_shapes = {"dx": shapes["x"], "dw": shapes["w"], "db": [channels]}
    outs = [helper.make_tensor_value_info(o, TensorProto.FLOAT, out_shapes[o])
            for o in outputs if o]
    node = helper.make_node("ConvGrad", ["dy", "x", "w"], list(outputs), domain="com.microsoft",
                            name="g", group=group, kernel_shape=list(kernel), pads=list(pads),
                            strides=[stride] * rank, dilations=[dilation] * rank)
    m = helper.make_model(helper.make_graph([node], "g", io, outs), opset_imports=[
        helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    rng = np.random.default_rng(2)
    return m, {k: rng.standard_normal(v).astype(np.float32) for k, v in shapes.items()}


def _run(model, feed):
    s = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return s.run(None, {k: v for k, v in feed.items()
                        if k in {i.name for i in model.graph.input}})


@pytest.mark.parametrize("x_shape, channels, kernel, stride, pads, dilation, group", [
    ((2, 6, 101), 16, (5,), 2, (2, 2), 1, 1),  # a strided 1-D layer: one row left unread
    ((2, 6, 100), 16, (5,), 2, (2, 2), 1, 1),  # the same, every row read
    ((3, 8, 33), 8, (3,), 1, (1, 1), 2, 8),  # depthwise, dilated
    ((1, 4, 17, 18), 6, (3, 5), 2, (1, 0, 2, 1), 1, 2),  # 2-D, grouped, uneven padding
    ((2, 16, 15, 15), 16, (3, 3), 2, (1, 1, 1, 1), 1, 16),  # MobileNet's strided depthwise
])
@pytest.mark.parametrize("outputs", [("dx", ""), ("dx", "", "db"), ("", "", "db")])
def test_the_rewrite_computes_conv_grads_values_without_x(x_shape, channels, kernel, stride,
                                                          pads, dilation, group, outputs):
    m, feed = conv_grad_model(x_shape, channels, kernel, stride, pads, dilation, group, outputs)
    before = _run(m, feed)
    assert rewrite_frozen_conv_grads(m) == 1
    assert "ConvGrad" not in {n.op_type for n in m.graph.node}
    assert all("x" not in n.input for n in m.graph.node)  # nothing reads the input any more
    m.graph.input.remove(next(i for i in m.graph.input if i.name == "x"))
    for a, b in zip(_run(m, feed), before):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_output_padding_restores_the_rows_a_stride_drops():
    # 101 samples, kernel 5, stride 2, padding 2: 51 outputs reach sample 100; 100 samples
    # give 50 outputs reaching sample 99 with one row of padding unread: 0 and 1 extra rows
    assert output_padding([101], [5], [2], [2, 2], [1]) == [0]
    assert output_padding([100], [5], [2], [2, 2], [1]) == [1]


def test_a_conv_grad_with_a_weight_gradient_or_an_unstated_input_is_left_alone():
    m, _ = conv_grad_model((2, 6, 100), 16, (5,), 2, (2, 2), 1, 1, ("dx", "dw"))
    assert rewrite_frozen_conv_grads(m) == 0
    m, _ = conv_grad_model((2, 6, 100), 16, (5,), 2, (2, 2), 1, 1, ("dx", ""))
    x = next(i for i in m.graph.input if i.name == "x")
    x.type.tensor_type.shape.dim[2].dim_param = "time"  # a length the graph does not state
    assert rewrite_frozen_conv_grads(m) == 0


def _frozen_net():
    import torch
    from torch import nn

    def block(cin, cout, kernel, stride=1, groups=1, bias=False):
        return [nn.Conv1d(cin, cout, kernel, stride, kernel // 2, groups=groups, bias=bias),
                nn.BatchNorm1d(cout), nn.ReLU()]

    torch.manual_seed(0)
    return nn.Sequential(*block(6, 16, 5, bias=True), *block(16, 16, 5, stride=2),
                         *block(16, 16, 3, groups=16), *block(16, 16, 3),
                         nn.AdaptiveAvgPool1d(1), nn.Flatten(), nn.Linear(16, 4))


@pytest.mark.parametrize("update", ["bias", "head", "all"])
def test_an_exported_net_with_frozen_layers_gets_torch_gradients(tmp_path, update):
    import torch

    from edgetrain.manifest import Plan
    from exporters.export import ExportOptions, export_artifact

    model = _frozen_net()
    m = export_artifact(model, torch.zeros(2, 6, 101), tmp_path / "a", classes=list("abcd"),
                        options=ExportOptions(plan=Plan(micro_batch=4), update=update))
    graph = onnx.load(str(tmp_path / "a" / "training_model.onnx")).graph
    frozen = {n.input[2] for n in graph.node if n.op_type == "ConvGrad"} - {
        t.name for t in m.trainable}
    assert not frozen  # every ConvGrad left computes a weight gradient
    if update == "bias":  # every frozen layer's input gradient; the ReLUs kept as masks
        assert m.provenance["passes"]["frozen_conv_input_grads"] == 4
        masks = [n for n in graph.node if n.op_type == "Greater"]
        assert len(masks) == 4, [n.name for n in masks]
        # measure's breakdown names the masks live at the fullest moment: 1 byte an element,
        # each in its memory-pattern slot (a multiple of PATTERN_ALIGN bytes)
        from exporters.predictor.plan import PATTERN_ALIGN
        from exporters.views.activationparts import masks_at_peak
        at_peak = masks_at_peak(str(tmp_path / "a" / "training_model.onnx"),
                                str(tmp_path / "a" / "eval_model.onnx"), 4, 1)
        lengths = (101, 51, 51, 51)  # the four ReLUs' outputs, [4, 16, L] each
        slot = [-(-4 * 16 * n // PATTERN_ALIGN) * PATTERN_ALIGN for n in lengths]
        assert at_peak.tensors >= 1 and at_peak.bytes in {
            sum(chosen) for k in range(1, 5) for chosen in itertools.combinations(slot, k)}, (
            at_peak)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 6, 101)).astype(np.float32)
    y = np.array([0, 1, 2, 3])
    model.train()
    loss = torch.nn.functional.cross_entropy(model(torch.from_numpy(x)), torch.from_numpy(y))
    loss.backward()
    got = device_gradients(tmp_path / "a", x, y)
    assert abs(got["loss"] - loss.item()) < 1e-5
    params = dict(model.named_parameters())
    for t in m.trainable:
        np.testing.assert_allclose(got["grads"][t.name], params[t.name].grad.numpy(),
                                   rtol=1e-4, atol=1e-5, err_msg=t.name)
