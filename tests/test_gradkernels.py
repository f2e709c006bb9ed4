"""The gradient rewrites compute the values of ORT's kernels they replace (ReluGrad, a
depthwise ConvGrad), leave the nodes they cannot prove alone, and inside an exported artifact
give torch's gradients."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from conftest import device_gradients
from test_frozengrads import conv_grad_model
from exporters.passes.relugrad import rewrite_relu_grads
from exporters.passes.depthwisegrad import (MLAS_CONV_BUFFER_BYTES_PER_THREAD, PEAK_SHARE,
                                           rewrite_depthwise_conv_grads)

SHAPE = [2, 3, 5, 5]


def _model(second_input: str):
    io = [helper.make_tensor_value_info(n, TensorProto.FLOAT, SHAPE) for n in ("dy", "x")]
    nodes = [helper.make_node("Relu", ["x"], ["y"]),
             helper.make_node("ReluGrad", ["dy", second_input], ["dx"], domain="com.microsoft")]
    out = helper.make_tensor_value_info("dx", TensorProto.FLOAT, SHAPE)
    return helper.make_model(helper.make_graph(nodes, "g", io, [out]), opset_imports=[
        helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])


def _run(model, feed):
    s = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return s.run(None, feed)[0]


def test_rewrite_matches_relu_grad():
    rng = np.random.default_rng(0)
    x = rng.standard_normal(SHAPE).astype(np.float32)
    x[0, 0, 0, :2] = 0.0  # the boundary: ReluGrad passes no gradient at 0
    x[0, 0, 1, :4] = [1e-45, 1e-39, 3e38, np.inf]  # the smallest subnormal up to infinity
    feed = {"dy": rng.standard_normal(SHAPE).astype(np.float32), "x": x}
    before = _run(_model("y"), feed)
    m = _model("y")
    assert rewrite_relu_grads(m, masks=False) == 1
    assert [n.op_type for n in m.graph.node] == ["Relu", "Ceil", "HardSigmoid", "Mul"]
    after = _run(m, feed)
    np.testing.assert_array_equal(after, before)
    np.testing.assert_array_equal(after, np.where(x > 0, feed["dy"], 0))
    # nothing else in backward reads y: its sign is kept as a 1-byte mask made in forward
    m = _model("y")
    assert rewrite_relu_grads(m) == 1
    assert [n.op_type for n in m.graph.node] == ["Relu", "Greater", "PassThrough", "Cast",
                                                "Mul"]
    mask = next(v for v in m.graph.value_info if v.name == "y_relumask")
    assert mask.type.tensor_type.elem_type == TensorProto.BOOL
    np.testing.assert_array_equal(_run(m, feed), before)


def test_relu_grad_of_a_non_relu_tensor_is_left_alone():
    m = _model("x")  # the second input is not a Relu's output: Sign(x) could be -1
    assert rewrite_relu_grads(m) == 0
    assert [n.op_type for n in m.graph.node] == ["Relu", "ReluGrad"]


def _conv_grad_model(c: int, x_shape, group: int, stride: int, pads, kernel):
    return conv_grad_model(x_shape, c, kernel, stride, pads, 1, group, ("dx", "dw"))


def _run_all(model, feed):
    s = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return s.run(None, feed)


# inputs of at least 8 x 64 KiB (BUFFER_SHARE x MLAS's working buffer for one thread)
@pytest.mark.parametrize("x_shape, kernel, pads", [
    ((2, 16, 64, 64), (3, 3), (1, 1, 1, 1)),  # MobileNet's 3x3, same padding
    ((1, 32, 65, 66), (5, 3), (2, 0, 1, 2)),  # uneven kernel and padding
    ((2, 64, 1024), (5,), (2, 2)),  # a 1-D depthwise convolution over a sensor window
])
def test_depthwise_conv_grad_rewrite_matches_conv_grad(x_shape, kernel, pads):
    c = x_shape[1]
    m, feed = _conv_grad_model(c, x_shape, c, 1, pads, kernel)
    before = _run_all(m, feed)
    assert rewrite_depthwise_conv_grads(m, micro_batch=x_shape[0], threads=1) == 1
    assert [n.op_type for n in m.graph.node] == ["ConvGrad", "Slice", "Conv"]
    assert list(m.graph.node[0].output) == ["", "dw"]  # the weight gradient alone
    after = _run_all(m, feed)
    for a, b in zip(after, before):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("channels, group, stride, side", [
    (32, 32, 2, 64), (32, 2, 1, 64), (32, 1, 1, 64),  # strided, grouped, dense
    (4, 4, 1, 8),  # depthwise but small: MLAS's working buffer would outweigh the gain
])
def test_strided_small_or_not_depthwise_conv_grads_are_left_alone(channels, group, stride,
                                                                    side):
    m, _ = _conv_grad_model(channels, (1, channels, side, side), group, stride, (1, 1, 1, 1),
                            (3, 3))
    assert rewrite_depthwise_conv_grads(m, micro_batch=1, threads=1) == 0
    assert [n.op_type for n in m.graph.node] == ["ConvGrad"]


def test_the_size_rule_counts_the_plans_batch_and_threads():
    # 16 x 32 x 32 floats = 64 KiB a sample: 8 samples hold 8 buffers of one thread, not of two
    m, _ = _conv_grad_model(16, (1, 16, 32, 32), 16, 1, (1, 1, 1, 1), (3, 3))
    assert rewrite_depthwise_conv_grads(m, micro_batch=8, threads=2) == 0
    assert rewrite_depthwise_conv_grads(m, micro_batch=8, threads=1) == 1


def test_the_peak_rule_rewrites_a_small_layer_of_a_large_step():
    # 4 x 8 x 8 floats = 1 KiB of input gradient: far below 8 buffers, so only the step's
    # peak can justify the 64 KiB buffer: 100 buffers' worth and more, not a byte less
    m, _ = _conv_grad_model(4, (1, 4, 8, 8), 4, 1, (1, 1, 1, 1), (3, 3))
    buffer = MLAS_CONV_BUFFER_BYTES_PER_THREAD
    assert rewrite_depthwise_conv_grads(m, 1, 1, peak_bytes=PEAK_SHARE * buffer - 1) == 0
    assert rewrite_depthwise_conv_grads(m, 1, 1, peak_bytes=None) == 0
    assert rewrite_depthwise_conv_grads(m, 1, 1, peak_bytes=PEAK_SHARE * buffer) == 1


def test_an_exported_depthwise_net_gets_torch_gradients(tmp_path):
    import torch
    from torch import nn

    from edgetrain.manifest import Plan
    from exporters.export import export_artifact

    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(),
                          nn.Conv2d(16, 16, 3, padding=1, groups=16), nn.ReLU(),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 3))
    m = export_artifact(model, torch.zeros(2, 3, 64, 64), tmp_path / "art",
                        classes=["a", "b", "c"], model_name="dw", plan=Plan(micro_batch=4),
                        target="host")  # this machine's kernels where it has them
    from exporters.passes.nchwc import host_block
    # the depthwise layer's forward Conv and its input-gradient Conv go into NCHWc kernels
    # where this CPU has them (tests/test_nchwc.py), and so does its weight gradient
    # (tests/test_stackedgrad.py)
    passes = m.provenance["passes"]
    assert (passes["relu_grads"], passes["depthwise_conv_grads"]) == (2, 1)
    assert (passes["nchwc_convs"], passes["stacked_depthwise_weight_grads"]) == (
        (2, 1) if host_block() > 1 else (0, 0))
    rng = np.random.default_rng(0)
    x = rng.standard_normal((m.plan.micro_batch, 3, 64, 64)).astype(np.float32)
    y = rng.integers(0, 3, m.plan.micro_batch)
    torch.nn.functional.cross_entropy(model(torch.from_numpy(x)), torch.from_numpy(y)).backward()
    out = device_gradients(tmp_path / "art", x, y)["grads"]
    for name, p in model.named_parameters():  # float32 sums over 4 x 64 x 64 pixels
        np.testing.assert_allclose(np.array(out[name]), p.grad.numpy(), rtol=1e-3, atol=1e-5,
                                   err_msg=name)
