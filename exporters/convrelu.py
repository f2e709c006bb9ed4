"""A convolution whose only reader is a ReLU, fused into ORT's FusedConv in the training graph.

onnxruntime 1.19.2's CPU FusedConv (com.microsoft) runs MLAS's convolution with the
activation applied as each output tile is written, so the ReLU's pass over the convolution's
output, and that output itself (a tensor the size of the layer's activation, alive between
the two nodes), go away. ORT's own graph optimiser makes this fusion only for inference;
the training graph keeps Conv then Relu. After the gradients are built nothing else reads the
convolution's output (with BatchNorm folded, exporters/convbn.py, the ReLU follows the
convolution directly): ReLU's gradient reads the ReLU's output, which FusedConv produces
under the same name. A convolution whose output has another reader, or is a graph output, is
left alone. Same values: the fused kernel computes max(conv, 0) like the pair.
"""
from __future__ import annotations

import onnx
from onnx import helper

FUSED_SUFFIX = "_relu_fused"


def fuse_conv_relu(model: onnx.ModelProto) -> int:
    """Replace each Conv -> Relu pair (the Conv read only by the Relu) by one FusedConv with
    activation Relu, in place, at the Relu's position. Returns how many."""
    graph = model.graph
    readers: dict[str, list] = {}
    for n in graph.node:
        for i in n.input:
            readers.setdefault(i, []).append(n)
    outputs = {o.name for o in graph.output}
    conv_of = {}  # id(Relu) -> its Conv
    for n in graph.node:
        if n.op_type != "Conv" or n.domain not in ("", "ai.onnx") or n.output[0] in outputs:
            continue
        r = readers.get(n.output[0], [])
        if len(r) == 1 and r[0].op_type == "Relu":
            conv_of[id(r[0])] = n
    if not conv_of:
        return 0
    fused_convs = {id(c) for c in conv_of.values()}
    nodes = []
    for n in graph.node:
        if id(n) in fused_convs:
            continue
        conv = conv_of.get(id(n))
        if conv is None:
            nodes.append(n)
            continue
        f = helper.make_node("FusedConv", list(conv.input), [n.output[0]],
                             name=(conv.name or conv.output[0]) + FUSED_SUFFIX,
                             domain="com.microsoft", activation="Relu")
        f.attribute.extend(conv.attribute)
        nodes.append(f)
    del graph.node[:]
    graph.node.extend(nodes)
    return len(conv_of)
