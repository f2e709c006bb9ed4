"""Masked weights rebuilt dense by one MaxUnpool (exporters/passes/densebuild.py): values equal to the
scatter's, the buffer's size known to ORT at load (so it is in the memory pattern), what the
rewrite must leave alone, a sparse export's step equal under both builds, and old manifests."""
import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from edgetrain.manifest import Plan, load_manifest
from exporters.passes.densebuild import rewrite_dense_builds
from exporters.export import export_artifact
from exporters.predictor.ortgraph import node_arg_shapes
from exporters.predictor.shapes import tensor_shapes

from conftest import device_gradients

N, NNZ = 96, 17


def _scatter_model(zero: float = 0.0, reduction: str = "none", via_mul: bool = True,
                   index_type=TensorProto.INT32) -> onnx.ModelProto:
    """dense = ScatterElements(Expand(zero, [N]), positions, values), then Reshape [8, 12]; the
    zero made as sparse.dense_weight makes it (positions[:1] cast and multiplied by 0)."""
    nodes = []
    if via_mul:
        nodes += [helper.make_node("Slice", ["pos", "s0", "s1"], ["p1"]),
                  helper.make_node("Cast", ["p1"], ["p1f"], to=TensorProto.FLOAT),
                  helper.make_node("Mul", ["p1f", "zero"], ["z"])]
    nodes += [helper.make_node("Expand", ["z" if via_mul else "zero", "n"], ["data"]),
              helper.make_node("ScatterElements", ["data", "pos", "vals"], ["flat"], axis=0,
                               reduction=reduction),
              helper.make_node("Reshape", ["flat", "wshape"], ["w"])]
    inits = [numpy_helper.from_array(np.array([0], np.int64), "s0"),
             numpy_helper.from_array(np.array([1], np.int64), "s1"),
             numpy_helper.from_array(np.array([zero], np.float32), "zero"),
             numpy_helper.from_array(np.array([N], np.int64), "n"),
             numpy_helper.from_array(np.array([8, 12], np.int64), "wshape")]
    graph = helper.make_graph(
        nodes, "build", [helper.make_tensor_value_info("pos", index_type, [NNZ]),
                         helper.make_tensor_value_info("vals", TensorProto.FLOAT, [NNZ])],
        [helper.make_tensor_value_info("w", TensorProto.FLOAT, [8, 12])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _run(m: onnx.ModelProto, pos: np.ndarray, vals: np.ndarray) -> np.ndarray:
    s = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    return s.run(None, {"pos": pos, "vals": vals})[0]


def _shapes(m):
    return {k: list(v[0]) for k, v in tensor_shapes(m, 1).items()}


@pytest.mark.parametrize("index_type", [TensorProto.INT32, TensorProto.INT64])
def test_unpool_equals_scatter_and_its_buffer_is_sized_at_load(index_type):
    rng = np.random.default_rng(0)
    pos = np.sort(rng.choice(N, NNZ, replace=False)).astype(
        np.int32 if index_type == TensorProto.INT32 else np.int64)
    vals = rng.standard_normal(NNZ).astype(np.float32)
    m = _scatter_model(index_type=index_type)
    want = _run(m, pos, vals)
    assert rewrite_dense_builds(m, _shapes(m)) == 1
    ops = [n.op_type for n in m.graph.node]
    assert "ScatterElements" not in ops and "Expand" not in ops and "Mul" not in ops
    assert ops.count("Cast") == (1 if index_type == TensorProto.INT32 else 0)  # to int64
    np.testing.assert_array_equal(_run(m, pos, vals), want)
    unpool = next(n for n in m.graph.node if n.op_type == "MaxUnpool")
    # ORT knows the output's shape when it loads the graph: N floats, a memory-pattern buffer
    assert node_arg_shapes(m)[unpool.output[0]] == ((1, 1, N), 4)
    assert tensor_shapes(m, 1)[unpool.output[0]] == ((1, 1, N), 4)


def test_scatters_not_into_zeros_are_left_alone():
    for m in (_scatter_model(zero=1.0), _scatter_model(zero=1.0, via_mul=False),
              _scatter_model(reduction="add")):
        before = m.SerializeToString()
        assert rewrite_dense_builds(m, _shapes(m)) == 0
        assert m.SerializeToString() == before
    m = _scatter_model(via_mul=False)  # a constant zero is one too
    assert rewrite_dense_builds(m, _shapes(m)) == 1


class _SmallNet(torch.nn.Sequential):
    def __init__(self):
        super().__init__(torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU(),
                         torch.nn.Conv2d(16, 32, 1), torch.nn.ReLU(),
                         torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
                         torch.nn.Linear(32, 4))


def test_sparse_step_equal_under_both_builds(tmp_path):
    torch.manual_seed(0)
    model = _SmallNet()
    x = np.random.default_rng(1).standard_normal((4, 3, 10, 10), np.float32)
    y = np.array([0, 1, 2, 3], np.int64)
    got = {}
    for build in ("unpool", "scatter"):
        out = tmp_path / build
        export_artifact(model, torch.zeros(2, 3, 10, 10), out, classes=list("abcd"),
                        plan=Plan(micro_batch=4, dense_build=build), density=0.3,
                        recompute="sqrt", nchwc=False)
        m = load_manifest(out)
        ops = [n.op_type for n in onnx.load(str(out / "training_model.onnx")).graph.node]
        masked = len(m.masks)
        assert masked >= 2 and m.plan.dense_build == build
        assert m.provenance["passes"].get("dense_builds", 0) == ops.count("MaxUnpool")
        if build == "unpool":  # every build, the recompute plan's copies too
            assert ops.count("MaxUnpool") >= masked and ops.count("ScatterElements") == 0
        else:
            assert ops.count("MaxUnpool") == 0 and ops.count("ScatterElements") >= masked
        assert m.predicted["complete"], m.predicted["caveat"]
        got[build] = device_gradients(out, x, y)
    assert got["unpool"]["loss"] == got["scatter"]["loss"]
    for name, g in got["scatter"]["grads"].items():
        np.testing.assert_array_equal(np.array(got["unpool"]["grads"][name]), np.array(g),
                                      err_msg=name)


def test_manifests_written_before_say_scatter(tmp_path):
    out = tmp_path / "a"
    torch.manual_seed(0)
    export_artifact(_SmallNet(), torch.zeros(2, 3, 10, 10), out, classes=list("abcd"),
                    plan=Plan(micro_batch=2), nchwc=False)
    assert load_manifest(out).plan.dense_build == "unpool"
    d = json.loads((out / "manifest.json").read_text())
    del d["plan"]["dense_build"]
    (out / "manifest.json").write_text(json.dumps(d))
    assert load_manifest(out).plan.dense_build == "scatter"
    with pytest.raises(ValueError, match="dense build 'gather'"):
        export_artifact(_SmallNet(), torch.zeros(2, 3, 10, 10), tmp_path / "b",
                        classes=list("abcd"), plan=Plan(dense_build="gather"))


def test_a_layer_larger_than_any_window_exports_with_its_unpool(tmp_path):
    """A masked weight of 131,072 values at density 0.1 is rebuilt by a MaxUnpool whose
    kernel is about 118 thousand long: the device's graph check bounds MaxUnpool's kernel as
    the tensor it writes (256 MiB), not as a pooling window (65,536), so the export (which
    runs that check on every graph it writes) succeeds and the step runs."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(512, 256), torch.nn.ReLU(),
                                torch.nn.Linear(256, 3))
    m = export_artifact(model, torch.zeros(2, 512), tmp_path / "a", classes=["a", "b", "c"],
                        plan=Plan(micro_batch=2), density=0.1, mask_allocation="uniform")
    train = onnx.load(str(tmp_path / "a" / "training_model.onnx"))
    kernels = [a.ints[0] for n in train.graph.node if n.op_type == "MaxUnpool"
               for a in n.attribute if a.name == "kernel_shape"]
    assert max(kernels) > 1 << 16 and m.provenance["passes"]["dense_builds"] >= 1
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 512)).astype(np.float32)
    assert np.isfinite(device_gradients(tmp_path / "a", x, np.array([0, 1]))["loss"])
