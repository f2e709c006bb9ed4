"""The weight gradients of pointwise ConvGrads declared (exporters/passes/weightgradshapes.py):
ORT then plans them in its memory pattern instead of at run time, the values unchanged; other
kernels and stated gradients left alone."""
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from exporters.passes.weightgradshapes import declare_pointwise_weight_grads
from exporters.predictor.plan import plan_step


def _grad_model(c_out=16, c_in=12, kernel=1, size=6, stated_dw=False):
    """ConvGrad(dY, X, W) of a convolution whose weight W is a graph input (a parameter)."""
    pad = kernel // 2
    x = helper.make_tensor_value_info("X", TensorProto.FLOAT, ["n", c_in, size, size])
    w = helper.make_tensor_value_info("W", TensorProto.FLOAT, [c_out, c_in, kernel, kernel])
    dy = helper.make_tensor_value_info("dY", TensorProto.FLOAT, ["n", c_out, size, size])
    node = helper.make_node("ConvGrad", ["dY", "X", "W"], ["dX", "dW", "dB"],
                            domain="com.microsoft", kernel_shape=[kernel, kernel],
                            strides=[1, 1], pads=[pad] * 4, group=1)
    # readers keep dW and dB intermediate tensors, as the gradient accumulators do
    acc = [helper.make_node("Mul", [g, g], [g + "2"]) for g in ("dW", "dB")]
    outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None)
            for n in ("dX", "dW2", "dB2")]
    graph = helper.make_graph([node, *acc], "g", [dy, x, w], outs)
    if stated_dw:
        graph.value_info.append(helper.make_tensor_value_info(
            "dW", TensorProto.FLOAT, [c_out, c_in, kernel, kernel]))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                   helper.make_opsetid("com.microsoft", 1)])


def _feeds(m, batch=2, seed=0):
    rng = np.random.default_rng(seed)
    shapes = {v.name: [batch if d.dim_param else d.dim_value
                       for d in v.type.tensor_type.shape.dim] for v in m.graph.input}
    return {k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()}


def _run(m, feeds):
    s = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    return s.run(None, feeds)


def test_pointwise_weight_grad_planned_in_the_pattern(tmp_path):
    m = _grad_model(c_out=16, c_in=12)
    feeds = _feeds(m)
    want = _run(m, feeds)
    before = tmp_path / "before.onnx"
    onnx.save(m, before)
    dw_bytes = 16 * 12 * 4  # shape x itemsize
    dynamic = {name: size for name, size, _, _ in plan_step(str(before), 2).dynamic}
    assert dynamic.get("dW") == dw_bytes  # unsized in ORT's graph: a run-time allocation
    assert declare_pointwise_weight_grads(m) == 2  # dW and dB
    stated = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim]
              for v in m.graph.value_info}
    assert stated["dW"] == [16, 12, 1, 1] and stated["dB"] == [16]
    after = tmp_path / "after.onnx"
    onnx.save(m, after)
    plan = plan_step(str(after), 2)
    assert "dW" not in {name for name, *_ in plan.dynamic}
    # the pattern is dW's slot and dB's (16 floats in a 256-byte slot), live together; the
    # graph outputs stay run-time allocations
    assert plan.pattern_bytes == dw_bytes + 256
    for got, exp in zip(_run(m, feeds), want):
        np.testing.assert_array_equal(got, exp)
    assert declare_pointwise_weight_grads(m) == 0  # declared once


@pytest.mark.parametrize("kernel,stated_dw", [(3, False), (1, True)])
def test_other_kernels_and_stated_gradients_left_alone(kernel, stated_dw):
    m = _grad_model(kernel=kernel, stated_dw=stated_dw)
    before = m.SerializeToString()
    assert declare_pointwise_weight_grads(m) == (1 if stated_dw else 0)  # dB only, if any
    if not stated_dw:
        assert m.SerializeToString() == before
