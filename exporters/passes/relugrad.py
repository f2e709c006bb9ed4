"""Pass `relu_grads` (training graph): a gradient node rewritten where
onnxruntime-training 1.19.2's CPU kernel is slow, into standard operators
that compute the same values with ORT's vectorised, threaded kernels.

  ReluGrad(dY, Y) -> Mul(dY, HardSigmoid(Ceil(Y)))     (HardSigmoid with alpha 1, beta 0)
    ORT's CPU ReluGrad is a single-threaded Eigen select: 3.7 ms for a 1x64x112x112 tensor on
    this machine (2 threads), against about 0.5 ms for the rewrite (bench/gradkernels.py).
    ORT's gradient builder passes the Relu's *output* Y >= 0. Ceil(Y) is 0 where Y is 0 and a
    whole number >= 1 where Y > 0 (the smallest subnormal included), and HardSigmoid(a) =
    max(0, min(1, 1*a + 0)) clamps it to exactly 1: the mask is 1 exactly where ReluGrad passes
    the gradient (a NaN in dY or Y gives NaN, where ReluGrad would give 0). HardSigmoid writes
    into Ceil's buffer (ORT's activation kernels may run in place), so the mask costs one
    float tensor of Y's size, alive only between the nodes. Earlier masks: Cast(Greater(Y, 0))
    (about 0.64 ms, ORT's bool-to-float Cast being the slow part, and a bool tensor beside the
    float one) and Sign(Y) (1.25 ms: ORT's Sign is scalar code). If the second input is not a
    Relu's output the node is left as it is. The memory predictor sees the mask like any
    other tensor of the graph.

  ReluGrad(dY, Y), where no other backward node reads Y ->
      forward:  M = Greater(Y, 0); (Y', M') = PassThrough(Y, M); Y's forward readers read Y'
      backward: dX = Mul(dY, Cast(M', float))
    Where the ReluGrad is Y's only reader in backward (the next layer's weight is frozen:
    frozenconvgrad.py computes its input gradient without Y; or a pooling follows), keeping
    the float Y to the backward pass only to read its sign costs 4 bytes an element: the
    mask is a bool tensor, 1 byte an element, made in forward, and Y is freed after its last
    forward reader. PassThrough (ORT's zero-copy node, its outputs alias its inputs) makes the
    mask an ancestor of Y's forward readers, so ORT's execution order (reverse depth-first
    from the graph's leaves) computes it right after the Relu rather than just before the
    backward product (where Y would still be alive). The product passes dY exactly where
    Y > 0, as ReluGrad does; the float mask lives only while it runs. (Where(M', dY, 0) would
    skip the Cast, but ORT 1.19.2's CPU Where broadcasting a scalar corrupted the heap under
    the runtime's shared env arena: measured, `free(): invalid pointer`.)

MobileNetV1 a window at a time spent 15% of its kernel time in ReluGrad and 39% in ConvGrad
(ORT's profiler). Issue 40: the masks, with frozenconvgrad.py, are what lets an update plan
that freezes weights hold fewer activations than `all`.
"""
from __future__ import annotations

import onnx
from onnx import TensorProto, helper

from edgetrain import names
from exporters.graph import declare_like, ensure_ms_domain, is_backward
from exporters.passes.frozenconvgrad import SUFFIX as FROZEN_SUFFIX
from exporters.passes.pipeline import Context, Graphs, Pass

REWRITTEN_SUFFIX = "_fastgrad"
MASK_SUFFIX = names.RELU_MASK_SUFFIX


def rewrite_relu_grads(model: onnx.ModelProto, masks: bool = True) -> int:
    """Replace each ReluGrad whose second input is a Relu's output: by a bool mask made in
    forward and a product in backward where the ReluGrad is that output's only backward
    reader (and `masks`), else by Mul(dY, HardSigmoid(Ceil(Y))), in the ReluGrad's place.
    Returns how many were replaced."""
    relu_outputs = {n.output[0] for n in model.graph.node if n.op_type == "Relu"}
    masked = mask_candidates(model) if masks else set()
    forward = _forward_masks(model, masked)
    nodes, replaced = [], 0
    for node in model.graph.node:
        if node.name and ("moved", node.name) in forward:
            continue
        if node.op_type == "ReluGrad" and node.input[1] in masked:
            base = (node.name or node.output[0]) + MASK_SUFFIX
            as_float = node.output[0] + MASK_SUFFIX + "_float"
            nodes.append(helper.make_node("Cast", [forward[node.input[1]]], [as_float],
                                          name=base + "/cast", to=TensorProto.FLOAT))
            nodes.append(helper.make_node("Mul", [node.input[0], as_float], [node.output[0]],
                                          name=base + "/mul"))
            replaced += 1
            continue
        if node.op_type != "ReluGrad" or node.input[1] not in relu_outputs:
            nodes.append(node)
            if node.op_type == "Relu" and node.output[0] in masked:
                nodes.extend(forward[(node.output[0], "nodes")])
            continue
        base = (node.name or node.output[0]) + REWRITTEN_SUFFIX
        up = node.output[0] + "_ceil" + REWRITTEN_SUFFIX
        mask = node.output[0] + "_mask" + REWRITTEN_SUFFIX
        nodes.append(helper.make_node("Ceil", [node.input[1]], [up], name=base + "/ceil"))
        nodes.append(helper.make_node("HardSigmoid", [up], [mask], name=base + "/clamp",
                                      alpha=1.0, beta=0.0))
        nodes.append(helper.make_node("Mul", [node.input[0], mask], [node.output[0]],
                                      name=base + "/mul"))
        replaced += 1
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return replaced


