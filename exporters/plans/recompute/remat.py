"""Weights computed in the graph, rebuilt in backward instead of kept from the forward pass.

Some layers' weights are computed from parameters on every call: a sparse layer scatters its
kept values into a dense weight (exporters/plans/sparse.py), a convolution with a folded
BatchNorm multiplies its weight by the norm's scale (exporters/passes/convbn.py). Backward
reads that weight (ConvGrad needs it for the input gradient), so ORT keeps every layer's
computed weight from the forward pass to the backward pass: the whole model's bytes at once
(on ResNet-50 at micro-batch 8 with `sqrt` checkpoints, 20 MB of folded weights were live at
the step's peak). Under a recompute plan each late reader (a backward node or a recompute
copy) gets its own copy of the weight's chain, started from PassThrough(parameters..., g)
with g a late input of that reader: the copy runs just before it is read, and the forward
weight dies after its forward use. The chain is every node that builds the weight from the
graph's inputs and constants alone (the scatter reads the int32 positions themselves:
exporters.passes.scatterindices); its FLOPs are the weight's size, not the activations'.
"""
from __future__ import annotations

import onnx
from onnx import helper

from edgetrain import names
from exporters.graph import ancestors, declare_like, ensure_ms_domain, is_backward, producers


def rematerialize_weights(m: onnx.ModelProto, masked_only: bool = False) -> tuple[str, ...]:
    """Rewrite `m` in place so late readers rebuild computed weights (chains that read at
    least one graph input: a chain of constants alone ORT folds; with masked_only, only the
    chains that read a mask's values or positions); returns the tensors now rebuilt."""
    nodes = list(m.graph.node)
    graph_inputs = {i.name for i in m.graph.input} | {i.name for i in m.graph.initializer}
    fed = {i.name for i in m.graph.input}  # trainable values, frozen positions (not constants)
    producer = producers(nodes)  # one map for every chain's walk
    late_nodes = [n for n in nodes if is_backward(n) or names.is_recompute_name(n.name)
                  or n.op_type == "PassThrough"]
    late = {o for n in late_nodes for o in n.output if o}
    late_names = {n.name for n in late_nodes}

    def chain(t: str) -> list | None:
        """Nodes that build t from graph inputs alone (None if it depends on the data)."""
        found = ancestors([t], nodes, stop=lambda n: n.name in late_names
                          or names.INPUT_NAME in n.input, producer=producer)
        if found is None:
            return None
        made = {o for n in found for o in n.output}
        if any(x and x not in made and x not in graph_inputs for n in found for x in n.input):
            return None
        return found

    readers: dict[str, list] = {}
    for n in nodes:
        for x in n.input:
            readers.setdefault(x, []).append(n)

    def order_of(reader) -> str | None:
        """A late input of `reader`, else one of a node that reads its outputs and does not
        itself come from them (a backward view of the weight, e.g. the pointwise ConvGrad's
        Reshape, has no late input of its own), so the rebuilt chain runs no earlier than
        backward needs it."""
        found = next((x for x in reader.input if x in late), None)
        if found is not None:
            return found
        below, todo = set(), [o for o in reader.output if o]
        while todo:  # every tensor computed from the reader's outputs
            t = todo.pop()
            if t not in below:
                below.add(t)
                todo.extend(o for r in readers.get(t, ()) for o in r.output if o)
        return next((x for y in reader.output if y for r in readers.get(y, ())
                     for x in r.input if x in late and x not in below), None)

    rebuilt: list[str] = []
    new_nodes: list = []
    for k, reader in enumerate(late_nodes):
        order = order_of(reader)
        for j, t in enumerate(reader.input):
            if t in late or t in graph_inputs or t not in producer or order is None:
                continue
            nodes_t = chain(t)
            sources = sorted({x for n in nodes_t for x in n.input if x in fed}) if nodes_t else []
            if not sources or masked_only and not any(
                    x.endswith(MASKED) for n in nodes_t for x in n.input):
                continue
            p = f"{k}.{j}"
            order_name = f"{names.RECOMPUTE_ORDER_PREFIXES[1]}{p}"
            alias = [f"{order_name}.{s}" for s in sources]
            new_nodes.append(helper.make_node("PassThrough", [*sources, order],
                                              [*alias, f"{order_name}.after"],
                                              name=f"{order_name}.pass_through",
                                              domain="com.microsoft"))
            local = dict(zip(sources, alias))
            for n in nodes_t:
                if not n.input:  # Constant nodes: nothing to order, reuse
                    continue
                c = onnx.NodeProto()
                c.CopyFrom(n)
                c.name = f"{n.name}{names.REMAT_TAG}{p}"
                for i, x in enumerate(c.input):
                    c.input[i] = local.get(x, x)
                for i, o in enumerate(c.output):
                    if o:
                        local[o] = c.output[i] = f"{o}{names.REMAT_TAG}{p}"
                new_nodes.append(c)
            reader.input[j] = local[t]
            rebuilt.append(t)
    if new_nodes:
        ensure_ms_domain(m)
        m.graph.node.extend(new_nodes)
        declare_like(m, new_nodes, lambda n, k, o: n.input[k] if n.op_type == "PassThrough"
                     else o.rsplit(names.REMAT_TAG, 1)[0])
    return tuple(dict.fromkeys(rebuilt))


MASKED = (names.MASK_VALUES_SUFFIX, names.MASK_POSITIONS_SUFFIX)
