"""Pass `stacked_depthwise_weight_grads` (training graph; the host target only): a depthwise
convolution's weight gradient as one depthwise convolution in MLAS's NCHWc kernels.

ORT 1.19.2's CPU ConvGrad makes a depthwise dW channel by channel and image by image (an
im2col and a one-row GEMM each): C6's 1024-channel 4 x 4 layer at 7 patches took 1.32 ms for
about a million multiply-adds. The same sums are one depthwise convolution once each
channel's images are stacked on top of each other:

    dW[c, i, j] = sum_n sum_{h, w} dY[n, c, h, w] * Xpad[n, c, h + i, w + j]

  S: X in NCHWc blocks (ReorderInput), [N, C/B, H, W*B] -> Transpose -> [C/B, N, H, W*B],
     each image's own pt, pb padding rows added (Pad): the NCHWc layout of [1, C, N*Hp, W]
  K: dY the same way with kh - 1 zero rows under each image: [C/B, N*(Ho + kh - 1), Wo, B],
     the NCHWc (OIHWBo) layout of a [C, 1, N*(Ho + kh - 1), Wo] depthwise filter
  dW = ReorderOutput(nchwc.Conv(S, K, group=C, pads=[0, pl, kh - 1, pr])) as [C, 1, kh, kw]

Each image takes Ho + kh - 1 rows of S and of K (its rows, then zeros), so a kernel row of
image n only meets rows of image n at the kh offsets the output has (the output is kh rows
high: the Conv's kh - 1 bottom padding rows close the last image). The filter's height
follows the micro-batch, so the Conv states no kernel_shape (the kernel takes it from K) and
the artifact trains at any micro-batch. Every tensor it allocates keeps the graph's symbolic
batch in its shape (the blocked reorder, the transposes, the pads), so ORT plans them in the
memory pattern, where backward has room; only the Conv's [1, C, kh, kw] output is new, and it
is declared. Taken: 2-D stride-1 undilated depthwise layers whose channels every block
divides, on a host with NCHWc kernels (elsewhere ORT's grouped Conv would be slower than its
ConvGrad). Measured (bench/gradkernels.py, one node, 2 threads, 7 patches): 1024 x 4 x 4
1.32 -> 0.11 ms, 128 x 16 x 16 0.54 -> 0.16 ms, 32 x 32 x 32 0.27 -> 0.17 ms; C6's step at
7 patches 3.33-3.40 -> 2.59-2.77 s, its peak unchanged to 0.04% (the predictor's figure, to
the byte, measured).
"""
from __future__ import annotations

import dataclasses

from onnx import TensorProto, helper

from edgetrain.names import NCHWC_DOMAIN
from exporters.passes.depthwisegrad import depthwise_stride1
from exporters.graph import int64_constant, stated_shapes
from exporters.passes.pipeline import Context, Graphs, Pass

SUFFIX = "_stackedgrad"


def stackable(x_shape, kernel: list, pads: list, channels_multiple: int, block: int) -> bool:
    """Whether a stride-1, undilated depthwise layer of input `x_shape` ([N, C, H, W]) and
    `kernel` ([kh, kw]) gets its weight gradient stacked (see the module's docstring)."""
    return (block > 1 and len(kernel) == 2 and x_shape is not None and len(x_shape) == 4
            and None not in x_shape[1:] and x_shape[1] % channels_multiple == 0
            and len(pads) == 4)


