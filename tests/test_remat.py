"""Computed weights rebuilt in backward (exporters/plans/recompute/remat.py), on hand-made
graphs."""
from __future__ import annotations

from onnx import TensorProto, helper

from edgetrain import names
from exporters.graph import ancestors, producers
from exporters.plans.recompute import rematerialize_weights


def test_a_weight_read_through_a_backward_view_is_rebuilt_late():
    """A computed weight whose backward reader is a view with no late input of its own (the
    pointwise ConvGrad's Reshape of the folded weight) is rebuilt, ordered after a late input
    of the view's reader, and the forward weight is no longer read in backward."""
    f = TensorProto.FLOAT
    g = helper.make_graph(
        [helper.make_node("Mul", ["w", "s"], ["wf"], name="fold"),
         helper.make_node("MatMul", [names.INPUT_NAME, "wf"], ["y"], name="fwd"),
         helper.make_node("Neg", ["y"], ["y_grad"], name="loss_Grad/neg"),
         helper.make_node("Reshape", ["wf", "shape"], ["w2"], name="fwd_Grad/Reshape"),
         helper.make_node("MatMul", ["y_grad", "w2"], ["x_grad"], name="fwd_Grad/MatMul")],
        "g", [helper.make_tensor_value_info(n, f, [2, 2]) for n in (names.INPUT_NAME, "w", "s")],
        [helper.make_tensor_value_info("x_grad", f, [2, 2])],
        [helper.make_tensor("shape", TensorProto.INT64, [2], [2, 2])])
    m = helper.make_model(g)
    assert rematerialize_weights(m) == ("wf",)
    view = next(n for n in m.graph.node if n.name == "fwd_Grad/Reshape")
    assert view.input[0] != "wf" and names.REMAT_TAG in view.input[0]
    order = next(n for n in m.graph.node if n.op_type == "PassThrough")
    assert list(order.input) == ["s", "w", "y_grad"]  # after the gradient the MatMul reads


def test_a_view_whose_readers_only_read_what_comes_from_it_is_left_alone():
    """No late input to order the rebuilt chain after, except tensors computed from the
    view itself (ordering after those would be a cycle): the weight is kept, not rebuilt."""
    f = TensorProto.FLOAT
    g = helper.make_graph(
        [helper.make_node("Mul", ["w", "s"], ["wf"], name="fold"),
         helper.make_node("MatMul", [names.INPUT_NAME, "wf"], ["y"], name="fwd"),
         helper.make_node("Reshape", ["wf", "shape"], ["w2"], name="fwd_Grad/Reshape"),
         helper.make_node("Neg", ["w2"], ["b"], name="fwd_Grad/Neg"),
         helper.make_node("MatMul", ["b", "w2"], ["x_grad"], name="fwd_Grad/MatMul")],
        "g", [helper.make_tensor_value_info(n, f, [2, 2]) for n in (names.INPUT_NAME, "w", "s")],
        [helper.make_tensor_value_info("x_grad", f, [2, 2]), helper.make_tensor_value_info(
            "y", f, [2, 2])],
        [helper.make_tensor("shape", TensorProto.INT64, [2], [2, 2])])
    m = helper.make_model(g)
    assert rematerialize_weights(m) == ()
    assert not any(n.op_type == "PassThrough" for n in m.graph.node)


def test_ancestors_with_a_prebuilt_producer_map_walk_the_same_nodes():
    """remat.py walks one graph once per computed weight with one producer map: the walk is
    the one that builds its own map, stops included."""
    nodes = [helper.make_node("Mul", ["w", "s"], ["wf"], name="fold"),
             helper.make_node("Neg", ["wf"], ["wn"], name="neg"),
             helper.make_node("MatMul", [names.INPUT_NAME, "wn"], ["y"], name="fwd"),
             helper.make_node("Add", ["wn", "y"], ["z"], name="late")]
    index = producers(nodes)
    for targets in (["wn"], ["z"], ["wf", "y"]):
        assert ([n.name for n in ancestors(targets, nodes, producer=index)]
                == [n.name for n in ancestors(targets, nodes)])
    assert [n.name for n in ancestors(["wn"], nodes, producer=index)] == ["fold", "neg"]
    assert ancestors(["z"], nodes, stop=lambda n: n.name == "fwd", producer=index) is None
