"""Pass `masked_pointwise_grads` (training graph; `weight_grad` kept): the weight gradient of a
masked pointwise convolution, computed for its kept weights only.

ORT's gradient of a masked layer (exporters/plans/sparse.py) is a dense one: ConvGrad writes the
whole dense dW, which is flattened and read back at the kept positions,

    ConvGrad(dY, X, W) -> (dX, dW),  Reshape(dW, [numel]),  GatherElements(., positions)

so a 1024 x 1024 layer holds a 4 MiB dW to hand on its 5% kept entries. For a pointwise
convolution (a 1 x 1 kernel, stride 1, one group, no padding) the kept entry at flat position
p = o * C_in + i is a dot product over the batch and the pixels,

    dW[o, i] = sum over n, hw of dY[n, o, hw] * X[n, i, hw],

so the rewrite computes exactly those:

    rows = Div(positions, C_in)   cols = Sub(positions, Mul(rows, C_in))    (int32, [nnz])
    grad = ReduceSum(Mul(Gather(dY3, rows, axis 1), Gather(X3, cols, axis 1)), axes [0, 2])

with dY3, X3 the [N, C, pixels] views. ConvGrad keeps its other outputs (dX, dB) and no longer
writes dW. The two gathered tensors hold N x pixels x nnz floats each, so the kept positions
are taken in pieces (a Split; each piece's nodes listed together, so ORT runs one piece after
the other) that each hold at most 1/PIECE_SHARE of the dense dW at the plan's micro-batch; a
layer that would need more than MAX_PIECES keeps the dense gradient (on the patch
MobileNet's 4 x 4 late maps at one patch, its two widest layers go in 11 and 7 pieces; a
full-image MobileNet's 7 x 7 maps are not rewritten). The values are the same sums in another
order (float rounding in the last bits). Any other pattern (a folded BatchNorm scaling dW, a
strided or grouped convolution, shapes the graph does not state, a dW read by anything else)
is left as it is.
"""
from __future__ import annotations

import math

import onnx
from onnx import helper

from exporters.graph import attributes, stated_shapes
from exporters.passes.pipeline import Context, Graphs, Pass

SPARSE_GRAD_SUFFIX = "_sparsegrad"
WEIGHT_GRADS = ("dense", "kept")  # the plan's weight_grad: ORT's dense dW, or this module's
PIECE_SHARE = 4  # one piece's gathers hold at most 1/4 of the dense dW...
MAX_PIECES = 16  # ...in at most this many pieces (else the layer is left as it is)


def pointwise_conv_grad(node, shapes) -> tuple[int, int, list[int]] | None:
    """(C_out, C_in, pixel dims) if `node` is the ConvGrad of a stride-1, ungrouped, unpadded
    pointwise convolution that makes a weight gradient and whose shapes the graph states,
    else None (exporters/passes/pointwisegrad.py takes the same convolutions)."""
    if node.op_type != "ConvGrad" or len(node.output) < 2 or not node.output[1]:
        return None
    a = attributes(node)
    x, w = shapes.get(node.input[1]), shapes.get(node.input[2])
    if not x or not w or len(x) != len(w) or len(w) < 3 or None in w or None in x[1:]:
        return None
    rank = len(w) - 2
    if int(a.get("group", 1)) != 1 or any(k != 1 for k in w[2:]):
        return None
    if any(int(v) != 1 for v in list(a.get("strides", [])) + list(a.get("dilations", []))):
        return None
    if any(int(v) != 0 for v in a.get("pads", [])) or a.get("auto_pad", b"NOTSET") not in (
            b"NOTSET", "NOTSET", b"VALID", "VALID"):
        return None
    if x[1] != w[1] or len(x) != rank + 2:
        return None
    return int(w[0]), int(w[1]), [int(d) for d in x[2:]]


