"""Pass `fold_conv_batchnorms` (forward graph, before ORT builds its gradients): a convolution
followed by a frozen BatchNorm, folded into one convolution of the forward graph.

FrozenBatchNorm (exporters/models/norms.py) exports as two elementwise passes over the convolution's
output, `Mul(y, scale)` then `Add(., shift)`, with scale and shift per-channel vectors [C]
shaped to [1, C, 1, ...]. Its gradient adds four more passes of that size (dY * scale, dY * y
and two ReduceSums), and a recompute plan runs the forward pair again: eight activation-sized
passes per layer, where PyTorch's fused BatchNorm makes about four. Since

    Conv(x, W, B) * scale + shift  ==  Conv(x, W * scale[:, None, ...], B * scale + shift)

the pair is folded into the convolution: the scale multiplies the weight (weight-sized), the
shift becomes the convolution's bias (added inside the convolution's own kernel), and ORT's
gradient builder derives dW, dscale and dshift from ConvGrad's weight and bias gradients,
all weight- or channel-sized. Same parameters, same names, the same values up to float
rounding (the products are taken in another order).

A layer is folded only where the weight is at most as large as the convolution's output at
the plan's micro-batch (WEIGHT_SHARE): the scaled weight is a new weight-sized tensor each
call, so a late MobileNet layer (a 1024 x 1024 weight over 7 x 7 pixels) keeps its
elementwise pair. Nor where the convolution's weight does not train (update plans such as
`head` or `bias`): if the BatchNorm trains, its scale's gradient would need the
convolution's weight gradient, a convolution's worth of work the unfolded pair does
without; if nothing trains, ORT folds the scaled weight into a constant, a second copy of the
frozen weight held for the whole run (measured: the 1-D CNN's `head` plan 0.98 -> 1.18 MB).
Patterns this module does not recognise are left alone: a convolution whose
output has another reader, a scale or shift that is not a [C] vector viewed as [1, C, 1...],
shapes the graph does not state.
"""
from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import helper, numpy_helper

from exporters.graph import ancestors, stated_shapes
from exporters.passes.pipeline import Context, Graphs, Pass

FOLDED_SUFFIX = "_bnfold"
WEIGHT_SHARE = 1.0  # fold where weight elements <= this x the conv output's elements


def _constants(graph: onnx.GraphProto) -> dict[str, np.ndarray]:
    out = {i.name: numpy_helper.to_array(i) for i in graph.initializer}
    for n in graph.node:
        if n.op_type == "Constant" and n.attribute and n.attribute[0].name == "value":
            out[n.output[0]] = numpy_helper.to_array(n.attribute[0].t)
    return out


def _channel_vector(name: str, producer: dict, consts: dict, rank: int) -> str | None:
    """The [C] vector behind `name` if `name` is Reshape(vector, [1, -1 or C, 1, ...]) of
    rank `rank`, else None."""
    node = producer.get(name)
    if node is None or node.op_type != "Reshape" or node.input[1] not in consts:
        return None
    shape = [int(v) for v in consts[node.input[1]].reshape(-1)]
    if len(shape) != rank or shape[0] != 1 or any(v != 1 for v in shape[2:]):
        return None
    return node.input[0]


def _computed_from(name: str, nodes: list, names: set[str]) -> bool:
    """Whether the tensor `name` is, or is computed from, one of `names`."""
    return name in names or any(i in names for n in ancestors([name], nodes) for i in n.input)


