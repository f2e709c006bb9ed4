"""Pass `nchwc_convs` (training graph; the host target only): depthwise convolutions in ONNX
Runtime's NCHWc kernels.

onnxruntime 1.19.2's CPU Conv runs a depthwise convolution group by group (an im2col and a
one-row GEMM per channel and image; MLAS's direct depthwise kernel is built for WebAssembly
only). On small feature maps that is nearly all overhead: C6's 1024-channel 4x4 layer at 28
patches took 3.2 ms forward where the arithmetic is 4.1 M multiply-adds. ORT also ships
MLAS's blocked-channel kernels (the com.microsoft.nchwc domain: ReorderInput, Conv,
ReorderOutput), which its own NchwcTransformer uses only in inference graphs whose weights are
constants, never in a training graph whose weights are inputs. This rewrite puts them into
the training graph once every other rewrite is done, so it also takes the recompute copies
and gradkernels' input-gradient Convs (dY with the kernel reversed):

  Conv(X, W, B) of a 2-D depthwise layer -> ReorderOutput(nchwc.Conv(ReorderInput(X), W', B))
    W': the [C, 1, kh, kw] filter in MLAS's OIHWBo order (blocks of `block` output channels
    innermost): Reshape [C/block, block, kh*kw], Transpose, Reshape back; a few thousand
    floats, computed once per weight tensor and call.

Measured (bench/nchwc.py, AVX-512): the 1024-channel 4x4 layer at 28 patches 3.24 -> 0.13 ms
with both reorders, 32 channels at 32x32 1.21 -> 0.46 ms; C6's step 1.2x (one patch) to 1.4x
(28) faster. The reorders cost two copies
of the layer's input and output while it runs (the memory predictor models them as any
tensors of the graph). Stride-1 depthwise weight gradients become stacked NCHWc Convs first
(exporters/passes/stackedgrad.py, the pass before this one): an earlier stacked form, padded in
plain NCHW, lost what it saved to ORT's Pad on short rows; padding whole NCHWc rows does not.
Strided layers keep ORT's ConvGrad (their input gradient would need a zero-spreading Pad).

The block is the host's: 16 channels with AVX-512, 8 with AVX2 (MLAS picks it at start-up;
edgetrain.nchwcprobe finds it). The manifest records it (plan.nchwc_block) and the runtime
refuses an artifact whose block its own ORT does not use. Layers whose channels are not a
multiple of 16 (every block divides them), 1-D and dilated convolutions are left as they
are. Values equal ORT's own kernel's to float rounding (the sums run in another order).
"""
from __future__ import annotations

import dataclasses
import functools
import onnx
from onnx import helper

from edgetrain.names import NCHWC_DOMAIN
from edgetrain.nchwcprobe import nchwc_block
from exporters.graph import attributes, int64_constant
from exporters.passes.pipeline import Context, Graphs, Pass

SUFFIX = "_nchwc"
CHANNEL_MULTIPLE = 16  # a layer's channels must be a multiple of every block MLAS uses (8, 16)


@functools.lru_cache(maxsize=1)
def host_block() -> int:
    """This machine's NCHWc block (edgetrain.nchwcprobe), found once per process."""
    import onnxruntime as ort

    return nchwc_block(ort)


def _depthwise(node, shapes) -> tuple[list, dict] | None:
    """(W shape, attributes) of a 2-D depthwise Conv whose channels the NCHWc kernels take,
    else None."""
    if node.op_type != "Conv" or node.domain not in ("", "ai.onnx"):
        return None
    x, w = shapes.get(node.input[0]), shapes.get(node.input[1])
    a = attributes(node)
    if not x or not w or len(x) != 4 or len(w) != 4 or None in x[1:] or None in w:
        return None
    c = x[1]
    if int(a.get("group", 1)) != c or w[0] != c or w[1] != 1 or c % CHANNEL_MULTIPLE:
        return None
    if any(d != 1 for d in a.get("dilations", [1, 1])) or a.get("auto_pad", b"NOTSET") not in (
            b"NOTSET", "NOTSET"):
        return None
    a.setdefault("strides", [1, 1])
    a.setdefault("pads", [0, 0, 0, 0])
    return w, a


