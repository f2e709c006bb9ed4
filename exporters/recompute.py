"""Recompute (gradient checkpointing) written into ORT's training graph.

ORT's own memory optimizer does nothing on on-device artifacts, so the exporter rewrites the
training graph itself. A plan names *checkpoints*: forward tensors that cut the graph in two,
which backward keeps. The forward nodes between two checkpoints form a segment. Every tensor
of a segment that backward needs (other than the segment's checkpoints) is *recomputed*: the
segment's nodes are copied, the copies start from the segment's input checkpoint, and the
backward consumers read the copies. The original forward tensors then die as soon as the
forward pass no longer needs them.

ORT's common-subexpression elimination would merge identical copies back into the
originals. So each segment's copies start from `PassThrough(checkpoint, g)`, where g is the
gradient arriving at the segment's output: a zero-cost alias with the checkpoint's static
shape, which cannot be merged and cannot run before backward reaches the segment. (A
Reshape to a shape computed from g also orders the copies, but a computed shape hides the
copies' shapes from ORT's planner: they were then allocated one by one at run time, and
ResNet-50 saved 1.34x instead of the planned amount.)

Planners are small functions in PLANNERS: (Forward, PlanRequest) -> checkpoints.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Callable, Mapping

import onnx
from onnx import helper

from exporters.memplan import execution_order, without_identities


@dataclass(frozen=True)
class Forward:
    """The forward part of a training graph, in ORT's execution order."""

    nodes: tuple  # forward NodeProtos in execution order
    cuts: tuple[str, ...]  # tensors that alone carry the forward pass past their position
    saved: frozenset  # forward tensors that backward reads
    position: dict  # tensor -> index of its producer in `nodes`


def _is_backward(node) -> bool:
    return ("_Grad" in node.name or node.op_type.endswith("Grad")
            or node.op_type.startswith("InPlaceAccumulator")
            or any(x.endswith("_grad") for x in list(node.input) + list(node.output)))


