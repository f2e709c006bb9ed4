"""Issue 37: an artifact is checked to the operator before ONNX Runtime sees it. Each case is a
hand-made artifact resealed so its hashes match (the manifest's hashes prove the bytes, not
what they do); each asserts the status, the message, no traceback, that nothing saved is lost,
and for the memory cases that the process stayed small."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from conftest import ROOT, cli
from test_bad_input import art, refused, reseal, resume, saved  # noqa: F401

ROLES = ("training_model", "eval_model")


def edit(art_dir, change, roles=ROLES) -> None:
    """Apply change(graph) to the artifact's graphs and reseal their hashes."""
    for role in roles:
        path = art_dir / f"{role}.onnx"
        m = onnx.load(path)
        change(m)
        onnx.save(m, path)
        reseal(art_dir, role)


def add_to_loss(m: onnx.ModelProto, nodes, value: str) -> None:
    """Append nodes to the graph and add 0 * sum(value) to its first output, so ORT runs them."""
    g = m.graph
    out = g.output[0].name
    for node in g.node:
        node.output[:] = [f"{o}_pre" if o == out else o for o in node.output]
    g.initializer.append(numpy_helper.from_array(np.array(0, np.float32), "h_zero"))
    g.node.extend([*nodes, helper.make_node("ReduceSum", [value], ["h_sum"], keepdims=0),
                   helper.make_node("Mul", ["h_sum", "h_zero"], ["h_z"]),
                   helper.make_node("Add", [f"{out}_pre", "h_z"], [out])])


def ints(name: str, values) -> onnx.TensorProto:
    return numpy_helper.from_array(np.array(values, np.int64), name)


def constant_of_shape(m):
    m.graph.initializer.append(ints("h_shape", [1 << 28]))
    one = helper.make_tensor("v", TensorProto.FLOAT, [1], [1.0])
    add_to_loss(m, [helper.make_node("ConstantOfShape", ["h_shape"], ["h_big"], value=one)],
                "h_big")


