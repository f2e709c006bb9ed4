"""Depthwise convolutions in ORT's NCHWc kernels (exporters/passes/nchwc.py): the block probe, the
rewrite's values and gradients against ORT's own kernels, the predictor's sizes, the
runtime's refusal of another block."""
import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper

from edgetrain.manifest import ArtifactError, Plan, load_manifest
from edgetrain.names import NCHWC_DOMAIN
from edgetrain.nchwcprobe import PROBE_MODEL, check_block, nchwc_block
from exporters.export import export_artifact
from exporters.passes.nchwc import host_block, rewrite_depthwise_nchwc
from exporters.predictor.shapes import tensor_shapes

from conftest import device_gradients

needs_nchwc = pytest.mark.skipif(host_block() <= 1, reason="this CPU has no NCHWc kernels")


def test_probe_model_is_the_documented_graph():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 1, 1])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    graph = helper.make_graph([helper.make_node("ReorderInput", ["x"], ["y"],
                                                domain=NCHWC_DOMAIN)], "probe", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid(NCHWC_DOMAIN, 1)],
                              producer_name="edgetrain")
    model.ir_version = 8
    assert model.SerializeToString() == PROBE_MODEL
    assert nchwc_block(ort) in (0, 4, 8, 16)


def test_check_block_names_both_blocks_and_marks_its_probe():
    marks = []
    check_block(0, ort, marks.append)
    assert marks == []  # no NCHWc nodes: nothing probed
    here = nchwc_block(ort)
    other = 8 if here == 16 else 16
    with pytest.raises(ArtifactError, match=f"{other}-channel blocks.*export it again"):
        check_block(other, ort, marks.append)
    assert marks == ["probe"]
    if here:
        check_block(here, ort)


def _depthwise_model(channels: int, size: int, stride: int, bias: bool) -> onnx.ModelProto:
    x = helper.make_tensor_value_info("X", TensorProto.FLOAT, ["batch", channels, size, size])
    w = helper.make_tensor_value_info("W", TensorProto.FLOAT, [channels, 1, 3, 3])
    b = helper.make_tensor_value_info("B", TensorProto.FLOAT, [channels])
    y = helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)
    node = helper.make_node("Conv", ["X", "W"] + (["B"] if bias else []), ["Y"],
                            group=channels, kernel_shape=[3, 3], pads=[1, 1, 1, 1],
                            strides=[stride, stride])
    graph = helper.make_graph([node], "dw", [x, w] + ([b] if bias else []), [y])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def _run(m: onnx.ModelProto, feeds: dict) -> np.ndarray:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(m.SerializeToString(), so,
                                providers=["CPUExecutionProvider"]).run(None, feeds)[0]


@needs_nchwc
@pytest.mark.parametrize("channels,size,stride,bias", [(16, 8, 1, True), (32, 7, 2, False),
                                                       (64, 4, 1, False), (48, 9, 2, True)])
def test_rewritten_conv_equals_ort_conv(channels, size, stride, bias):
    rng = np.random.default_rng(channels + size)
    feeds = {"X": rng.standard_normal((3, channels, size, size), np.float32),
             "W": rng.standard_normal((channels, 1, 3, 3), np.float32)}
    if bias:
        feeds["B"] = rng.standard_normal(channels, np.float32)
    m = _depthwise_model(channels, size, stride, bias)
    want = _run(m, feeds)
    shapes = {k: list(v[0]) for k, v in tensor_shapes(m, 3).items()}
    assert rewrite_depthwise_nchwc(m, shapes, host_block()) == {"Conv": 1}
    assert [n.op_type for n in m.graph.node if n.domain == NCHWC_DOMAIN] == [
        "ReorderInput", "Conv", "ReorderOutput"]
    got = _run(m, feeds)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    # the predictor sizes every new tensor, the NCHWc ones too (bytes from shapes x itemsize)
    sized = tensor_shapes(m, 3)
    out = [n for n in m.graph.node if n.op_type == "ReorderOutput"][0]
    side = (size + 2 - 3) // stride + 1
    assert sized[out.input[0]] == ((3, channels, side, side), 4)
    assert all(o in sized for n in m.graph.node for o in n.output)


def test_layers_the_kernels_do_not_take_are_left_alone():
    m = _depthwise_model(24, 8, 1, False)  # 24 channels: not a multiple of every block
    shapes = {k: list(v[0]) for k, v in tensor_shapes(m, 2).items()}
    assert rewrite_depthwise_nchwc(m, shapes, 16) == {"Conv": 0}
    assert rewrite_depthwise_nchwc(_depthwise_model(32, 8, 1, False), shapes, 1) == {"Conv": 0}


class _DepthwiseNet(torch.nn.Sequential):
    def __init__(self):
        super().__init__(torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU(),
                         torch.nn.Conv2d(16, 16, 3, 2, 1, groups=16), torch.nn.ReLU(),
                         torch.nn.Conv2d(16, 32, 1), torch.nn.ReLU(),
                         torch.nn.Conv2d(32, 32, 3, 1, 1, groups=32), torch.nn.ReLU(),
                         torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
                         torch.nn.Linear(32, 4))


@needs_nchwc
def test_training_step_gradients_equal_ort_kernels(tmp_path):
    torch.manual_seed(0)
    model = _DepthwiseNet()
    x = np.random.default_rng(1).standard_normal((4, 3, 12, 12), np.float32)
    y = np.array([0, 1, 2, 3], np.int64)
    got = {}
    for nchwc in (True, False):
        out = tmp_path / f"nchwc-{nchwc}"
        export_artifact(model, torch.zeros(2, 3, 12, 12), out, classes=list("abcd"),
                        plan=Plan(micro_batch=4), nchwc=nchwc)
        m = load_manifest(out)
        graph = onnx.load(str(out / "training_model.onnx"))
        convs = sum(n.domain == NCHWC_DOMAIN and n.op_type == "Conv" for n in graph.graph.node)
        assert m.plan.nchwc_block == (host_block() if nchwc else 0)
        passes = m.provenance["passes"]
        assert (passes.get("nchwc_convs", 0) + passes.get(
            "stacked_depthwise_weight_grads", 0) == convs) and (
            convs >= 2 if nchwc else convs == 0)  # the two depthwise layers at least
        got[nchwc] = device_gradients(out, x, y)
    assert got[True]["loss"] == pytest.approx(got[False]["loss"], rel=1e-5)
    for name, g in got[False]["grads"].items():
        np.testing.assert_allclose(np.array(got[True]["grads"][name]), np.array(g),
                                   rtol=1e-4, atol=1e-5, err_msg=name)


@needs_nchwc
def test_runtime_refuses_another_block(tmp_path):
    torch.manual_seed(0)
    out = tmp_path / "a"
    export_artifact(_DepthwiseNet(), torch.zeros(2, 3, 12, 12), out, classes=list("abcd"),
                    plan=Plan(micro_batch=2), target="host")
    m = load_manifest(out)
    other = 8 if m.plan.nchwc_block == 16 else 16
    d = json.loads((out / "manifest.json").read_text())
    d["plan"]["nchwc_block"] = other
    (out / "manifest.json").write_text(json.dumps(d))
    from conftest import device_python
    with pytest.raises(AssertionError, match=f"{other}-channel blocks"):
        device_python(f"""
from edgetrain.runtime import DeviceRuntime
DeviceRuntime({str(out)!r})
""")
    assert m.plan.nchwc_block == host_block()