def fold_conv_batchnorms(model: onnx.ModelProto, micro_batch: int,
                         trainable: set[str] | None = None) -> int:
    """Fold each Conv -> Mul(scale) -> Add(shift) of a frozen BatchNorm into one Conv, in place,
    where WEIGHT_SHARE allows at `micro_batch` and the Conv's weight is computed from one of
    `trainable` (None: every parameter trains). Returns how many layers were folded."""
    graph = model.graph
    if trainable is None:
        trainable = {i.name for i in graph.initializer}
    consts = _constants(graph)
    shapes = stated_shapes(onnx.shape_inference.infer_shapes(model))
    producer = {o: n for n in graph.node for o in n.output if o}
    readers: dict[str, list] = {}
    for n in graph.node:
        for i in n.input:
            readers.setdefault(i, []).append(n)
    outputs = {o.name for o in graph.output}
    replace: dict[int, list] = {}  # id(the pair's Add) -> the nodes in its place
    dropped: set[int] = set()
    views: set[str] = set()  # the scale and shift views the folded pairs read
    for conv in graph.node:
        if conv.op_type != "Conv" or conv.output[0] in outputs:
            continue
        y, w = conv.output[0], conv.input[1]
        out_shape, w_shape = shapes.get(y), shapes.get(w)
        if not out_shape or not w_shape or None in out_shape[1:] or None in w_shape:
            continue
        if math.prod(w_shape) > WEIGHT_SHARE * micro_batch * math.prod(out_shape[1:]):
            continue
        muls = readers.get(y, [])
        if len(muls) != 1 or muls[0].op_type != "Mul" or muls[0].output[0] in outputs:
            continue
        mul = muls[0]
        scale = _channel_vector(mul.input[1] if mul.input[0] == y else mul.input[0],
                                producer, consts, len(out_shape))
        adds = readers.get(mul.output[0], [])
        if scale is None or len(adds) != 1 or adds[0].op_type != "Add":
            continue
        add = adds[0]
        shift = _channel_vector(add.input[1] if add.input[0] == mul.output[0] else add.input[0],
                                producer, consts, len(out_shape))
        if shift is None or shapes.get(scale) != [w_shape[0]] or shapes.get(shift) != [w_shape[0]]:
            continue
        if not _computed_from(w, list(graph.node), trainable):
            continue  # a frozen weight: keep the pair (see the module's docstring)
        base = (conv.name or y) + FOLDED_SUFFIX
        view = base + "/weight_view"
        nodes = [helper.make_node("Constant", [], [view], name=view, value=numpy_helper.from_array(
                     np.array([-1] + [1] * (len(w_shape) - 1), np.int64), view)),
                 helper.make_node("Reshape", [scale, view], [base + "/scale"], name=base + "/scale"),
                 helper.make_node("Mul", [w, base + "/scale"], [base + "/weight"],
                                  name=base + "/weight")]
        bias = shift
        if len(conv.input) > 2 and conv.input[2]:
            nodes += [helper.make_node("Mul", [conv.input[2], scale], [base + "/bias_scaled"],
                                       name=base + "/bias_scaled"),
                      helper.make_node("Add", [base + "/bias_scaled", shift], [base + "/bias"],
                                       name=base + "/bias")]
            bias = base + "/bias"
        folded = helper.make_node("Conv", [conv.input[0], base + "/weight", bias],
                                  [add.output[0]], name=base)
        folded.attribute.extend(conv.attribute)
        replace[id(add)] = nodes + [folded]  # where the shift is known: topological order
        dropped.update({id(conv), id(mul)})
        views.update(x for x in (*mul.input, *add.input) if x not in (y, mul.output[0]))
    if not replace:
        return 0
    kept = []
    for n in graph.node:
        if id(n) in replace:
            kept.extend(replace[id(n)])
        elif id(n) not in dropped:
            kept.append(n)
    read = {i for n in kept for i in n.input} | outputs
    unread = {v for v in views if v not in read}  # views only the folded pairs read
    del graph.node[:]
    graph.node.extend(n for n in kept if not (n.op_type == "Reshape" and n.output[0] in unread))
    return len(replace)


def fold_frozen_batchnorms(graphs: Graphs, ctx: Context) -> int:
    """Fold each frozen BatchNorm after a Conv whose weight trains into the Conv."""
    return fold_conv_batchnorms(graphs.forward, ctx.plan.micro_batch, set(ctx.trainable))


PASS = Pass("fold_conv_batchnorms", "forward", fold_frozen_batchnorms)