def stacked_weight_grad(graph, dy: str, x: str, dw: str, x_shape: list, kernel: list,
                        pads: list, base: str, block: int) -> list:
    """Nodes computing `dw` ([C, 1, kh, kw]) of a stride-1 depthwise convolution of `x`
    ([N, C, H, W]) whose output gradient is `dy`, with the forward's `pads`
    ([pt, pl, pb, pr]), in NCHWc kernels of `block` channels."""
    c, h, w = (int(d) for d in x_shape[1:])
    kh, kw = int(kernel[0]), int(kernel[1])
    pt, pl, pb, pr = (int(p) for p in pads)
    ho, wo = h + pt + pb - kh + 1, w + pl + pr - kw + 1
    b = base + SUFFIX

    def stack(t: str, rows: int, cols: int, above: int, below: int, name: str):
        """(nodes, their output): t [N, C, rows, cols] -> [C/block, N, above + rows + below,
        cols * block], NCHWc blocks of each channel group, image under image, with zero rows
        around each."""
        nodes = [helper.make_node("ReorderInput", [t], [f"{b}/{name}_in"], f"{b}/{name}_in",
                                  domain=NCHWC_DOMAIN),
                 helper.make_node("Reshape", [f"{b}/{name}_in", int64_constant(
                     graph, f"stackedgrad_blocks_{c}_{rows}_{cols}_{block}",
                     [0, c // block, rows, cols * block])], [f"{b}/{name}_4d"], f"{b}/{name}_4d"),
                 helper.make_node("Transpose", [f"{b}/{name}_4d"], [f"{b}/{name}_t"],
                                  f"{b}/{name}_t", perm=[1, 0, 2, 3])]
        if above or below:
            nodes.append(helper.make_node("Pad", [f"{b}/{name}_t", int64_constant(
                graph, f"stackedgrad_rows_{above}_{below}", [0, 0, above, 0, 0, 0, below, 0])],
                [f"{b}/{name}_p"], f"{b}/{name}_p"))
        return nodes, nodes[-1].output[0]

    k_nodes, k = stack(dy, ho, wo, 0, kh - 1, "k")
    s_nodes, s = stack(x, h, w, pt, pb, "s")
    nodes = k_nodes + s_nodes
    graph.value_info.append(helper.make_tensor_value_info(b + "/dw_nchwc", TensorProto.FLOAT,
                                                          [1, c, kh, kw]))
    nodes += [helper.make_node("Reshape", [k, int64_constant(graph, f"stackedgrad_k_{c}_{wo}",
                                                     [c, 1, -1, wo])], [b + "/k"], b + "/k"),
              helper.make_node("Reshape", [s, int64_constant(graph, f"stackedgrad_s_{c}_{w}",
                                                     [1, c, -1, w])], [b + "/s"], b + "/s"),
              helper.make_node("Conv", [b + "/s", b + "/k"], [b + "/dw_nchwc"], b + "/conv",
                               domain=NCHWC_DOMAIN, group=c, pads=[0, pl, kh - 1, pr],
                               strides=[1, 1]),
              helper.make_node("ReorderOutput", [b + "/dw_nchwc"], [b + "/dw4"], b + "/out",
                               domain=NCHWC_DOMAIN, channels=c),
              helper.make_node("Reshape", [b + "/dw4", int64_constant(graph, f"stackedgrad_w_{c}_{kh}_{kw}",
                                                              [c, 1, kh, kw])], [dw], b + "/dw")]
    return nodes


def rewrite_stacked_weight_grads(model, block: int, channels_multiple: int) -> int:
    """Make the weight gradient of each stride-1 depthwise ConvGrad the NCHWc pass will take
    (`stackable`) a stacked depthwise Conv (the module's docstring), in place; the ConvGrad
    keeps its input and bias gradients, if wanted. Returns how many."""
    graph = model.graph
    shapes = stated_shapes(model)
    out, count = [], 0
    for node in graph.node:
        found = depthwise_stride1(node, shapes)
        if (found is None or len(node.output) < 2 or not node.output[1]
                or not stackable(*found, channels_multiple, block)):
            out.append(node)
            continue
        rest = [node.output[0], "", *node.output[2:]]
        if any(rest):  # dX and/or dB, still ORT's (its dW loop is the slow part)
            kept = helper.make_node("ConvGrad", list(node.input), rest, node.name,
                                    domain=node.domain)
            kept.attribute.extend(node.attribute)
            out.append(kept)
        out += stacked_weight_grad(graph, node.input[0], node.input[1], node.output[1],
                                   *found, node.name or node.output[1], block)
        count += 1
    if count:
        del graph.node[:]
        graph.node.extend(out)
        if not any(o.domain == NCHWC_DOMAIN for o in model.opset_import):
            model.opset_import.append(helper.make_opsetid(NCHWC_DOMAIN, 1))
    return count


def stacked_depthwise_weight_grads(graphs: Graphs, ctx: Context) -> int:
    """Make the weight gradient of each stride-1 depthwise ConvGrad the NCHWc pass will take a
    stacked depthwise Conv in this machine's block."""
    from exporters.passes.nchwc import CHANNEL_MULTIPLE, host_block

    block = host_block()
    if block <= 1:
        return 0
    count = rewrite_stacked_weight_grads(graphs.training, block, CHANNEL_MULTIPLE)
    if count:  # blocked layouts in the graph: the block is recorded
        ctx.plan = dataclasses.replace(ctx.plan, nchwc_block=block)
    return count


PASS = Pass("stacked_depthwise_weight_grads", "training", stacked_depthwise_weight_grads,
            option="nchwc (the host target's default)", when=lambda ctx: ctx.nchwc,
            targets=("host",))