def mask_candidates(model: onnx.ModelProto) -> set[str]:
    """The Relu outputs whose only backward reader is their ReluGrad (Shape nodes aside)."""
    relu_outputs = {n.output[0] for n in model.graph.node if n.op_type == "Relu"}
    backward_readers: dict[str, int] = {}
    for n in model.graph.node:
        if is_backward(n) and n.op_type != "Shape":  # a Shape moves to forward (below)
            for x in set(n.input):
                backward_readers[x] = backward_readers.get(x, 0) + 1
    return {n.input[1] for n in model.graph.node if n.op_type == "ReluGrad"
            and n.input[1] in relu_outputs and backward_readers.get(n.input[1]) == 1}


def _zero(model: onnx.ModelProto) -> str:
    name = "zero" + MASK_SUFFIX
    if not any(t.name == name for t in model.graph.initializer):
        model.graph.initializer.append(helper.make_tensor(name, TensorProto.FLOAT, [], [0.0]))
    return name


def _forward_masks(model: onnx.ModelProto, masked: set[str]) -> dict:
    """For each Relu output Y in `masked`: the forward nodes making its mask (under key
    (Y, "nodes")) and the mask's PassThrough name (under Y); Y's forward readers are pointed
    at the PassThrough's copy of Y, and both new tensors are declared."""
    if not masked:
        return {}
    ensure_ms_domain(model)
    zero = _zero(model)
    declared = {v.name: v for v in [*model.graph.value_info, *model.graph.input]}
    out: dict = {}
    for y in sorted(masked):
        mask, y_fwd, mask_fwd = (y + MASK_SUFFIX, y + MASK_SUFFIX + "_fwd",
                                 y + MASK_SUFFIX + "_kept")
        # backward Shape nodes of Y (a pooling's gradient reads its input's shape) run in
        # forward instead, their outputs kept through the same PassThrough
        shapes = [n for n in model.graph.node if n.op_type == "Shape" and is_backward(n)
                  and list(n.input) == [y] and n.name]
        kept = {n.output[0]: n.output[0] + MASK_SUFFIX + "_kept" for n in shapes}
        moved = []
        for n in shapes:
            copy = onnx.NodeProto()
            copy.CopyFrom(n)
            moved.append(copy)
            out[("moved", n.name)] = True
        out[(y, "nodes")] = [
            helper.make_node("Greater", [y, zero], [mask], name=mask + "/greater"), *moved,
            helper.make_node("PassThrough", [y, mask, *kept], [y_fwd, mask_fwd,
                             *kept.values()], name=mask + "/keep", domain="com.microsoft")]
        out[y] = mask_fwd
        for n in model.graph.node:
            if not is_backward(n):
                n.input[:] = [y_fwd if x == y else x for x in n.input]
            else:
                n.input[:] = [kept.get(x, x) for x in n.input]
        dims = None  # the masks are bool tensors of Y's shape (unsized where Y is)
        if y in declared:
            dims = [d.dim_value if d.HasField("dim_value") else d.dim_param
                    for d in declared[y].type.tensor_type.shape.dim]
        model.graph.value_info.append(helper.make_tensor_value_info(mask, TensorProto.BOOL,
                                                                    dims))
        # each PassThrough output declared as the input it passes
        declare_like(model, out[(y, "nodes")][-1:], lambda n, k, o: n.input[k])
    return out


def relu_grads(graphs: Graphs, ctx: Context) -> int:
    """Replace each ReluGrad of a Relu's output by a mask made in forward (where nothing
    else in backward reads the output, a frozen layer's input gradient was rewritten, and the
    static predictor gives the step a lower peak with the masks than without) or by
    Mul(dY, HardSigmoid(Ceil(Y)))."""
    frozen = any(FROZEN_SUFFIX in n.name for n in graphs.training.graph.node)
    if not frozen or not mask_candidates(graphs.training):
        # every weight trains: the only masks would be of ReLUs before a pooling, whose
        # mask adds a byte an element at the end-of-forward peak (imu_cnn, patch MobileNet:
        # never chosen), so no prediction is spent on them
        return rewrite_relu_grads(graphs.training, masks=False)
    if ctx.predictor is None:
        return rewrite_relu_grads(graphs.training)
    variants, counts = {}, {}
    for masks in (True, False):
        variants[masks] = graphs.copy()
        counts[masks] = rewrite_relu_grads(variants[masks].training, masks=masks)
    with_masks, without = (ctx.predicted_peak(variants[m]) for m in (True, False))
    # the predictor decides: a mask is one more tensor while Y is alive, so where the step
    # peaks before Y's last forward reader (the end of forward, under `all`) it costs
    masks = with_masks is None or without is None or with_masks < without
    graphs.training.CopyFrom(variants[masks].training)
    return counts[masks]


PASS = Pass("relu_grads", "training", relu_grads)
