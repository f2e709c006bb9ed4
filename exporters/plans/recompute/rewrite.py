"""The rewrite: a recompute plan written into ORT's training graph.

Each segment's nodes that rebuild a recomputed tensor are copied (suffix `_recompute`), the
copies start from the segment's input checkpoint, and the backward consumers read the copies.
ORT's common-subexpression elimination would merge identical copies back into the originals,
so each segment's copies start from `PassThrough(checkpoint, g)`, g the gradient arriving at
the segment's output: a zero-cost alias with the checkpoint's static shape, which cannot be
merged and cannot run before backward reaches the segment. (A Reshape to a shape computed
from g also orders the copies, but a computed shape hides the copies' shapes from ORT's
planner: they were then allocated one by one at run time, and ResNet-50 saved 1.34x instead
of the planned amount.)
"""
from __future__ import annotations

import onnx
from onnx import helper

from edgetrain import names
from exporters.graph import ancestors, declare_like, ensure_ms_domain, is_backward
from exporters.plans.recompute.analysis import RecomputePlan, analyse, segments


def apply(model: onnx.ModelProto, plan: RecomputePlan,
          renamed: dict[str, str] | None = None) -> onnx.ModelProto:
    """Return a copy of the training graph with `plan`'s tensors recomputed in backward.

    renamed: tensors removed with Identity nodes -> the tensor that stands for them."""
    renamed = renamed or {}
    m = onnx.ModelProto()
    m.CopyFrom(model)
    if not plan.recomputed:
        return m
    fwd = analyse(m)
    wanted = set(plan.recomputed)
    new_nodes: list[onnx.NodeProto] = []
    rename: dict[str, str] = {}
    made = {o for n in m.graph.node for o in n.output}
    alias = {o: n.input[k] for n in m.graph.node if n.op_type == "PassThrough"
             and not is_backward(n) for k, o in enumerate(n.output) if k < len(n.input)}
    for s, (src, out, seg_nodes) in enumerate(segments(fwd, plan.checkpoints)):
        targets = [o for n in seg_nodes for o in n.output if o in wanted]
        if not targets:
            continue
        needed = {n.name for n in ancestors(targets, seg_nodes)}
        start = src if src is not None else names.INPUT_NAME
        grad = gradient_name(out, renamed, made, alias)
        dependency = gradient_dependency(m, s, start, grad)
        new_nodes.append(dependency)
        local = {start: dependency.output[0]}
        for n in seg_nodes:
            if n.name not in needed:
                continue
            copy = onnx.NodeProto()
            copy.CopyFrom(n)
            copy.name = names.recompute_name(n.name)
            for k, x in enumerate(copy.input):
                copy.input[k] = local.get(x, x)
            for k, o in enumerate(copy.output):
                if o:
                    local[o] = copy.output[k] = names.recompute_name(o)
            new_nodes.append(copy)
        rename.update({t: local[t] for t in targets})
    for n in m.graph.node:
        if is_backward(n):
            for k, x in enumerate(n.input):
                if x in rename:
                    n.input[k] = rename[x]
    m.graph.node.extend(new_nodes)
    declare_like(m, new_nodes, lambda n, k, o: n.input[k] if n.op_type == "PassThrough"
                 else o.removesuffix(names.RECOMPUTE_SUFFIX))
    drop_unread_optional_outputs(m, set(rename))
    return m


def drop_unread_optional_outputs(m: onnx.ModelProto, candidates: set[str]) -> list[str]:
    """Remove the `candidates` that no node or graph output reads any more from their
    producers' outputs, where the operator's schema makes that output optional; returns them.

    ORT's allocation planner gives an output no node reads no release: it stays allocated to
    the end of the step. A recomputed MaxPool's indices are such an output once backward
    reads the copy's (on ResNet-50, 12.8 MB held through all of backward at micro-batch 8).
    Without the output, ORT also runs MaxPool's kernel without indices."""
    read = {x for n in m.graph.node for x in n.input} | {o.name for o in m.graph.output}
    opset = {o.domain: o.version for o in m.opset_import}
    dropped = []
    for n in m.graph.node:
        if n.domain not in ("", "ai.onnx") or not any(o in candidates for o in n.output):
            continue
        try:
            schema = onnx.defs.get_schema(n.op_type, opset.get("", 17), "")
        except onnx.defs.SchemaError:
            continue
        for k, o in enumerate(n.output):
            if (o in candidates and o not in read and k < len(schema.outputs)
                    and schema.outputs[k].option == OPTIONAL):
                n.output[k] = ""
                dropped.append(o)
        while n.output and not n.output[-1]:
            del n.output[-1]
    kept = [v for v in m.graph.value_info if v.name not in dropped]
    if len(kept) < len(m.graph.value_info):
        del m.graph.value_info[:]
        m.graph.value_info.extend(kept)
    return dropped


OPTIONAL = onnx.defs.OpSchema.FormalParameterOption.Optional


def gradient_name(tensor: str, renamed: dict[str, str], made: set[str],
                  alias: dict[str, str]) -> str:
    """The gradient arriving at `tensor`: its own, or where a forward PassThrough made it as
    an alias of another tensor (`alias`: output -> the input it passes; relugrad.py keeps a
    ReLU's output so) and no gradient of the alias is among the graph's tensors (`made`),
    the gradient of the tensor it aliases."""
    grad = renamed.get(names.grad_name(tensor), names.grad_name(tensor))
    while grad not in made and tensor in alias:
        tensor = alias[tensor]
        grad = renamed.get(names.grad_name(tensor), names.grad_name(tensor))
    return grad


def gradient_dependency(m: onnx.ModelProto, s: int, tensor: str, grad: str) -> onnx.NodeProto:
    """PassThrough(tensor, grad): output 0 is an alias of `tensor` that ORT runs only after
    `grad` exists.

    com.microsoft.PassThrough (an ORT training kernel) outputs its inputs unchanged as
    aliases: no copy, static shapes kept (so ORT still plans the copies' memory), and an
    input no common-subexpression pass can match with the original forward nodes."""
    if grad not in {o for n in m.graph.node for o in n.output}:
        raise ValueError(f"recompute: no gradient {grad!r} in the training graph to order "
                         f"segment {s}'s recompute after; choose checkpoints on the data path")
    ensure_ms_domain(m)
    p = f"{names.RECOMPUTE_ORDER_PREFIXES[0]}{s}"
    return helper.make_node("PassThrough", [tensor, grad], [f"{p}.start", f"{p}.after_grad"],
                            name=f"{p}.pass_through", domain="com.microsoft")
