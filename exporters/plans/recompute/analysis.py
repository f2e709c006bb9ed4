"""The forward part of a training graph, as recompute plans see it: the forward nodes in ORT's
execution order, the cut points (tensors that alone carry the forward pass past them), the
tensors backward reads, and how a plan's checkpoints split the nodes into segments.
"""
from __future__ import annotations

from dataclasses import dataclass

import onnx

from edgetrain import names
from exporters.graph import execution_order, is_backward


@dataclass(frozen=True)
class Forward:
    """The forward part of a training graph, in ORT's execution order."""

    nodes: tuple  # forward NodeProtos in execution order
    cuts: tuple[str, ...]  # tensors that alone carry the forward pass past their position
    saved: frozenset  # forward tensors that backward reads
    position: dict  # tensor -> index of its producer in `nodes`


@dataclass(frozen=True)
class RecomputePlan:
    planner: str
    checkpoints: tuple[str, ...]  # kept forward tensors that bound the segments
    recomputed: tuple[str, ...]  # saved tensors rebuilt during backward
    note: str = ""  # why the planner chose what it chose, when that needs saying
    # checkpoints not kept from forward but rebuilt from the kept one before them when
    # backward reaches them (a nested plan, rewrite.py); never the last checkpoint
    rebuilt: tuple[str, ...] = ()

    def kept(self) -> tuple[str, ...]:
        """The checkpoints held from forward."""
        return tuple(c for c in self.checkpoints if c not in self.rebuilt)

    def to_dict(self) -> dict:
        return {"planner": self.planner, "checkpoints": list(self.checkpoints),
                "recomputed": list(self.recomputed), "note": self.note,
                "rebuilt": list(self.rebuilt)}


def analyse(model: onnx.ModelProto, data_input: str = names.INPUT_NAME) -> Forward:
    nodes = list(model.graph.node)
    order = execution_order(nodes)
    backward = [nodes[i] for i in order if is_backward(nodes[i])]
    data, fwd = {data_input}, []
    for i in order:
        n = nodes[i]
        if not is_backward(n) and n.op_type not in ("Shape", "Size") and any(
                x in data for x in n.input):
            fwd.append(n)
            data.update(o for o in n.output if o)
    position = {o: k for k, n in enumerate(fwd) for o in n.output if o}
    last_forward_use: dict[str, int] = {}
    for k, n in enumerate(fwd):
        for x in n.input:
            if x in position:
                last_forward_use[x] = k
    cuts = []
    for k, n in enumerate(fwd[:-1]):
        crossing = [t for t, p in position.items() if p <= k and last_forward_use.get(t, -1) > k]
        if len(crossing) == 1 and crossing[0] == n.output[0]:
            cuts.append(crossing[0])
    read_by_backward = {x for n in backward for x in n.input}
    saved = frozenset(t for t in position if t in read_by_backward)
    return Forward(tuple(fwd), tuple(cuts), saved, position)


def segments(fwd: Forward, checkpoints: tuple[str, ...]) -> list[tuple[str | None, str, list]]:
    """(input checkpoint or None for the graph input, output checkpoint, nodes) per segment."""
    bounds = sorted(fwd.position[c] for c in checkpoints)
    out, start, prev = [], 0, None
    for b in bounds:
        out.append((prev, fwd.nodes[b].output[0], list(fwd.nodes[start:b + 1])))
        start, prev = b + 1, fwd.nodes[b].output[0]
    return out


def recomputed_tensors(fwd: Forward, checkpoints: tuple[str, ...],
                       rebuilt: tuple[str, ...] = ()) -> tuple[str, ...]:
    """Saved tensors inside segments, except each segment's own output checkpoint unless it
    is `rebuilt` (a checkpoint backward rebuilds rather than keeps).

    The segment after the last checkpoint is never recomputed: backward needs it first."""
    keep = set(checkpoints) - set(rebuilt)
    names_ = []
    for _, _, seg_nodes in segments(fwd, checkpoints):
        for n in seg_nodes:
            names_ += [o for o in n.output if o in fwd.saved and o not in keep]
    return tuple(names_)