def loop(m):
    body = helper.make_graph([helper.make_node("Identity", ["c"], ["c_out"])], "body",
                             [helper.make_tensor_value_info("i", TensorProto.INT64, []),
                              helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
                             [helper.make_tensor_value_info("c_out", TensorProto.BOOL, [])])
    m.graph.initializer.extend([ints("h_trips", 1 << 62),
                                numpy_helper.from_array(np.array(True), "h_true")])
    add_to_loss(m, [helper.make_node("Loop", ["h_trips", "h_true"], [], body=body),
                    helper.make_node("Constant", [], ["h_one"], value_float=1.0)], "h_one")


def average_pool_grad(m):
    add_to_loss(m, [helper.make_node("Constant", [], ["h_x"], value=helper.make_tensor(
        "x", TensorProto.FLOAT, [1, 1, 4], [1.0] * 4)),
        helper.make_node("AveragePoolGrad", ["h_x"], ["h_dx"], kernel_shape=[2], strides=[2])],
        "h_dx")


def unknown_operator(m):
    add_to_loss(m, [helper.make_node("Constant", [], ["h_x"], value_float=1.0),
                    helper.make_node("Frobnicate", ["h_x"], ["h_y"], domain="evil.ops")], "h_y")
    m.opset_import.append(helper.make_opsetid("evil.ops", 1))


def huge_reshape(m):
    m.graph.initializer.append(ints("h_shape", [1 << 20, 1 << 20]))
    add_to_loss(m, [helper.make_node("Constant", [], ["h_x"], value_float=1.0),
                    helper.make_node("Reshape", ["h_x", "h_shape"], ["h_y"])], "h_y")


def zero_stride(m):
    for node in m.graph.node:
        if node.op_type == "Conv":
            for a in node.attribute:
                if a.name == "strides":
                    a.ints[:] = [0] * len(a.ints)
            return
    raise AssertionError("no Conv")


def zero_range_step(m):
    m.graph.initializer.extend([ints("h_a", 0), ints("h_b", 10), ints("h_d", 0)])
    add_to_loss(m, [helper.make_node("Range", ["h_a", "h_b", "h_d"], ["h_r"]),
                    helper.make_node("Cast", ["h_r"], ["h_rf"], to=TensorProto.FLOAT)], "h_rf")


def huge_unpool(m):
    """MaxUnpool's kernel sets its output's length: bounded as a constant-made tensor is."""
    add_to_loss(m, [helper.make_node("Constant", [], ["h_x"], value=helper.make_tensor(
        "x", TensorProto.FLOAT, [1, 1, 1], [1.0])),
        helper.make_node("Constant", [], ["h_i"], value=helper.make_tensor(
            "i", TensorProto.INT64, [1, 1, 1], [0])),
        helper.make_node("MaxUnpool", ["h_x", "h_i"], ["h_y"], kernel_shape=[1 << 30])], "h_y")


def local_function(m):
    m.functions.append(helper.make_function("evil.ops", "Nothing", ["x"], ["y"],
                                            [helper.make_node("Identity", ["x"], ["y"])],
                                            [helper.make_opsetid("", 17)]))


@pytest.mark.parametrize("change, message", [
    (constant_of_shape, "ConstantOfShape) makes a tensor of 268,435,456 elements from constants"),
    (loop, "Loop) holds a subgraph (control flow)"),
    (average_pool_grad, "AveragePoolGrad) is not on the device's list of operators"),
    (unknown_operator, "(evil.ops.Frobnicate) is not on the device's list of operators"),
    (huge_reshape, "Reshape) makes a tensor of 1,099,511,627,776 elements"),
    (zero_stride, "sets strides to [0"),
    (zero_range_step, "Range) counts with a step of 0"),
    (local_function, "defines 1 local function(s)"),
    (huge_unpool, "sets kernel_shape to [1073741824]; each value must lie in [1, 67108864]"),
])
def test_a_graph_that_would_do_more_than_the_exporters_is_refused(art, saved, change,  # noqa: F811
                                                                  message):
    edit(art, change)
    refused(resume(art, saved), saved, message)  # exit 2, nothing saved changed
    p = cli("measure", art, "--batch", "4", "--steps", "1")
    assert p.returncode == 2 and message in p.stderr and "Traceback" not in p.stderr, p.stderr


def constants_multiplied(m):
    """A 2^14 x 2^14 float product of two small constants: no size check sees it (MatMul is
    not a shape-making operator), and ORT's constant folding would compute it at load time,
    outside the arena (1 GiB)."""
    col = numpy_helper.from_array(np.ones((1 << 14, 1), np.float32), "h_col")
    row = numpy_helper.from_array(np.ones((1, 1 << 14), np.float32), "h_row")
    m.graph.initializer.extend([col, row])
    add_to_loss(m, [helper.make_node("MatMul", ["h_col", "h_row"], ["h_big"])], "h_big")


MAX_RSS_BYTES = 400 << 20  # the runtime, ORT and the tiny artifact: about 100 MB measured


def test_a_constant_computation_runs_under_the_cap_not_at_load(art, saved, tmp_path):  # noqa: F811
    """Without constant folding off (edgetrain/sessions.py) the process grows past 1 GiB while
    the session loads and the run exits 0 reporting a peak under its budget."""
    edit(art, constants_multiplied)
    code = ("import resource, subprocess, sys; p = subprocess.run(sys.argv[1:]); "
            "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024); "
            "sys.exit(p.returncode)")
    p = subprocess.run([sys.executable, "-c", code, sys.executable, "-m", "edgetrain.cli",
                        "personalise", str(art), "--data", str(saved["data"]), "--budget", "8MiB",
                        "--epochs", "1", "--out", str(tmp_path / "run")],
                       capture_output=True, text=True, cwd=ROOT, timeout=600,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert p.returncode == 3, p.stderr
    assert "needs more memory than the budget" in p.stderr and "Traceback" not in p.stderr
    assert int(p.stdout.split()[-1]) < MAX_RSS_BYTES, p.stdout
    assert not (tmp_path / "run" / "checkpoint").exists()


def test_every_graph_the_exporter_wrote_passes_the_device_check(tiny_artifact):
    """The contract holds both ways: the exporter checks its graphs with the device's check
    (exporters/export/operators.py), so its artifacts load; this one's manifest lists them all."""
    from edgetrain.graphcheck import check_model_file

    roles = json.loads((tiny_artifact / "manifest.json").read_text())["files"]
    checked = [role for role, f in roles.items() if f["path"].endswith(".onnx")]
    for role in checked:
        check_model_file(role, tiny_artifact / roles[role]["path"])
    assert {"training_model", "eval_model", "optimizer_model"} <= set(checked)
