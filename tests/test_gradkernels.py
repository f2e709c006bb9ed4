"""The ReluGrad rewrite computes ReluGrad's values, and leaves nodes it cannot prove alone."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper

from exporters.gradkernels import rewrite_relu_grads

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
    feed = {"dy": rng.standard_normal(SHAPE).astype(np.float32), "x": x}
    before = _run(_model("y"), feed)
    m = _model("y")
    assert rewrite_relu_grads(m) == 1
    assert [n.op_type for n in m.graph.node] == ["Relu", "Sign", "Mul"]
    after = _run(m, feed)
    np.testing.assert_array_equal(after, before)
    np.testing.assert_array_equal(after, np.where(x > 0, feed["dy"], 0))


def test_relu_grad_of_a_non_relu_tensor_is_left_alone():
    m = _model("x")  # the second input is not a Relu's output: Sign(x) could be -1
    assert rewrite_relu_grads(m) == 0
    assert [n.op_type for n in m.graph.node] == ["Relu", "ReluGrad"]
