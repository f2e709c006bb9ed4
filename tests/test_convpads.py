"""Pass `explicit_conv_pads`: a SAME-padded Conv (torch's padding="same") gets explicit pads,
the same convolution, which ORT's CPU Conv takes with a dilation (it refused SAME then)."""
from __future__ import annotations

import io

import numpy as np
import onnx
import onnxruntime as ort  # host side: torch is loaded here
import pytest
import torch
from onnx import helper

from exporters.graph import attributes
from exporters.passes.convpads import explicit_conv_pads, same_pads


def _run(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    s = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return s.run(None, {s.get_inputs()[0].name: x})[0]


def _export(module: torch.nn.Module, x: torch.Tensor) -> onnx.ModelProto:
    f = io.BytesIO()
    torch.onnx.export(module, x, f, opset_version=17, dynamo=False, input_names=["x"],
                      dynamic_axes={"x": {0: "batch"}})
    return onnx.load_from_string(f.getvalue())


@pytest.mark.parametrize("conv, shape", [
    (torch.nn.Conv1d(3, 4, 4, padding="same", dilation=2), (2, 3, 50)),  # even kernel
    (torch.nn.Conv1d(3, 4, 5, padding="same", dilation=3), (2, 3, 41)),
    (torch.nn.Conv2d(3, 4, (3, 4), padding="same", dilation=(2, 1)), (2, 3, 9, 10)),
])
def test_torchs_same_padding_with_a_dilation_runs_in_ort_and_equals_torch(conv, shape):
    torch.manual_seed(0)
    x = torch.randn(*shape)
    model = _export(conv, x)
    assert attributes(model.graph.node[0]).get("auto_pad") == b"SAME_UPPER"
    with pytest.raises(Exception, match="Dilation not supported"):
        _run(model, x.numpy())  # what the training step met before the pass
    assert explicit_conv_pads(model) == 1
    assert "auto_pad" not in attributes(model.graph.node[0])
    np.testing.assert_allclose(_run(model, x.numpy()), conv(x).detach().numpy(), atol=1e-5)
    assert explicit_conv_pads(model) == 0  # nothing left to rewrite


@pytest.mark.parametrize("mode", ["SAME_UPPER", "SAME_LOWER"])
@pytest.mark.parametrize("size, stride", [(10, 2), (11, 2), (9, 3), (7, 1)])
def test_explicit_pads_equal_orts_own_same_padding_at_any_stride(mode, size, stride):
    """ORT runs SAME itself where the dilation is 1: the rewritten Conv gives its output."""
    rng = np.random.default_rng(0)
    w = helper.make_tensor("w", onnx.TensorProto.FLOAT, [2, 1, 4],
                           rng.standard_normal(8).astype(np.float32).tolist())
    node = helper.make_node("Conv", ["x", "w"], ["y"], auto_pad=mode, strides=[stride])
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 1, size])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    x = rng.standard_normal((1, 1, size)).astype(np.float32)
    before = _run(model, x)
    assert explicit_conv_pads(model) == 1
    np.testing.assert_array_equal(_run(model, x), before)


def test_a_stride_above_one_needs_the_size_and_stride_one_does_not():
    assert same_pads([None], [4], [1], [2], "upper") == [3, 3]  # 6 in all, odd element: none
    assert same_pads([None], [4], [1], [1], "upper") == [1, 2]  # odd element at the end
    assert same_pads([None], [4], [1], [1], "lower") == [2, 1]  # ... or at the start
    assert same_pads([None], [3], [2], [1], "upper") is None
    assert same_pads([10], [3], [2], [1], "upper") == [0, 1]  # out 5: 4 * 2 + 3 - 10 = 1


def test_a_model_with_same_padding_and_a_dilation_exports_and_trains(tmp_path):
    """End to end through the Python API: the export's dry run takes a training step (it
    failed in ORT before the pass) and the pass is recorded in the provenance."""
    from edgetrain.manifest import Plan
    from exporters.export import ExportOptions, export_artifact

    class Tcn(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Conv1d(6, 8, 3, padding="same", dilation=2)
            self.b = torch.nn.Conv1d(8, 8, 4, padding="same", dilation=4)
            self.head = torch.nn.Linear(8, 3)

        def forward(self, x):
            y = torch.relu(self.a(x))
            return self.head(torch.relu(self.b(y) + y).mean(-1))

    torch.manual_seed(0)
    m = export_artifact(Tcn(), torch.zeros(2, 6, 64), tmp_path / "tcn",
                        classes=["a", "b", "c"], layout="CT",
                        options=ExportOptions(plan=Plan(micro_batch=4)))
    assert m.provenance["passes"]["explicit_conv_pads"] == 2