def analyse(model: onnx.ModelProto, data_input: str = "input") -> Forward:
    nodes = list(model.graph.node)
    order = execution_order(nodes)
    backward = [nodes[i] for i in order if _is_backward(nodes[i])]
    data, fwd = {data_input}, []
    for i in order:
        n = nodes[i]
        if not _is_backward(n) and n.op_type not in ("Shape", "Size") and any(
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


@dataclass(frozen=True)
class RecomputePlan:
    planner: str
    checkpoints: tuple[str, ...]  # kept forward tensors that bound the segments
    recomputed: tuple[str, ...]  # saved tensors rebuilt during backward

    def to_dict(self) -> dict:
        return {"planner": self.planner, "checkpoints": list(self.checkpoints),
                "recomputed": list(self.recomputed)}


def segments(fwd: Forward, checkpoints: tuple[str, ...]) -> list[tuple[str | None, str, list]]:
    """(input checkpoint or None for the graph input, output checkpoint, nodes) per segment."""
    bounds = sorted(fwd.position[c] for c in checkpoints)
    out, start, prev = [], 0, None
    for b in bounds:
        out.append((prev, fwd.nodes[b].output[0], list(fwd.nodes[start:b + 1])))
        start, prev = b + 1, fwd.nodes[b].output[0]
    return out


def recomputed_tensors(fwd: Forward, checkpoints: tuple[str, ...]) -> tuple[str, ...]:
    """Saved tensors inside segments, except each segment's own output checkpoint.

    The segment after the last checkpoint is never recomputed: backward needs it first."""
    keep = set(checkpoints)
    names = []
    for _, _, seg_nodes in segments(fwd, checkpoints):
        for n in seg_nodes:
            names += [o for o in n.output if o in fwd.saved and o not in keep]
    return tuple(names)


# ---- planners ------------------------------------------------------------------------------
@dataclass(frozen=True)
class PlanRequest:
    """What a planner may use besides the forward graph."""

    budget_bytes: int | None = None  # the device's whole training peak must fit in this
    tensor_bytes: Mapping[str, int] = field(default_factory=dict)  # at the planned batch
    node_flops: Mapping[str, int] = field(default_factory=dict)  # forward node name -> FLOPs
    # checkpoints -> predicted peak bytes of the step with that plan written in (the static
    # predictor on the rewritten graph); the budget planner checks its answer with it
    predict_peak: Callable[[tuple[str, ...]], int] | None = None


def plan_none(fwd: Forward, req: PlanRequest) -> tuple[str, ...]:
    return ()


def plan_sqrt(fwd: Forward, req: PlanRequest) -> tuple[str, ...]:
    """Chen et al. 2016: about sqrt(n) evenly spaced checkpoints among the n cut points."""
    n = len(fwd.cuts)
    if n < 2:
        return ()
    k = max(1, round(math.sqrt(n)))
    step = n / (k + 1)
    return tuple(fwd.cuts[min(n - 1, round(step * (j + 1)) - 1)] for j in range(k))


def plan_budget(fwd: Forward, req: PlanRequest) -> tuple[str, ...]:
    """The plan with the fewest recomputed FLOPs whose predicted peak fits req.budget_bytes.

    The segment model (SegmentModel) gives, for any byte limit L on its own peak, the exact
    fewest-FLOPs plan (dynamic programming over all subsets of cut points). The model cannot
    see how ORT's memory pattern fragments, so each plan is judged by the static predictor
    on its rewritten graph. A binary search over L finds the largest limit whose plan the
    predictor says fits; fewer FLOPs come with a larger L, so that plan is the cheapest
    fitting one, as far as the predicted peak falls with L (checked at every step of the
    search, not proven). The sqrt plan is a candidate too. A plan fits when its predicted
    peak leaves headroom_bytes(budget) free: the predictor runs up to 0.8% under measurement
    on rewritten graphs. Raises ValueError, naming the smallest predicted peak reached, when
    no plan fits."""
    if req.budget_bytes is None or req.predict_peak is None:
        raise ValueError("the budget planner needs a byte budget (--budget or --device)")
    usable = req.budget_bytes - headroom_bytes(req.budget_bytes)
    model = SegmentModel(fwd, req)
    predicted: dict[tuple[str, ...], int] = {}

    def fits(ck: tuple[str, ...]) -> bool:
        if ck not in predicted:
            predicted[ck] = req.predict_peak(ck)
        return predicted[ck] <= usable

    if fits(()):
        return ()
    lowest, sqrt = model.lowest_peak(), plan_sqrt(fwd, req)
    fitting = [ck for ck in (lowest, sqrt) if fits(ck)]
    if fitting:
        lo, hi = model.peak(lowest), model.peak(())  # the plan at lo fits, the one at hi not
        tolerance = max(1, (hi - lo) // BUDGET_SEARCH_STEPS)
        while hi - lo > tolerance:
            mid = (lo + hi) // 2
            ck = model.cheapest_within(mid)
            if fits(ck):
                lo = mid
                fitting.append(ck)
            else:
                hi = mid
        return min(fitting, key=lambda ck: (model.flops(ck), predicted[ck]))
    best = min(predicted, key=predicted.get)
    raise ValueError(
        f"no recompute plan fits the budget of {req.budget_bytes:,} bytes: the smallest "
        f"predicted peak of the {len(predicted)} plans checked is {predicted[best]:,} bytes "
        f"({len(best)} checkpoints), and a plan must leave {headroom_bytes(req.budget_bytes):,} "
        f"bytes of headroom. Raise the budget to at least {budget_for_peak(predicted[best]):,} "
        f"bytes, lower the micro-batch (--micro-batch), or use a smaller network.")


BUDGET_SEARCH_STEPS = 512  # the search stops when the limit is known to 1/512 of its range


def headroom_bytes(budget_bytes: int) -> int:
    """Budget the budget planner leaves free for the predictor's error: 1%, at least 256 KiB."""
    return max(256 * 1024, budget_bytes // 100)


def budget_for_peak(peak_bytes: int) -> int:
    """The smallest budget whose headroom still leaves peak_bytes usable."""
    return max(peak_bytes + 256 * 1024, -(-peak_bytes * 100 // 99) + 1)


PLANNERS: dict[str, Callable[[Forward, PlanRequest], tuple[str, ...]]] = {
    "none": plan_none,
    "sqrt": plan_sqrt,
    "budget": plan_budget,
}


class SegmentModel:
    """Activation bytes and recompute FLOPs of a plan, segment by segment.

    With checkpoints c_1 < ... < c_k the forward nodes split into segments S_0..S_k. Backward
    runs through S_k, then rebuilds and runs through S_{k-1}, and so on. While backward is in
    S_j, alive are: the checkpoints before S_j (P_j), the saved tensors of S_j (R_j, rebuilt
    if j < k) and the gradient working set (G_j: twice the largest tensor of S_j). The
    model's peak is max_j P_j + R_j + G_j; a plan costs the FLOPs of the nodes its copies
    repeat. Exact search over all 2^n subsets of the n cut points by dynamic programming:
    after each checkpoint only (P, FLOPs so far) matters, and a state no better in both is
    dropped."""

    def __init__(self, fwd: Forward, req: PlanRequest):
        self.fwd = fwd
        size = req.tensor_bytes
        nodes = fwd.nodes
        self.cut_pos = [fwd.position[c] for c in fwd.cuts]
        self.cut_bytes = [size.get(c, 0) for c in fwd.cuts]
        saved = [sum(size.get(o, 0) for o in n.output if o in fwd.saved) for n in nodes]
        self._saved_prefix = [0]
        for b in saved:
            self._saved_prefix.append(self._saved_prefix[-1] + b)
        self._largest = [max([size.get(o, 0) for o in n.output if o] + [0]) for n in nodes]
        self._flops = [req.node_flops.get(n.name, 0) for n in nodes]
        self._cost: dict[tuple[int, int], int] = {}

    def _bounds(self, a: int, b: int | None) -> tuple[int, int]:
        """Node index range [lo, hi) of the segment after cut a (-1: start) up to cut b
        (None: the end)."""
        lo = self.cut_pos[a] + 1 if a >= 0 else 0
        hi = self.cut_pos[b] + 1 if b is not None else len(self.fwd.nodes)
        return lo, hi

    def segment_bytes(self, a: int, b: int | None) -> int:
        lo, hi = self._bounds(a, b)
        return (self._saved_prefix[hi] - self._saved_prefix[lo]
                + 2 * max(self._largest[lo:hi], default=0))

    def segment_flops(self, a: int, b: int) -> int:
        """FLOPs of the copies that rebuild segment (a, b]'s saved tensors."""
        if (a, b) not in self._cost:
            lo, hi = self._bounds(a, b)
            seg = list(self.fwd.nodes[lo:hi])
            out = self.fwd.cuts[b]
            targets = [o for n in seg for o in n.output if o in self.fwd.saved and o != out]
            needed = _ancestors_within(seg, targets)
            self._cost[(a, b)] = sum(self._flops[lo + k] for k, n in enumerate(seg)
                                     if n.name in needed)
        return self._cost[(a, b)]

    def _index(self, checkpoints: tuple[str, ...]) -> list[int]:
        return sorted(self.fwd.cuts.index(c) for c in checkpoints)

    def peak(self, checkpoints: tuple[str, ...]) -> int:
        """The model's activation peak for a plan."""
        chosen, prefix, peak, a = self._index(checkpoints), 0, 0, -1
        for b in chosen + [None]:
            peak = max(peak, prefix + self.segment_bytes(a, b))
            if b is not None:
                prefix += self.cut_bytes[b]
                a = b
        return peak

    def flops(self, checkpoints: tuple[str, ...]) -> int:
        chosen = self._index(checkpoints)
        return sum(self.segment_flops(a, b) for a, b in zip([-1] + chosen, chosen))

    def cheapest_within(self, peak_bytes: int) -> tuple[str, ...] | None:
        """The fewest-FLOPs plan whose model peak is at most peak_bytes (None: none is)."""
        return self._search(peak_bytes, lambda flops, a, b, _: flops + (
            self.segment_flops(a, b) if b is not None else 0))

    def lowest_peak(self) -> tuple[str, ...]:
        """The plan with the smallest model peak (fewest checkpoints among equals)."""
        return self._search(math.inf, lambda peak, a, b, here: max(peak, here))

    def _search(self, limit: float, score: Callable[[int, int, int | None, int], int]
                ) -> tuple[str, ...] | None:
        """The plan with the lowest score whose segments all stay within `limit` bytes.

        A state after checkpoint b is (checkpoint bytes P, score so far, checkpoint indices);
        score(value, a, b, bytes) gives the value after segment (a, b] (b None: the last),
        whose model bytes are `bytes`. Only states no other beats in both P and score are
        kept, which is exact because a later segment sees nothing of a state but P."""
        states: dict[int, list[tuple[int, int, tuple[int, ...]]]] = {-1: [(0, 0, ())]}
        best = None
        for b in list(range(len(self.fwd.cuts))) + [None]:
            new = []
            for a, front in states.items():
                if b is not None and a >= b:
                    continue
                seg = self.segment_bytes(a, b)
                for prefix, value, path in front:
                    if prefix + seg > limit:
                        continue
                    value = score(value, a, b, prefix + seg)
                    if b is not None:
                        new.append((prefix + self.cut_bytes[b], value, path + (b,)))
                    elif best is None or (value, len(path)) < (best[0], len(best[1])):
                        best = (value, path)
            if b is not None:
                states[b] = _pareto(new)
        return None if best is None else tuple(self.fwd.cuts[i] for i in best[1])


def _pareto(states: list[tuple[int, int, tuple]]) -> list[tuple[int, int, tuple]]:
    """Keep the states no other state beats in both of the first two numbers."""
    front, lowest = [], None
    for s in sorted(states, key=lambda s: (s[0], s[1])):
        if lowest is None or s[1] < lowest:
            front.append(s)
            lowest = s[1]
    return front


def make_plan(model: onnx.ModelProto, planner: str, req: PlanRequest = PlanRequest()
              ) -> RecomputePlan:
    return plan_forward(analyse(model), planner, req)


def plan_forward(fwd: Forward, planner: str, req: PlanRequest) -> RecomputePlan:
    if planner not in PLANNERS:
        raise ValueError(f"unknown recompute planner {planner!r}; choose one of {sorted(PLANNERS)}")
    checkpoints = PLANNERS[planner](fwd, req)
    recomputed = recomputed_tensors(fwd, checkpoints)
    return RecomputePlan(planner, checkpoints if recomputed else (), recomputed)


# ---- the rewrite ---------------------------------------------------------------------------
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
    for s, (src, out, seg_nodes) in enumerate(segments(fwd, plan.checkpoints)):
        targets = [o for n in seg_nodes for o in n.output if o in wanted]
        if not targets:
            continue
        needed = _ancestors_within(seg_nodes, targets)
        start = src if src is not None else "input"
        grad = renamed.get(f"{out}_grad", f"{out}_grad")
        dep = _gradient_dependency(m, s, start, grad)
        new_nodes += dep.nodes
        local = {start: dep.output}
        for n in seg_nodes:
            if n.name not in needed:
                continue
            copy = onnx.NodeProto()
            copy.CopyFrom(n)
            copy.name = f"{n.name}_recompute"
            for k, x in enumerate(copy.input):
                copy.input[k] = local.get(x, x)
            for k, o in enumerate(copy.output):
                if o:
                    local[o] = copy.output[k] = f"{o}_recompute"
            new_nodes.append(copy)
        rename.update({t: local[t] for t in targets})
    for n in m.graph.node:
        if _is_backward(n):
            for k, x in enumerate(n.input):
                if x in rename:
                    n.input[k] = rename[x]
    m.graph.node.extend(new_nodes)
    _declare_types(m, new_nodes)
    return m


def _declare_types(m: onnx.ModelProto, new_nodes: list) -> None:
    """Declare every new tensor with the type and shape of the tensor it stands for.

    ONNX shape inference has no shape function for com.microsoft.PassThrough, so without
    these declarations the copies are unsized for any tool that reads the graph (the static
    predictor counted them as zero bytes)."""
    known = {v.name: v for v in list(m.graph.value_info) + list(m.graph.input)
             + list(m.graph.output)}
    for n in new_nodes:
        for k, o in enumerate(n.output):
            src = n.input[k] if n.op_type == "PassThrough" else o.removesuffix("_recompute")
            if o and o != src and src in known and o not in known:
                v = onnx.ValueInfoProto()
                v.CopyFrom(known[src])
                v.name = o
                m.graph.value_info.append(v)
                known[o] = v


@dataclass
class _Dependency:
    nodes: list
    output: str


def _gradient_dependency(m: onnx.ModelProto, s: int, tensor: str, grad: str) -> _Dependency:
    """PassThrough(tensor, grad)[0]: an alias of `tensor` that ORT runs only after `grad`.

    com.microsoft.PassThrough (an ORT training kernel) outputs its inputs unchanged as
    aliases: no copy, static shapes kept (so ORT still plans the copies' memory), and an
    input no common-subexpression pass can match with the original forward nodes."""
    if grad not in {o for n in m.graph.node for o in n.output}:
        raise ValueError(f"recompute: no gradient {grad!r} in the training graph to order "
                         f"segment {s}'s recompute after; choose checkpoints on the data path")
    if not any(o.domain == "com.microsoft" for o in m.opset_import):
        m.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    p = f"recompute.seg{s}"
    node = helper.make_node("PassThrough", [tensor, grad], [f"{p}.start", f"{p}.after_grad"],
                            name=f"{p}.pass_through", domain="com.microsoft")
    return _Dependency([node], f"{p}.start")


def rematerialize_masked_weights(m: onnx.ModelProto,
                                 suffixes: tuple[str, ...] = ("weight_values", "weight_positions")
                                 ) -> tuple[str, ...]:
    """Rebuild masked layers' dense weights in backward instead of keeping them (in place).

    A sparse layer scatters its kept values into a dense weight (exporters/sparse.py). Backward
    reads that weight (ConvGrad needs it for the input gradient), so ORT keeps every layer's
    dense weight from the forward pass to the backward pass: the whole dense model's bytes at
    once. Here each late reader (a backward node or a recompute copy) gets its own copy of the
    scatter chain, started from PassThrough(values, positions, g) with g a late input of that
    reader: the copy runs just before it is read, and the forward weight dies after its
    forward use. The int64 scatter indices (8 bytes per kept weight) are rebuilt the same way.
    Returns the tensors now rebuilt."""
    nodes = list(m.graph.node)
    graph_inputs = {i.name for i in m.graph.input} | {i.name for i in m.graph.initializer}
    producer = {o: n for n in nodes for o in n.output if o}
    late_nodes = [n for n in nodes if _is_backward(n) or n.name.endswith("_recompute")
                  or n.op_type == "PassThrough"]
    late = {o for n in late_nodes for o in n.output if o}
    late_names = {n.name for n in late_nodes}

    def chain(t: str) -> list | None:
        """Nodes that build t from graph inputs alone (None if it depends on the data)."""
        found, stack = {}, [t]
        while stack:
            x = stack.pop()
            n = producer.get(x)
            if n is None:
                if x not in graph_inputs and x:
                    return None
                continue
            if n.name in found:
                continue
            if n.name in late_names or "input" in n.input:
                return None
            found[n.name] = n
            stack.extend(n.input)
        return [n for n in nodes if n.name in found]  # graph order is topological

    rebuilt: list[str] = []
    new_nodes: list = []
    for k, reader in enumerate(late_nodes):
        order = next((x for x in reader.input if x in late), None)
        for j, t in enumerate(reader.input):
            if t in late or t in graph_inputs or t not in producer or order is None:
                continue
            nodes_t = chain(t)
            if not nodes_t or not any(x.endswith(suffixes) for n in nodes_t for x in n.input):
                continue
            sources = sorted({x for n in nodes_t for x in n.input if x in graph_inputs
                              and producer.get(x) is None and x in _non_constant(m)})
            p = f"remat.{k}.{j}"
            alias = [f"{p}.{s}" for s in sources]
            new_nodes.append(helper.make_node("PassThrough", [*sources, order],
                                              [*alias, f"{p}.after"], name=f"{p}.pass_through",
                                              domain="com.microsoft"))
            local = dict(zip(sources, alias))
            for n in nodes_t:
                if not n.input:  # Constant nodes: nothing to order, reuse
                    continue
                c = onnx.NodeProto()
                c.CopyFrom(n)
                c.name = f"{n.name}_{p}"
                for i, x in enumerate(c.input):
                    c.input[i] = local.get(x, x)
                for i, o in enumerate(c.output):
                    if o:
                        local[o] = c.output[i] = f"{o}_{p}"
                new_nodes.append(c)
            reader.input[j] = local[t]
            rebuilt.append(t)
    if new_nodes:
        if not any(o.domain == "com.microsoft" for o in m.opset_import):
            m.opset_import.append(helper.make_opsetid("com.microsoft", 1))
        m.graph.node.extend(new_nodes)
        _declare_remat_types(m, new_nodes)
    return tuple(dict.fromkeys(rebuilt))


def _non_constant(m: onnx.ModelProto) -> set[str]:
    """Graph inputs (trainable values, frozen positions), not stored initializers."""
    return {i.name for i in m.graph.input}


def _declare_remat_types(m: onnx.ModelProto, new_nodes: list) -> None:
    known = {v.name: v for v in list(m.graph.value_info) + list(m.graph.input)
             + list(m.graph.output)}
    for n in new_nodes:
        for k, o in enumerate(n.output):
            if not o or o in known:
                continue
            src = n.input[k] if n.op_type == "PassThrough" else o.rsplit("_remat.", 1)[0]
            if src in known:
                v = onnx.ValueInfoProto()
                v.CopyFrom(known[src])
                v.name = o
                m.graph.value_info.append(v)
                known[o] = v


def _ancestors_within(seg_nodes: list, targets: list[str]) -> set[str]:
    """Names of the segment's nodes needed to rebuild `targets`."""
    producer = {o: n for n in seg_nodes for o in n.output if o}
    needed, stack = set(), list(targets)
    while stack:
        t = stack.pop()
        n = producer.get(t)
        if n is None or n.name in needed:
            continue
        needed.add(n.name)
        stack.extend(n.input)
    return needed


def plan_and_rewrite(path: str, planner: str, *, batch: int = 1,
                     budget_bytes: int | None = None,
                     predict_file_peak: Callable[[], int] | None = None) -> RecomputePlan:
    """Plan recompute for the training graph at `path` and rewrite the file in place.

    Both work on the graph as ORT runs it (Identity nodes removed), so names match.
    batch: the micro-batch the plan is for (tensor sizes). predict_file_peak: the predicted
    peak bytes of the artifact with the training graph now at `path` (the budget planner
    writes candidates there to check them). If planning fails the file is left as it was."""
    original = onnx.load(path)
    model, renamed = without_identities(original)
    fwd = analyse(model)

    def write(checkpoints: tuple[str, ...]) -> RecomputePlan:
        plan = RecomputePlan(planner, checkpoints, recomputed_tensors(fwd, checkpoints))
        if planner == "none":  # the file stays exactly as ORT's artifact builder wrote it
            onnx.save(original, path)
            return plan
        rewritten = apply(model, plan, renamed)
        weights = rematerialize_masked_weights(rewritten)
        onnx.save(rewritten if plan.recomputed or weights else original, path)
        return dataclasses.replace(plan, recomputed=plan.recomputed + weights)

    req = PlanRequest(budget_bytes=budget_bytes)
    if planner == "budget":
        from exporters.cost import node_costs
        from exporters.memplan import _nbytes, tensor_shapes

        if predict_file_peak is None:
            raise ValueError("the budget planner needs the artifact's predictor")

        def predict_peak(checkpoints: tuple[str, ...]) -> int:
            write(checkpoints)
            return predict_file_peak()

        req = PlanRequest(
            budget_bytes=budget_bytes,
            tensor_bytes={t: _nbytes(s) for t, s in tensor_shapes(model, batch).items()},
            node_flops={name: f for name, _, f, _ in node_costs(model, batch)},
            predict_peak=predict_peak)
    try:
        plan = plan_forward(fwd, planner, req)
    except BaseException:
        onnx.save(original, path)
        raise
    return write(plan.checkpoints)
