"""Conv -> Relu fused into ORT's FusedConv in the training graph (exporters/convrelu.py)."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper

from exporters.convrelu import fuse_conv_relu


def _model():
    """x -> Conv a -> Relu (fusable); x -> Conv b -> Relu, and b's output is also a graph
    output (not fusable)."""
    vi = lambda n, s: helper.make_tensor_value_info(n, TensorProto.FLOAT, s)  # noqa: E731
    rng = np.random.default_rng(0)
    w = helper.make_tensor("w", TensorProto.FLOAT, [4, 3, 3, 3],
                           rng.standard_normal(108).astype(np.float32).tolist())
    nodes = [helper.make_node("Conv", ["x", "w"], ["a"], pads=[1, 1, 1, 1], name="ca"),
             helper.make_node("Relu", ["a"], ["ra"]),
             helper.make_node("Conv", ["x", "w"], ["b"], pads=[1, 1, 1, 1], name="cb"),
             helper.make_node("Relu", ["b"], ["rb"])]
    g = helper.make_graph(nodes, "g", [vi("x", [1, 3, 8, 8])],
                          [vi("ra", None), vi("rb", None), vi("b", None)], [w])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                               helper.make_opsetid("com.microsoft", 1)])


def _run(m, x):
    return ort.InferenceSession(m.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, {"x": x})


def test_only_a_conv_read_by_its_relu_alone_is_fused_and_values_stay():
    m = _model()
    x = np.random.default_rng(1).standard_normal((1, 3, 8, 8)).astype(np.float32)
    before = _run(m, x)
    assert fuse_conv_relu(m) == 1
    ops = [(n.op_type, n.domain) for n in m.graph.node]
    assert ops.count(("FusedConv", "com.microsoft")) == 1 and ops.count(("Conv", "")) == 1
    fused = next(n for n in m.graph.node if n.op_type == "FusedConv")
    assert list(fused.output) == ["ra"]  # the Relu's output, under its own name
    for a, b in zip(_run(m, x), before):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
