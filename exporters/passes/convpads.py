"""Pass `explicit_conv_pads` (forward graph, before ORT's artifact builder): each Conv whose
padding is `auto_pad` SAME_UPPER or SAME_LOWER gets the same padding written out as `pads`.

torch exports `padding="same"` (a common choice in 1-D CNNs and TCNs over sensor windows) as
`auto_pad="SAME_UPPER"`. onnxruntime 1.19.2's CPU Conv refuses SAME with a dilation above 1
("Dilation not supported for AutoPadType::SAME_UPPER or AutoPadType::SAME_LOWER"), so such a
model exported but could not take a training step. Explicit pads are the same convolution
(ONNX's definition of SAME: output ceil(in / stride), the total padding split with the odd
element at the end for SAME_UPPER, at the start for SAME_LOWER), and every kernel takes them.
With stride 1 the total is dilation * (kernel - 1) whatever the input's length; with a larger
stride it depends on the input's size, read from shape inference (the sample shape is fixed
at export); a Conv whose input size is unknown there keeps its auto_pad.
"""
from __future__ import annotations

import math

import onnx
from onnx import helper

from exporters.graph import attributes, stated_shapes
from exporters.passes.pipeline import Context, Graphs, Pass

SAME = {b"SAME_UPPER": "upper", b"SAME_LOWER": "lower"}


def same_pads(sizes: list[int | None], kernel: list[int], strides: list[int],
              dilations: list[int], mode: str) -> list[int] | None:
    """ONNX's pads [begins..., ends...] for auto_pad SAME_UPPER (mode "upper") or SAME_LOWER
    ("lower") over spatial input sizes `sizes` (None: unknown, enough where the stride is 1);
    None where a size the padding depends on is unknown."""
    begins, ends = [], []
    for size, k, s, d in zip(sizes, kernel, strides, dilations):
        span = (k - 1) * d + 1
        if s == 1:
            total = span - 1
        elif size is None:
            return None
        else:
            total = max(0, (math.ceil(size / s) - 1) * s + span - size)
        small = total // 2
        begins.append(small if mode == "upper" else total - small)
        ends.append(total - begins[-1])
    return begins + ends


def explicit_conv_pads(model: onnx.ModelProto) -> int:
    """Write each SAME-padded Conv's padding out as explicit pads (auto_pad NOTSET). Returns
    how many Convs were rewritten; each computes what it did."""
    todo = [n for n in model.graph.node if n.op_type == "Conv"
            and attributes(n).get("auto_pad") in SAME]
    if not todo:
        return 0
    shapes = stated_shapes(model)
    if any(s != 1 for n in todo for s in attributes(n).get("strides", [])):
        # a stride above 1: the sizes matter, so infer them (the sample shape is fixed)
        shapes = stated_shapes(onnx.shape_inference.infer_shapes(model))
    changed = 0
    for n in todo:
        a = attributes(n)
        weight = shapes.get(n.input[1])
        kernel = a.get("kernel_shape") or (weight[2:] if weight else None)
        x = shapes.get(n.input[0])
        rank = len(kernel) if kernel and None not in kernel else None
        if rank is None:
            continue
        pads = same_pads(x[2:] if x and len(x) == rank + 2 else [None] * rank, kernel,
                         a.get("strides") or [1] * rank, a.get("dilations") or [1] * rank,
                         SAME[a["auto_pad"]])
        if pads is None:
            continue
        kept = [att for att in n.attribute if att.name not in ("auto_pad", "pads")]
        del n.attribute[:]
        n.attribute.extend(kept)
        n.attribute.append(helper.make_attribute("pads", pads))
        changed += 1
    return changed


def write_conv_pads(graphs: Graphs, ctx: Context) -> int:
    """Write each SAME-padded Conv's padding out as explicit pads, which ORT's CPU Conv takes
    with any dilation."""
    return explicit_conv_pads(graphs.forward)


PASS = Pass("explicit_conv_pads", "forward", write_conv_pads)
