"""Pass `frozen_conv_input_grads` (training graph): the gradient of a convolution whose weight
is frozen, computed without the convolution's input.

  ConvGrad(dY, X, W) -> (dX, -, dB)  where the weight W does not train  ->
      dX = ConvTranspose(dY, W)            same strides, pads, dilations and groups
      dB = ReduceSum(dY, axes 0, 2, ...)   where the bias trains
    ORT's gradient builder emits a ConvGrad for every convolution the gradient passes, and
    its kernel takes X as an input even when it computes no weight gradient: X (4 bytes an
    element) is then kept from the forward pass to the backward one only to be read for its
    shape. The input gradient of a correlation is the transposed convolution of dY with the
    same weight tensor ([M, C/group, k...] read as ConvTranspose's [in, out/group, k...]);
    `output_padding` restores the rows a strided convolution dropped, from X's stated shape.
    The bias gradient is dY summed over the batch and the spatial axes. Neither reads X, so
    X is freed after its last forward reader (under an update plan such as `bias` or `head`,
    every frozen layer's input). ConvTranspose's CPU kernel allocates a column buffer of
    (C/group) x kernel x dY's pixels floats while it runs, the size of ConvGrad's own.
    A ConvGrad left with no output (the depthwise input-gradient split, depthwisegrad.py,
    already computes dX, and nothing else is wanted) is removed. Convolutions whose input
    shape the graph does not state, or with `auto_pad`, are left as they are.

Issue 40: the patch MobileNet's `bias` plan held more than `all` because of these inputs.
"""
from __future__ import annotations

import onnx
from onnx import helper

from exporters.graph import attributes, int64_constant, stated_shapes
from exporters.passes.pipeline import Context, Graphs, Pass

SUFFIX = "_frozenw"


def output_padding(x: list, kernel: list, strides: list, pads: list,
                   dilations: list) -> list[int]:
    """The rows a strided convolution of an input of spatial shape `x` leaves unread at the
    end of each axis: what ConvTranspose adds to give dX X's shape."""
    rank = len(kernel)
    out = []
    for i in range(rank):
        span = dilations[i] * (kernel[i] - 1) + 1
        y = (x[i] + pads[i] + pads[i + rank] - span) // strides[i] + 1
        out.append(x[i] - ((y - 1) * strides[i] - pads[i] - pads[i + rank] + span))
    return out


def _frozen_geometry(node, shapes: dict) -> dict | None:
    """ConvTranspose's attributes for this frozen-weight ConvGrad, or None where the graph
    does not state what they need."""
    a = attributes(node)
    x = shapes.get(node.input[1])
    if a.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET"):
        return None
    if not x or len(x) < 3 or any(d is None for d in x[2:]):
        return None
    kernel = list(a.get("kernel_shape") or [])
    if len(kernel) != len(x) - 2:
        return None
    rank = len(kernel)
    strides = list(a.get("strides") or [1] * rank)
    pads = list(a.get("pads") or [0] * 2 * rank)
    dilations = list(a.get("dilations") or [1] * rank)
    extra = output_padding(x[2:], kernel, strides, pads, dilations)
    if any(e < 0 or e >= max(s, d) for e, s, d in zip(extra, strides, dilations)):
        return None
    return {"group": int(a.get("group", 1)), "kernel_shape": kernel, "strides": strides,
            "pads": pads, "dilations": dilations, "output_padding": extra}


def rewrite_frozen_conv_grads(model: onnx.ModelProto) -> int:
    """Replace each ConvGrad that computes no weight gradient by a ConvTranspose for dX and a
    ReduceSum for dB (each only where wanted), in place. Returns how many were replaced."""
    shapes = stated_shapes(model)
    nodes, replaced = [], 0
    for node in model.graph.node:
        outs = list(node.output) + [""] * (3 - len(node.output))
        rank = len(attributes(node).get("kernel_shape") or [])
        if node.op_type != "ConvGrad" or outs[1] or not rank:
            nodes.append(node)
            continue
        geometry = _frozen_geometry(node, shapes) if outs[0] else {}
        if geometry is None:
            nodes.append(node)
            continue
        base = (node.name or node.input[2]) + SUFFIX
        if outs[0]:
            nodes.append(helper.make_node("ConvTranspose", [node.input[0], node.input[2]],
                                          [outs[0]], name=base + "/input", **geometry))
        if outs[2]:
            axes = int64_constant(model.graph, f"{SUFFIX}_bias_axes{rank}d",
                                  [0, *range(2, 2 + rank)])
            nodes.append(helper.make_node("ReduceSum", [node.input[0], axes], [outs[2]],
                                          name=base + "/bias", keepdims=0))
        replaced += 1
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return replaced


def frozen_conv_input_grads(graphs: Graphs, ctx: Context) -> int:
    """Compute each frozen-weight convolution's input gradient as a ConvTranspose of dY (and
    its bias gradient as a ReduceSum), so its input is not kept for backward."""
    return rewrite_frozen_conv_grads(graphs.training)


PASS = Pass("frozen_conv_input_grads", "training", frozen_conv_input_grads)
