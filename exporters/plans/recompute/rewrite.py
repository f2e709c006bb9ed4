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

    A nested plan (plan.rebuilt) keeps only some checkpoints from forward: when backward
    reaches the segments after a kept checkpoint K, one chain of copies (rebuilt_name) runs
    forward from K to the rebuilt checkpoints up to the next kept one, and those segments
    then start from the rebuilt copies (Chen et al.'s recursion, one level deep).
    renamed: tensors removed with Identity nodes -> the tensor that stands for them."""
    renamed = renamed or {}
    m = onnx.ModelProto()
    m.CopyFrom(model)
    if not plan.recomputed:
        return m
    fwd = analyse(m)
    rebuilt = set(plan.rebuilt)
    wanted = set(plan.recomputed) - rebuilt
    made = {o for n in m.graph.node for o in n.output}
    alias = {o: n.input[k] for n in m.graph.node if n.op_type == "PassThrough"
             and not is_backward(n) for k, o in enumerate(n.output) if k < len(n.input)}
    segs = segments(fwd, plan.checkpoints)
    if segs and segs[-1][1] in rebuilt:
        raise ValueError(f"recompute: the last checkpoint {segs[-1][1]!r} cannot be rebuilt; "
                         "backward needs it before any other")
    new_nodes: list[onnx.NodeProto] = []
    rename: dict[str, str] = {}  # recomputed tensor (rebuilt checkpoints too) -> its copy
    read = {x for n in m.graph.node if is_backward(n) for x in n.input}
    for first, last in _groups(segs, rebuilt):
        group = segs[first:last + 1]
        # a rebuilt checkpoint backward reads, or that starts copies: one no node would read
        # would be held to the end of the step (drop_unread_optional_outputs)
        chained = [src for src, _, seg_nodes in group[1:] if src in read or any(
            o in wanted for n in seg_nodes for o in n.output)]
        if chained:  # the chain that rebuilds the group's checkpoints, once
            nodes = [n for _, _, seg_nodes in group[:-1] for n in seg_nodes]
            grad = gradient_name(group[-1][1], renamed, made, alias)
            dependency = gradient_dependency(m, f"{first}.chain", _start(group[0][0]), grad)
            new_nodes.append(dependency)
            local = {_start(group[0][0]): dependency.output[0]}
            new_nodes += _copies(nodes, chained, local, names.rebuilt_name)
            rename.update({r: local[r] for r in chained})
        for s, (src, out, seg_nodes) in enumerate(group, start=first):
            targets = [o for n in seg_nodes for o in n.output if o in wanted]
            if not targets:
                continue
            start = _start(src)
            grad = gradient_name(out, renamed, made, alias)
            # a kept checkpoint is never renamed; a rebuilt one starts from its chain copy
            dependency = gradient_dependency(m, s, rename.get(start, start), grad)
            new_nodes.append(dependency)
            local = {start: dependency.output[0]}
            new_nodes += _copies(seg_nodes, targets, local, names.recompute_name)
            rename.update({t: local[t] for t in targets})
    for n in m.graph.node:
        if is_backward(n):
            for k, x in enumerate(n.input):
                if x in rename:
                    n.input[k] = rename[x]
    m.graph.node.extend(new_nodes)
    declare_like(m, new_nodes, lambda n, k, o: n.input[k] if n.op_type == "PassThrough"
                 else names.recomputed_original(o))
    drop_unread_optional_outputs(m, set(rename))
    return m


def _start(src: str | None) -> str:
    return src if src is not None else names.INPUT_NAME


def _groups(segs: list, rebuilt: set[str]) -> list[tuple[int, int]]:
    """(first, last) segment index of each run of segments whose later ones start at a
    rebuilt checkpoint: a kept checkpoint (or the input) and what backward rebuilds from it."""
    out: list[list[int]] = []
    for s, (src, _, _) in enumerate(segs):
        if out and src in rebuilt:
            out[-1][1] = s
        else:
            out.append([s, s])
    return [(a, b) for a, b in out]


def _copies(nodes: list, targets: list[str], local: dict[str, str], rename) -> list:
    """Copies of the `nodes` that `targets` need, reading `local`'s stand-ins (updated with
    the copies' outputs); node and tensor names through `rename`."""
    needed = {n.name for n in ancestors(targets, nodes)}
    out = []
    for n in nodes:
        if n.name not in needed:
            continue
        copy = onnx.NodeProto()
        copy.CopyFrom(n)
        copy.name = rename(n.name)
        for k, x in enumerate(copy.input):
            copy.input[k] = local.get(x, x)
        for k, o in enumerate(copy.output):
            if o:
                local[o] = copy.output[k] = rename(o)
        out.append(copy)
    return out


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


def gradient_dependency(m: onnx.ModelProto, s: int | str, tensor: str, grad: str) -> onnx.NodeProto:
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
