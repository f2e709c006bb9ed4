"""A pointwise ConvGrad split into dX, then dW (exporters/passes/pointwisegrad.py): values equal to
ORT's ConvGrad, dW made only after W's last reader, the layers it must leave alone, and the
memory it frees on a sparse export (predicted and measured)."""
import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from edgetrain.manifest import Plan
from exporters.export import export_artifact
from exporters.graph import execution_order
from exporters.passes.pointwisegrad import (ONE_PRODUCT_MAX_PIXELS, per_image_dw,
                                            rewrite_pointwise_grads)
from exporters.plans.sparse import sparsify

from conftest import assert_device_step_equals_torch


def _grad_model(c_out=8, c_in=6, size=5, computed=True, stride=1, bias=True):
    """ConvGrad(dY, X, W) of a 1 x 1 convolution; W = Wp * 1 (computed) or Wp itself."""
    x = helper.make_tensor_value_info("X", TensorProto.FLOAT, ["n", c_in, size, size])
    wp = helper.make_tensor_value_info("Wp", TensorProto.FLOAT, [c_out, c_in, 1, 1])
    out = -(-size // stride)
    dy = helper.make_tensor_value_info("dY", TensorProto.FLOAT, ["n", c_out, out, out])
    nodes = []
    w = "Wp"
    if computed:
        nodes.append(helper.make_node("Mul", ["Wp", "one"], ["W"]))
        w = "W"
    nodes.append(helper.make_node("ConvGrad", ["dY", "X", w], ["dX", "dW"] + (["dB"] if bias
                                                                              else []),
                                  domain="com.microsoft", kernel_shape=[1, 1],
                                  strides=[stride, stride], pads=[0, 0, 0, 0], group=1))
    outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None)
            for n in ["dX", "dW"] + (["dB"] if bias else [])]
    graph = helper.make_graph(nodes, "g", [dy, x, wp], outs,
                              [numpy_helper.from_array(np.ones(1, np.float32), "one")])
    graph.value_info.extend([helper.make_tensor_value_info(w, TensorProto.FLOAT,
                                                           [c_out, c_in, 1, 1])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                   helper.make_opsetid("com.microsoft", 1)])


def _run(m, feeds):
    s = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    return s.run(None, feeds)


@pytest.mark.parametrize("batch,bias,size,c_out,c_in", [
    (1, True, 5, 8, 6), (3, False, 5, 8, 6), (3, True, 5, 64, 48), (3, True, 4, 8, 6),
    (1, False, 2, 8, 6)])
def test_split_equals_convgrad_and_makes_dw_after_dx(batch, bias, size, c_out, c_in):
    """5 x 5 pixels: dX image by image, dW image by image where N weight-sized products are
    smaller than transposed copies of dY and X (8 x 6 channels), else from the copies (64 x
    48); 4 x 4 and 2 x 2 (<= ONE_PRODUCT_MAX_PIXELS): one product over the micro-batch."""
    rng = np.random.default_rng(0)
    feeds = {"dY": rng.standard_normal((batch, c_out, size, size), np.float32),
             "X": rng.standard_normal((batch, c_in, size, size), np.float32),
             "Wp": rng.standard_normal((c_out, c_in, 1, 1), np.float32)}
    m = _grad_model(c_out=c_out, c_in=c_in, bias=bias, size=size)
    want = _run(m, feeds)
    assert rewrite_pointwise_grads(m) == 1
    assert "ConvGrad" not in [n.op_type for n in m.graph.node]
    one_product = any(n.name.endswith("/dxt3") for n in m.graph.node)
    assert one_product == (size * size <= ONE_PRODUCT_MAX_PIXELS)
    per_image = any(n.name.endswith("/dw_sum") for n in m.graph.node)
    assert per_image == (not one_product and per_image_dw(c_out, c_in, size * size))
    assert per_image == (not one_product and c_out == 8)
    if one_product:  # dX keeps the graph's symbolic batch, so ORT plans its buffer
        stated = {v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]
                  for v in m.graph.value_info}
        dx3 = next(v for v in stated if v.endswith("/dx3"))
        assert stated[dx3] == ["n", c_in, size * size]
    got = _run(m, feeds)
    for g, w in zip(got, want):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
    order = [m.graph.node[i].name for i in execution_order(list(m.graph.node))]
    dx = next(n.name for n in m.graph.node if n.name.endswith("/dx"))
    dw = next(n.name for n in m.graph.node if n.name.endswith("/dw"))
    assert order.index(dx) < order.index(dw)  # W's last reader runs before dW is made


def test_parameters_strided_and_unused_gradients_are_left_alone():
    for m in (_grad_model(computed=False), _grad_model(stride=2)):
        assert rewrite_pointwise_grads(m) == 0
    m = _grad_model()
    m.graph.node[1].output[0] = ""  # no input gradient wanted (a first layer)
    del m.graph.output[0]
    assert rewrite_pointwise_grads(m) == 0


class _Net(torch.nn.Sequential):
    def __init__(self):
        super().__init__(torch.nn.Conv2d(3, 32, 3, padding=1), torch.nn.ReLU(),
                         torch.nn.Conv2d(32, 64, 1), torch.nn.ReLU(),
                         torch.nn.Conv2d(64, 64, 1), torch.nn.ReLU(),
                         torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
                         torch.nn.Linear(64, 4))


def test_sparse_export_gradients_match_torch(tmp_path):
    """Masked pointwise layers (their weights rebuilt on each call, so split) under a recompute
    plan: the runtime's loss and every gradient equal torch's on the same masked network."""
    torch.manual_seed(0)
    out = tmp_path / "a"
    m = export_artifact(_Net(), torch.zeros(2, 3, 6, 6), out, classes=list("abcd"),
                        plan=Plan(micro_batch=3), density=0.5, recompute="sqrt", nchwc=False,
                        mask_allocation="uniform")
    assert m.provenance["passes"]["pointwise_grads_split"] >= 2
    torch.manual_seed(0)
    model, _ = sparsify(_Net(), 0.5, "uniform")
    x = np.random.default_rng(1).standard_normal((3, 3, 6, 6)).astype(np.float32)
    assert_device_step_equals_torch(out, model, x, np.array([0, 1, 2]), atol=1e-6)
