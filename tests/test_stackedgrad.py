"""A depthwise weight gradient as one stacked NCHWc Conv (exporters/passes/stackedgrad.py): values
equal to ORT's ConvGrad over pads, kernels and batches; the layers it leaves alone; a whole
training step against torch at micro-batches other than the export's."""
import numpy as np
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper

from edgetrain.manifest import Plan
from exporters.export import export_artifact
from exporters.passes.nchwc import CHANNEL_MULTIPLE, host_block
from exporters.passes.stackedgrad import rewrite_stacked_weight_grads

from conftest import assert_device_step_equals_torch

needs_nchwc = pytest.mark.skipif(host_block() <= 1, reason="this CPU has no NCHWc kernels")


def _grad_model(c, size, kernel, pads, stride=1, outputs=("dX", "dW", "dB")):
    """ConvGrad(dY, X, W) of a depthwise convolution with a batch symbol."""
    ho = (size[0] + pads[0] + pads[2] - kernel[0]) // stride + 1
    wo = (size[1] + pads[1] + pads[3] - kernel[1]) // stride + 1
    vi = helper.make_tensor_value_info
    inputs = [vi("dY", TensorProto.FLOAT, ["n", c, ho, wo]),
              vi("X", TensorProto.FLOAT, ["n", c, *size]),
              vi("W", TensorProto.FLOAT, [c, 1, *kernel])]
    node = helper.make_node("ConvGrad", ["dY", "X", "W"], list(outputs), domain="com.microsoft",
                            group=c, kernel_shape=list(kernel), pads=list(pads),
                            strides=[stride, stride], dilations=[1, 1])
    graph = helper.make_graph([node], "g", inputs, [vi(o, TensorProto.FLOAT, None)
                                                    for o in outputs if o])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                   helper.make_opsetid("com.microsoft", 1)])


def _run(m, feeds):
    s = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    return s.run(None, feeds)


@needs_nchwc
@pytest.mark.parametrize("c,size,kernel,pads,batch,outputs", [
    (16, (6, 6), (3, 3), (1, 1, 1, 1), 3, ("dX", "dW", "dB")),
    (32, (4, 4), (3, 3), (1, 1, 1, 1), 1, ("", "dW")),
    (16, (7, 5), (5, 3), (2, 0, 1, 2), 2, ("dX", "dW")),  # asymmetric pads, odd kernel
    (16, (5, 5), (3, 3), (0, 0, 0, 0), 4, ("", "dW", "dB")),  # no padding
    (16, (8, 3), (3, 1), (1, 0, 1, 0), 3, ("dX", "dW")),  # one-column kernel
])
def test_stacked_weight_gradient_equals_convgrad(c, size, kernel, pads, batch, outputs):
    m = _grad_model(c, size, kernel, pads, outputs=outputs)
    rng = np.random.default_rng(0)
    shapes = {i.name: [d.dim_value or batch for d in i.type.tensor_type.shape.dim]
              for i in m.graph.input}
    feeds = {k: rng.standard_normal(v, np.float32) for k, v in shapes.items()}
    want = _run(m, feeds)
    assert rewrite_stacked_weight_grads(m, host_block(), CHANNEL_MULTIPLE) == 1
    dw_makers = [n for n in m.graph.node if "dW" in n.output]
    assert [n.op_type for n in dw_makers] == ["Reshape"]  # no ConvGrad makes dW any more
    got = _run(m, feeds)
    for g, w in zip(got, want):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)


def test_layers_it_does_not_take_are_left_alone():
    cases = [_grad_model(16, (6, 6), (3, 3), (1, 1, 1, 1), stride=2),  # strided
             _grad_model(24, (6, 6), (3, 3), (1, 1, 1, 1)),  # 24 channels: not every block
             _grad_model(16, (6, 6), (3, 3), (1, 1, 1, 1), outputs=("dX", "", "dB"))]  # no dW
    for m in cases:
        assert rewrite_stacked_weight_grads(m, 16, CHANNEL_MULTIPLE) == 0
    # a host without NCHWc kernels: ORT's grouped Conv would be slower than its ConvGrad
    assert rewrite_stacked_weight_grads(_grad_model(16, (6, 6), (3, 3), (1, 1, 1, 1)), 1,
                                        CHANNEL_MULTIPLE) == 0


class _Net(torch.nn.Sequential):
    def __init__(self):
        super().__init__(torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU(),
                         torch.nn.Conv2d(16, 16, 3, 1, 1, groups=16), torch.nn.ReLU(),
                         torch.nn.Conv2d(16, 32, 1), torch.nn.ReLU(),
                         torch.nn.Conv2d(32, 32, 5, 1, 2, groups=32), torch.nn.ReLU(),
                         torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
                         torch.nn.Linear(32, 4))


@needs_nchwc
@pytest.mark.parametrize("batch", [1, 5])
def test_training_step_equals_torch_at_other_micro_batches(tmp_path, batch):
    """Exported at micro-batch 3; the stacked kernel's height follows the batch it runs at."""
    torch.manual_seed(0)
    model = _Net()
    out = tmp_path / "a"
    m = export_artifact(model, torch.zeros(2, 3, 8, 8), out, classes=list("abcd"),
                        plan=Plan(micro_batch=3), target="host")  # this machine's kernels
    assert m.provenance["passes"]["stacked_depthwise_weight_grads"] == 2
    x = np.random.default_rng(1).standard_normal((batch, 3, 8, 8)).astype(np.float32)
    assert_device_step_equals_torch(out, model, x, np.arange(batch) % 4, atol=1e-5)
