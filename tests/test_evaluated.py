"""exporters/predictor/evaluated.py: forward shapes from running the eval graph, run once per
graph's bytes (the optimal recompute planner predicts dozens of artifacts that share one eval
graph, each written to a folder of its own)."""
from __future__ import annotations

import onnx
from onnx import TensorProto, helper

from exporters.predictor import evaluated
from edgetrain import names


def eval_graph(width: int) -> onnx.ModelProto:
    """input [B, 3] -> MatMul by a [3, width] weight -> Relu."""
    x = helper.make_tensor_value_info(names.INPUT_NAME, TensorProto.FLOAT, ["B", 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["B", width])
    w = helper.make_tensor("w", TensorProto.FLOAT, [3, width], [0.5] * (3 * width))
    g = helper.make_graph([helper.make_node("MatMul", [names.INPUT_NAME, "w"], ["h"]),
                           helper.make_node("Relu", ["h"], ["y"])], "g", [x], [y], [w])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_equal_graphs_run_once_and_a_changed_one_again(tmp_path, monkeypatch):
    runs = []
    run = evaluated._run_shapes
    monkeypatch.setattr(evaluated, "_run_shapes",
                        lambda data, batch: runs.append(batch) or run(data, batch))
    monkeypatch.setattr(evaluated, "_RUNS", type(evaluated._RUNS)())
    for k, width in enumerate((4, 4, 5)):  # a copy in another folder, then a changed graph
        path = tmp_path / str(k) / "eval_model.onnx"
        path.parent.mkdir()
        onnx.save(eval_graph(width), str(path))
        shapes = evaluated.forward_shapes(str(path), 8)
        assert shapes["h"] == ((8, width), 4) and shapes["y"] == ((8, width), 4)
    assert runs == [1, 2, 1, 2]  # batch 1 and 2 for width 4 once, again for width 5
    shapes["y"] = None  # a caller's changes do not reach the cache
    assert evaluated.forward_shapes(str(path), 8)["y"] == ((8, 5), 4)
