"""The one set of graph helpers every host-side tool uses: loading a graph without its weights,
ORT's execution order, the graph as ORT runs it (Identity nodes removed), and the walks back
from a tensor to the nodes that compute it; and int64 constants for the rewrites that add nodes.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

from edgetrain import names

ALIAS_OPS = {"Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity", "PassThrough"}
CONV_OPS = ("Conv", "FusedConv")  # forward convolutions (FusedConv: ORT's Conv + activation)


def load_graph(path: str) -> onnx.ModelProto:
    """The model at `path` without loading external weight files (structure and shapes only)."""
    return onnx.load(str(path), load_external_data=False)


def execution_order(nodes: list[onnx.NodeProto]) -> list[int]:
    """ORT's default order as it walks a graph: reverse DFS from the leaves, inputs sorted by
    index, post-order; here the indices are the nodes' positions in `nodes`, not ORT's
    in-memory ones, so on an optimised graph it is an approximation (the predictor takes
    ORT's order from the graph ORT writes: exporters/predictor/plan.py)."""
    producer = producers(nodes)
    inputs_of = [sorted({producer[x] for x in n.input if x in producer}) for n in nodes]
    has_consumer = set(j for deps in inputs_of for j in deps)
    leaves = [i for i in range(len(nodes)) if i not in has_consumer]
    order, visited = [], [False] * len(nodes)
    stack = [(i, False) for i in leaves]
    while stack:
        i, leave = stack.pop()
        if leave:
            order.append(i)
            continue
        if visited[i]:
            continue
        visited[i] = True
        stack.append((i, True))
        for j in inputs_of[i]:
            if not visited[j]:
                stack.append((j, False))
    return order


def drop_identities(model: onnx.ModelProto) -> tuple[list[onnx.NodeProto], dict[str, str]]:
    """ORT removes Identity nodes whose output is not a graph output. Returns the kept nodes
    (their inputs rewired, in place) and removed tensor -> the tensor that now stands for it."""
    outputs = {o.name for o in model.graph.output}
    rename, kept = {}, []
    for n in model.graph.node:
        if n.op_type == "Identity" and n.output[0] not in outputs:
            rename[n.output[0]] = rename.get(n.input[0], n.input[0])
            continue
        kept.append(n)
    for n in kept:
        for k, x in enumerate(n.input):
            if x in rename:
                n.input[k] = rename[x]
    return kept, rename


def without_identities(model: onnx.ModelProto) -> tuple[onnx.ModelProto, dict[str, str]]:
    """A copy of the graph as ORT runs it (Identity nodes removed), and the renames."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    kept, renamed = drop_identities(m)
    del m.graph.node[:]
    m.graph.node.extend(kept)
    return m, renamed


def producers(nodes: list) -> dict[str, int]:
    """tensor -> the index in `nodes` of the node that makes it."""
    return {o: k for k, n in enumerate(nodes) for o in n.output if o}


def ancestors(targets: list[str], nodes: list, stop=lambda node: False,
              producer: dict[str, int] | None = None) -> list | None:
    """The nodes of `nodes` that compute `targets`, producers first, in `nodes`' own relative
    order where it is topological and depth-first post-order otherwise (recompute copies are
    appended at a graph's end). stop(node) -> True: the walk may not pass that node; then
    None is returned. producer: producers(nodes), for a caller that walks the same nodes
    many times (each call would build it again: 2 ms on ResNet-50's training graph)."""
    producer = producers(nodes) if producer is None else producer
    kept, stack = set(), list(targets)
    while stack:
        k = producer.get(stack.pop())
        if k is None or k in kept:
            continue
        if stop(nodes[k]):
            return None
        kept.add(k)
        stack.extend(i for i in nodes[k].input if i)
    order, done = [], set()
    for root in sorted(kept):
        walk = [(root, False)]
        while walk:
            j, expanded = walk.pop()
            if j in done:
                continue
            if expanded:
                done.add(j)
                order.append(nodes[j])
                continue
            walk.append((j, True))
            walk.extend((producer[i], False) for i in nodes[j].input
                        if i in producer and producer[i] in kept and producer[i] not in done)
    return order


def is_backward(node) -> bool:
    """A node of the backward pass (ORT's gradient builder's naming and ops)."""
    return ("_Grad" in node.name or node.op_type.endswith("Grad")
            or node.op_type.startswith("InPlaceAccumulator")
            or any(names.is_grad_name(x) for x in list(node.input) + list(node.output)))


def forward_conv_outputs(nodes) -> dict[tuple[str, str], str]:
    """(X, W) -> output of the forward Conv; a ConvGrad reads the same X and W, and its own
    output-gradient input may be unsized, so its output geometry comes from here."""
    return {(n.input[0], n.input[1]): n.output[0] for n in nodes
            if n.op_type in CONV_OPS}


def attributes(node) -> dict:
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def ensure_ms_domain(model: onnx.ModelProto) -> None:
    """Import the com.microsoft opset (ORT's training kernels, e.g. PassThrough)."""
    if not any(o.domain == "com.microsoft" for o in model.opset_import):
        model.opset_import.append(onnx.helper.make_opsetid("com.microsoft", 1))


def declare_like(model: onnx.ModelProto, new_nodes: list, source_of) -> None:
    """Declare each new tensor with the type and shape of the tensor it stands for.

    source_of(node, k, output) -> the name of the tensor output k copies (or None). ONNX
    shape inference has no shape function for com.microsoft.PassThrough, so without these
    declarations copies are unsized for any tool that reads the graph."""
    g = model.graph
    known = {v.name: v for v in list(g.value_info) + list(g.input) + list(g.output)}
    for n in new_nodes:
        for k, o in enumerate(n.output):
            src = source_of(n, k, o) if o else None
            if o and src and o != src and src in known and o not in known:
                v = onnx.ValueInfoProto()
                v.CopyFrom(known[src])
                v.name = o
                g.value_info.append(v)
                known[o] = v


def stated_shapes(model: onnx.ModelProto) -> dict[str, list]:
    """Every tensor's shape the graph states (initializers, inputs, value_info, outputs);
    a dimension without a fixed size is None."""
    graph = model.graph
    shapes = {t.name: list(t.dims) for t in graph.initializer}
    for v in [*graph.input, *graph.value_info, *graph.output]:
        shapes[v.name] = [d.dim_value if d.HasField("dim_value") else None
                          for d in v.type.tensor_type.shape.dim]
    return shapes


def stated_elem_types(model: onnx.ModelProto) -> dict[str, int]:
    """Every tensor's ONNX element type the graph states (inputs, value_info; initializers
    over them)."""
    graph = model.graph
    types = {v.name: v.type.tensor_type.elem_type for v in [*graph.input, *graph.value_info]}
    types.update({t.name: t.data_type for t in graph.initializer})
    return types


def int64_constant(graph: onnx.GraphProto, name: str, values) -> str:
    """`name`, an int64 initializer holding `values` (a shape, axes, pads), added to `graph`
    unless it is there already: rewrites share one per name."""
    if not any(t.name == name for t in graph.initializer):
        graph.initializer.append(numpy_helper.from_array(np.asarray(values, np.int64), name))
    return name