class _Builder:
    """New nodes and constants for one graph, named after the node they replace."""

    def __init__(self, model: onnx.ModelProto, block: int):
        self.model, self.block, self.reordered = model, block, {}

    def const(self, name: str, values) -> str:
        return int64_constant(self.model.graph, name, values)

    def filter_for(self, w: str, wshape: list, base: str, nodes: list) -> str:
        """W in OIHWBo order (computed once per weight tensor)."""
        if w in self.reordered:
            return self.reordered[w]
        c, kw = wshape[0], wshape[3]  # kh: -1, a stacked kernel's height follows the batch
        out = w + SUFFIX
        nodes += [helper.make_node("Reshape", [w, self.const(base + "/fs1", [
                      c // self.block, self.block, -1])], [out + "_3d"], name=base + "/f1"),
                  helper.make_node("Transpose", [out + "_3d"], [out + "_t"], perm=[0, 2, 1],
                                   name=base + "/ft"),
                  helper.make_node("Reshape", [out + "_t", self.const(base + "/fs2",
                                                                      [c, 1, -1, kw])],
                                   [out], name=base + "/f2")]
        self.reordered[w] = out
        return out

    def conv(self, x: str, w: str, wshape: list, bias: str | None, y: str, a: dict,
             base: str, nodes: list) -> None:
        """y = depthwise Conv(x, w, bias) with attributes a, in NCHWc."""
        c = wshape[0]
        wr = self.filter_for(w, wshape, base, nodes)
        nodes += [helper.make_node("ReorderInput", [x], [y + SUFFIX + "_in"], name=base + "/in",
                                   domain=NCHWC_DOMAIN),
                  helper.make_node("Conv", [y + SUFFIX + "_in", wr] + ([bias] if bias else []),
                                   [y + SUFFIX + "_out"], name=base + "/conv",
                                   domain=NCHWC_DOMAIN, group=c, strides=list(a["strides"]),
                                   pads=list(a["pads"]), **({"kernel_shape": list(
                                       a["kernel_shape"])} if "kernel_shape" in a else {})),
                  helper.make_node("ReorderOutput", [y + SUFFIX + "_out"], [y],
                                   name=base + "/out", domain=NCHWC_DOMAIN, channels=c)]


def rewrite_depthwise_nchwc(model: onnx.ModelProto, shapes: dict, block: int) -> dict:
    """Every 2-D depthwise Conv of `model` (see the module's docstring) in NCHWc kernels of
    `block` channels, in place. shapes: name -> shape of the graph's tensors (the batch may
    be None). Returns how many were replaced, by the replaced operator."""
    counts = {"Conv": 0}
    if block <= 1:
        return counts
    b = _Builder(model, block)
    out: list = []
    for node in model.graph.node:
        found = _depthwise(node, shapes)
        if found is None:
            out.append(node)
            continue
        w, a = found
        b.conv(node.input[0], node.input[1], w, node.input[2] if len(node.input) > 2 and
               node.input[2] else None, node.output[0], a, (node.name or node.output[0])
               + SUFFIX, out)
        counts["Conv"] += 1
    del model.graph.node[:]
    model.graph.node.extend(out)
    if any(counts.values()) and not any(o.domain == NCHWC_DOMAIN for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(NCHWC_DOMAIN, 1))
    return counts


def nchwc_convs(graphs: Graphs, ctx: Context) -> int:
    """Put every 2-D depthwise Conv whose channels the blocked kernels take into this machine's
    NCHWc kernels (shapes: ONNX's and the gradient rules' at the plan's micro-batch)."""
    from exporters.predictor.shapes import tensor_shapes

    block = host_block()
    if block <= 1:
        return 0
    shapes = {k: list(v[0]) for k, v in tensor_shapes(graphs.training,
                                                      ctx.plan.micro_batch).items()}
    count = rewrite_depthwise_nchwc(graphs.training, shapes, block)["Conv"]
    if count:  # blocked layouts in the graph: the block is recorded
        ctx.plan = dataclasses.replace(ctx.plan, nchwc_block=block)
    return count


PASS = Pass("nchwc_convs", "training", nchwc_convs, option="nchwc (the host target's default)",
            when=lambda ctx: ctx.nchwc, targets=("host",))