def pieces_for(micro_batch: int, pixels: int, nnz: int, c_out: int, c_in: int) -> int | None:
    """How many pieces the kept entries are taken in, so that one piece's two gathers hold at
    most 1/PIECE_SHARE of the dense dW; None where that takes more than MAX_PIECES."""
    gathered = 2 * micro_batch * pixels * nnz
    pieces = max(1, -(-gathered * PIECE_SHARE // (c_out * c_in)))
    return pieces if pieces <= min(MAX_PIECES, nnz) else None


def rewrite_masked_pointwise_grads(model: onnx.ModelProto, micro_batch: int) -> int:
    """Compute the weight gradient of each masked pointwise convolution at its kept positions
    only (see pieces_for); in place. Returns how many ConvGrads were rewritten."""
    graph = model.graph
    shapes = stated_shapes(model)
    readers: dict[str, list] = {}
    for n in graph.node:
        for x in n.input:
            readers.setdefault(x, []).append(n)
    replace: dict[int, list] = {}  # id(node) -> nodes in its place
    drop: set[int] = set()
    for node in graph.node:
        dims = pointwise_conv_grad(node, shapes)
        if dims is None:
            continue
        c_out, c_in, pixels = dims[0], dims[1], math.prod(dims[2])
        dw = node.output[1]
        if len(readers.get(dw, [])) != 1 or readers[dw][0].op_type != "Reshape":
            continue
        flat = readers[dw][0]
        if len(readers.get(flat.output[0], [])) != 1:
            continue
        gather = readers[flat.output[0]][0]
        if gather.op_type != "GatherElements" or gather.input[0] != flat.output[0] or int(
                attributes(gather).get("axis", 0)) != 0:
            continue
        positions = gather.input[1]
        nnz_shape = shapes.get(positions)
        if not nnz_shape or len(nnz_shape) != 1 or nnz_shape[0] is None:
            continue
        nnz, index_type = int(nnz_shape[0]), _elem_type(graph, positions)
        pieces = pieces_for(micro_batch, pixels, nnz, c_out, c_in)
        if index_type not in (onnx.TensorProto.INT32, onnx.TensorProto.INT64) or not pieces:
            continue
        replace[id(node)] = _nodes(node, positions, index_type, gather.output[0], c_in,
                                   _sizes(nnz, pieces), graph)
        drop.update((id(flat), id(gather)))
    if replace:
        kept = []
        for n in graph.node:
            if id(n) in drop:
                continue
            kept.extend(replace.get(id(n), [n]))
        del graph.node[:]
        graph.node.extend(kept)
    return len(replace)


def _sizes(nnz: int, pieces: int) -> list[int]:
    base, extra = divmod(nnz, pieces)
    return [base + (1 if k < extra else 0) for k in range(pieces)]


def _elem_type(graph, name: str) -> int | None:
    for v in [*graph.input, *graph.value_info]:
        if v.name == name:
            return v.type.tensor_type.elem_type
    return next((i.data_type for i in graph.initializer if i.name == name), None)


def _nodes(conv_grad, positions: str, index_type: int, grad: str, c_in: int,
           sizes: list[int], graph) -> list:
    """ConvGrad without dW, then the kept entries' gradient, piece by piece, written to
    `grad`. Each piece's nodes are listed together: ORT runs ready nodes in list order, so
    one piece's gathers are freed before the next piece's are made."""
    base = (conv_grad.name or conv_grad.output[0]) + SPARSE_GRAD_SUFFIX
    t = f"{positions}{SPARSE_GRAD_SUFFIX}"  # not named like a gradient: these hold indices too
    const = {"c_in": (index_type, [], [c_in]), "view": (onnx.TensorProto.INT64, [3], [0, 0, -1]),
             "axes": (onnx.TensorProto.INT64, [2], [0, 2]),
             "sizes": (onnx.TensorProto.INT64, [len(sizes)], sizes)}
    c = {key: f"{t}_{key}" for key in const}
    graph.initializer.extend(helper.make_tensor(c[key], kind, dims, v)
                             for key, (kind, dims, v) in const.items())
    weight_less = helper.make_node("ConvGrad", list(conv_grad.input),
                                   [conv_grad.output[0], "", *conv_grad.output[2:]],
                                   name=conv_grad.name, domain=conv_grad.domain)
    weight_less.attribute.extend(conv_grad.attribute)
    dy, x = conv_grad.input[0], conv_grad.input[1]
    out = [weight_less,
           # [N, C, *pixels] -> [N, C, pixels] (0: keep that dimension)
           helper.make_node("Reshape", [dy, c["view"]], [f"{t}_dy3"], name=f"{base}/dy3"),
           helper.make_node("Reshape", [x, c["view"]], [f"{t}_x3"], name=f"{base}/x3")]
    parts = [f"{t}_positions{k}" for k in range(len(sizes))]
    if len(sizes) > 1:
        out.append(helper.make_node("Split", [positions, c["sizes"]], parts, name=f"{base}/split",
                                    axis=0))
    else:
        parts = [positions]
    sums = []
    for k, part in enumerate(parts):
        p, b = f"{t}{k}", f"{base}/{k}"
        out += [
            helper.make_node("Div", [part, c["c_in"]], [f"{p}_rows"], name=f"{b}/rows"),
            helper.make_node("Mul", [f"{p}_rows", c["c_in"]], [f"{p}_row_starts"],
                             name=f"{b}/row_starts"),
            helper.make_node("Sub", [part, f"{p}_row_starts"], [f"{p}_cols"], name=f"{b}/cols"),
            helper.make_node("Gather", [f"{t}_dy3", f"{p}_rows"], [f"{p}_gy"], name=f"{b}/gy",
                             axis=1),
            helper.make_node("Gather", [f"{t}_x3", f"{p}_cols"], [f"{p}_gx"], name=f"{b}/gx",
                             axis=1),
            helper.make_node("Mul", [f"{p}_gy", f"{p}_gx"], [f"{p}_prod"], name=f"{b}/prod"),
            helper.make_node("ReduceSum", [f"{p}_prod", c["axes"]],
                             [grad if len(parts) == 1 else f"{p}_sum"], name=f"{b}/sum",
                             keepdims=0)]
        sums.append(f"{p}_sum")
    if len(parts) > 1:
        out.append(helper.make_node("Concat", sums, [grad], name=f"{base}/concat", axis=0))
    return out


def masked_pointwise_grads(graphs: Graphs, ctx: Context) -> int:
    """Compute each masked pointwise layer's weight gradient at its kept weights only. It runs
    after the recompute plan and after the mask-gradient side graph is cut from the training
    graph (that graph needs the dense dW: RigL grows by it)."""
    return rewrite_masked_pointwise_grads(graphs.training, ctx.plan.micro_batch)


PASS = Pass("masked_pointwise_grads", "training", masked_pointwise_grads,
            option="weight_grad kept", when=lambda ctx: ctx.plan.weight_grad == "kept")
