"""Pass `depthwise_conv_grads` (training graph): a gradient node rewritten where
onnxruntime-training 1.19.2's CPU kernel is slow, into standard operators
that compute the same values with ORT's vectorised, threaded kernels.

  ConvGrad(dY, X, W) -> (dX, dW) of a depthwise convolution at stride 1 ->
      ConvGrad(dY, X, W) -> (-, dW)      the weight gradient alone
      dX = Conv(dY, flip(W))             a depthwise convolution with the kernel reversed
    ORT's CPU ConvGrad computes dX group by group, a GEMM and a col2im scatter per channel:
    2.73 ms for 32x112x112 at 3x3, of which the weight gradient is 0.69 ms; the same dX as a
    depthwise Conv runs in MLAS's direct kernel in 0.35 ms (bench:
    `bench/gradkernels.py`). At stride 1 and dilation 1 the input gradient of a correlation
    is the correlation of dY, padded by k-1-p, with the kernel flipped in every spatial axis:
    the same sums in another order (float rounding differs in the last bits). flip(W) is a
    Slice with step -1 (C x kernel floats). The Conv takes MLAS's working buffer, 64 KiB per
    thread, while it runs (the memory predictor models it as any forward Conv's): on a small
    layer that can raise a tiny network's peak by a third (measured), so a ConvGrad is
    rewritten only where that buffer, for the plan's threads, is small beside what the step
    holds: at most 1/8 of the input gradient at the plan's micro-batch, or at most 1/100 of
    the step's peak predicted before this rewrite (the Conv's buffer lives only while it
    runs and the Convs run one at a time, so the peak rises by at most one buffer: 1%).
    Strided, dilated or grouped-but-not-depthwise
    convolutions, and those whose shapes the graph does not state, are left as they are.

MobileNetV1 a window at a time spent 15% of its kernel time in ReluGrad and 39% in ConvGrad
(ORT's profiler).
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from exporters.graph import attributes, stated_shapes
from exporters.passes.relugrad import REWRITTEN_SUFFIX
from exporters.passes.pipeline import Context, Graphs, Pass


MLAS_CONV_BUFFER_BYTES_PER_THREAD = 16384 * 4  # MLAS_CONV_WORKING_BUFFER_SIZE_PER_THREAD
BUFFER_SHARE = 8  # rewrite where the Conv's working buffer is at most 1/8 of dX...
PEAK_SHARE = 100  # ...or at most 1/100 of the step's predicted peak


def depthwise_stride1(node, shapes: dict) -> tuple[list, list, list] | None:
    """(X shape, kernel, pads) if `node` is the ConvGrad of a depthwise convolution (one filter
    per channel) at stride 1 and dilation 1 whose channels, spatial sizes and kernel the graph
    states, else None. exporters/passes/stackedgrad.py takes the same layers' weight gradients."""
    if node.op_type != "ConvGrad":
        return None
    a = attributes(node)
    x, w = shapes.get(node.input[1]), shapes.get(node.input[2])
    group, kernel = int(a.get("group", 1)), list(a.get("kernel_shape", []))
    if not x or not w or len(x) < 3 or None in w or None in x[1:] or group == 1 or x[1] != group:
        return None
    if w[0] != group or w[1] != 1 or w[2:] != kernel or a.get("auto_pad", b"NOTSET") != b"NOTSET":
        return None
    rank = len(kernel)
    if any(s != 1 for s in a.get("strides", [1] * rank)) or any(
            d != 1 for d in a.get("dilations", [1] * rank)):
        return None
    return x, kernel, list(a.get("pads", [0] * 2 * rank))


def _depthwise_stride1(node, shapes: dict, micro_batch: int, threads: int,
                       peak_bytes: int | None = None) -> list[int] | None:
    """The input-gradient Conv's pads if `node` is a stride-1 depthwise ConvGrad
    (depthwise_stride1) whose input gradient is used, and the Conv's working buffer is
    small beside its input gradient at `micro_batch` (BUFFER_SHARE) or beside the step's
    predicted peak `peak_bytes` (PEAK_SHARE), else None."""
    found = depthwise_stride1(node, shapes)
    if found is None or not node.output or not node.output[0]:
        return None
    x, kernel, pads = found
    flipped = [k - 1 - p for k, p in zip(kernel * 2, pads)]
    if any(p < 0 for p in flipped):
        return None
    dx_bytes = micro_batch * int(np.prod(x[1:])) * 4
    buffer = max(1, threads) * MLAS_CONV_BUFFER_BYTES_PER_THREAD
    small = buffer * BUFFER_SHARE <= dx_bytes or (
        peak_bytes is not None and buffer * PEAK_SHARE <= peak_bytes)
    return flipped if small else None


def rewrite_depthwise_conv_grads(model: onnx.ModelProto, micro_batch: int = 1,
                                 threads: int = 1, peak_bytes: int | None = None) -> int:
    """Split each stride-1 depthwise ConvGrad (where the Conv's working buffer is small at
    `micro_batch` and `threads`, see BUFFER_SHARE and PEAK_SHARE) into its weight gradient
    and a depthwise Conv of dY with the flipped kernel for its input gradient, in place.
    Returns how many."""
    shapes = stated_shapes(model)
    nodes, replaced, consts = [], 0, {}
    for node in model.graph.node:
        pads = _depthwise_stride1(node, shapes, micro_batch, threads, peak_bytes)
        if pads is None:
            nodes.append(node)
            continue
        rank = len(pads) // 2
        if rank not in consts:
            consts[rank] = [f"{REWRITTEN_SUFFIX}_flip{rank}d_{k}" for k in
                            ("starts", "ends", "axes", "steps")]
            values = ([-1] * rank, [-(2 ** 62)] * rank, list(range(2, 2 + rank)), [-1] * rank)
            model.graph.initializer.extend(
                helper.make_tensor(n, onnx.TensorProto.INT64, [rank], v)
                for n, v in zip(consts[rank], values))
        base = (node.name or node.output[1]) + REWRITTEN_SUFFIX
        flipped = node.input[2] + "_flipped" + REWRITTEN_SUFFIX + f"_{replaced}"
        weight_only = helper.make_node("ConvGrad", list(node.input), ["", *node.output[1:]],
                                       name=base + "/weight", domain=node.domain)
        weight_only.attribute.extend(node.attribute)
        group = next(helper.get_attribute_value(a) for a in node.attribute if a.name == "group")
        kernel = shapes[node.input[2]][2:]
        nodes.append(weight_only)
        nodes.append(helper.make_node("Slice", [node.input[2], *consts[rank]], [flipped],
                                      name=base + "/flip"))
        nodes.append(helper.make_node("Conv", [node.input[0], flipped], [node.output[0]],
                                      name=base + "/input", group=group, kernel_shape=kernel,
                                      pads=pads, strides=[1] * rank, dilations=[1] * rank))
        replaced += 1
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return replaced


def depthwise_conv_grads(graphs: Graphs, ctx: Context) -> int:
    """Split each stride-1 depthwise ConvGrad into its weight gradient and a depthwise Conv of
    dY with the kernel flipped, where the Conv's working buffer is small beside the step."""
    return rewrite_depthwise_conv_grads(graphs.training, ctx.plan.micro_batch, ctx.plan.threads,
                                        ctx.predicted_peak(graphs))


PASS = Pass("depthwise_conv_grads", "training", depthwise_conv_grads)
