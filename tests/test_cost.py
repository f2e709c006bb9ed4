"""FLOPs of a training step counted from the graph, checked by hand on the tiny net."""
from __future__ import annotations

import pytest

from device_sim.profiles import get_profile
from exporters.predictor.cost import ADAMW_FLOPS_PER_VALUE, step_cost


def test_tiny_net_conv_flops_by_hand(tiny_artifact):
    b = 4
    c = step_cost(str(tiny_artifact / "training_model.onnx"), b, trained_values=143)
    by_op = {}
    for _, op, f, _ in c.nodes:
        by_op[op] = by_op.get(op, 0) + f
    conv = 2 * b * 4 * 8 * 8 * 3 * 3 * 3  # 2 x N x Cout x H x W x Cin x kh x kw
    assert by_op["Conv"] == conv
    assert by_op["ConvGrad"] == conv  # only dW: the input needs no gradient
    assert by_op["Gemm"] >= 2 * b * 3 * 4  # classifier forward (plus its gradients)
    assert by_op["AdamWOptimizer"] == ADAMW_FLOPS_PER_VALUE * 143
    assert c.flops == sum(by_op.values()) and c.bytes_moved > 0


def test_roofline_time_scales_with_the_device(tiny_artifact):
    c = step_cost(str(tiny_artifact / "training_model.onnx"), 4, trained_values=143)
    slow, fast = get_profile("mcu-2mb"), get_profile("watch-app-high")
    t_slow = c.predicted_time_s(slow.compute_flops_per_s, slow.memory_bandwidth_bytes_per_s)
    t_fast = c.predicted_time_s(fast.compute_flops_per_s, fast.memory_bandwidth_bytes_per_s)
    assert t_slow > t_fast > 0
    assert t_slow == pytest.approx(sum(max(f / slow.compute_flops_per_s,
                                           b / slow.memory_bandwidth_bytes_per_s)
                                       for _, _, f, b in c.nodes))


def test_a_recompute_plan_counts_its_gradients_and_its_extra_forward(tmp_path):
    """Sparse layers under recompute: ConvGrad reads a rebuilt weight under a new name; its
    multiply-adds still count (they once fell to zero), and the step does more work than
    the same net without recompute."""
    from edgetrain.manifest import Plan
    from exporters.export import export_artifact
    import torch
    from test_recompute import chain  # a net deep enough for sqrt to checkpoint

    flops = {}
    for plan in ("none", "sqrt"):
        out = tmp_path / plan
        export_artifact(chain(), torch.zeros(2, 3, 32, 32), out, classes=list("abcd"),
                        plan=Plan(micro_batch=2), recompute=plan, density=0.5)
        rows = step_cost(str(out / "training_model.onnx"), 2, 1).nodes
        flops[plan] = {op: sum(f for _, o, f, _ in rows if o == op) for op in ("Conv", "ConvGrad")}
    assert flops["sqrt"]["ConvGrad"] == flops["none"]["ConvGrad"] > 0
    assert flops["sqrt"]["Conv"] > flops["none"]["Conv"]


def test_a_gru_counts_its_gates_matrix_products():
    """Issue 38: `measure` counted 0 FLOPs for a GRU. Over X [T, B, I] with hidden H, one
    direction: 2 x T x B x 3H x (I + H)."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from exporters.predictor.cost import node_costs

    t, b, i, h = 16, 4, 6, 12
    w = numpy_helper.from_array(np.zeros((1, 3 * h, i), np.float32), "W")
    r = numpy_helper.from_array(np.zeros((1, 3 * h, h), np.float32), "R")
    graph = helper.make_graph(
        [helper.make_node("Transpose", ["input"], ["X"], perm=[1, 0, 2]),  # [T, B, I]
         helper.make_node("GRU", ["X", "W", "R"], ["Y"], name="gru", hidden_size=h)], "g",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", t, i])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)], [w, r])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    rows = {name: flops for name, _, flops, _ in node_costs(model, b)}
    assert rows["gru"] == 2 * t * b * 3 * h * (i + h)
