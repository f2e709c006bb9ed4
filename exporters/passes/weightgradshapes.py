"""Pass `pointwise_weight_grad_shapes` (training graph): the weight gradient of a pointwise
ConvGrad given its shape, so that ORT plans it in the memory pattern.

ORT's gradient builder declares no shape for ConvGrad's weight and bias gradients (its graph
holds them with no dimensions at all), so its allocation planner cannot size them and each
is allocated at run time, beside the memory pattern. The arena then grows by a region the
size of the first such gradient that no free region fits, and regions never merge. On
ResNet-50 (micro-batch 8) the first two of backward were the last block's pointwise weight
gradient, 2048 x 512 (4.2 MB), then its 3 x 3 one, 512 x 512 x 9 (9.4 MB): two regions,
13.6 MB outside the pattern at the step's peak, where the 9.4 MB one alone would have held
every later weight gradient and column buffer.

The pass declares, for each ConvGrad of a convolution with a 1 x 1 kernel whose weight's
shape the graph states, the weight gradient with the weight's shape and the bias gradient
with the weight's first dimension. ORT then lays the pointwise weight gradients out in its
memory pattern, where they take a gap between activations that are live at the time
(ResNet-50, `--recompute optimal`: 4.2 MB fewer activation bytes measured, as predicted, the
pattern block unchanged; docs/concepts.md). The weight gradients of larger kernels stay
run-time allocations: their convolution's ConvGrad allocates a column buffer at run time
anyway, which reuses the region a weight gradient opened; declared too, ResNet-50's peak
rose (the last block's 9.4 MB weight gradient in the pattern at the step's busiest moment;
the column buffers opening regions of their own). ConvGrads the earlier passes rewrote into
products (pointwisegrad.py, depthwisegrad.py) declare their shapes already; the values
computed are unchanged.
"""
from __future__ import annotations

import onnx
from onnx import helper

from exporters.graph import stated_elem_types, stated_shapes
from exporters.passes.pipeline import Context, Graphs, Pass


def declare_pointwise_weight_grads(model: onnx.ModelProto) -> int:
    """Declare the weight and bias gradients of each pointwise ConvGrad whose weight's shape
    the graph states and whose gradients it does not; returns how many were declared."""
    graph = model.graph
    shapes = stated_shapes(model)
    elem_types = stated_elem_types(model)
    declared = 0
    for node in graph.node:
        if node.op_type != "ConvGrad" or len(node.input) < 3:
            continue
        dims = shapes.get(node.input[2])
        if not dims or len(dims) < 3 or None in dims or any(d != 1 for d in dims[2:]):
            continue
        elem = elem_types.get(node.input[2], onnx.TensorProto.FLOAT)
        for k, shape in ((1, dims), (2, dims[:1])):
            out = node.output[k] if len(node.output) > k else ""
            if out and out not in shapes:
                graph.value_info.append(helper.make_tensor_value_info(out, elem, shape))
                shapes[out] = shape
                declared += 1
    return declared


def pointwise_weight_grad_shapes(graphs: Graphs, ctx: Context) -> int:
    """Declare the weight and bias gradients of each pointwise ConvGrad with the weight's
    shape, so ORT plans them in its memory pattern rather than at run time."""
    return declare_pointwise_weight_grads(graphs.training)


PASS = Pass("pointwise_weight_grad_shapes", "training", pointwise_weight_grad_shapes)
