"""ORT's memory plan of one training step, simulated from the training graph (a prediction).

  * execution order: ORT's default topological order (exporters.graph.execution_order);
  * lifetimes: a tensor lives from its producer to its last consumer (graph outputs to the end);
  * reuse: view ops (Reshape, Squeeze, Unsqueeze, Flatten, Identity) alias their input; Relu
    reuses an input that dies there; otherwise a freed buffer of the same shape is taken
    before a new one;
  * the memory pattern: every new buffer is placed best-fit into one block by its lifetime.
    Only tensors whose shape ORT's planner can resolve from the graph and the input shapes
    (ONNX shape inference at the batch) are in it. A tensor whose shape is computed inside
    the graph (attention's Reshape to [B, heads, T, d] and everything after it) is sized
    only when its node runs: it is a run-time allocation (`dynamic`), from its producer to
    its last reader, which scratch.py replays through the arena model with the kernels'
    temporaries (measured: the arena grows by exactly these tensors on attention graphs).
"""
from __future__ import annotations

from dataclasses import dataclass

import onnx

from edgetrain import names
from exporters.graph import ALIAS_OPS, drop_identities, execution_order, load_graph
from exporters.predictor.shapes import Shapes, nbytes, tensor_shapes

INPLACE_OPS = {"Relu"}
PATTERN_ALIGN = 64


@dataclass(frozen=True)
class StepPlan:
    batch: int
    order: tuple[str, ...]  # node names in execution order
    pattern_bytes: int  # the memory-pattern block
    live_peak_bytes: int  # peak of bytes live at once (no fragmentation)
    timeline: tuple[int, ...]  # bytes live after each node, in execution order
    unsized: tuple[str, ...] = ()  # tensors whose shape could not be found (counted as 0)
    # run-time allocations: (tensor, bytes, first node index, last node index) in `order`
    dynamic: tuple[tuple[str, int, int, int], ...] = ()


def parameter_gradients(model: onnx.ModelProto, nodes) -> set[str]:
    """`W_grad` outputs of trained tensors (graph inputs of the training graph). ORT computes
    them into run-time allocations that the gradient accumulator consumes, not into the
    memory pattern (measured: the arena's step-time growth includes the largest ones)."""
    params = {i.name for i in model.graph.input} | {i.name for i in model.graph.initializer}
    return {o for n in nodes for o in n.output
            if names.is_grad_name(o) and names.grad_of(o) in params}


def plan_step(path: str, batch: int, known: Shapes | None = None) -> StepPlan:
    """Simulate ORT's allocation plan and memory pattern for one training step.
    known: tensor shapes found by evaluating the forward graph (evaluated.py)."""
    model = load_graph(path)
    nodes, _ = drop_identities(model)
    shapes = tensor_shapes(model, batch)  # what ORT's planner can size
    sized = tensor_shapes(model, batch, known) if known else shapes  # when the step runs
    order = execution_order(nodes)
    state = {i.name for i in model.graph.initializer}
    feeds = {i.name for i in model.graph.input} | state
    graph_outputs = {o.name for o in model.graph.output}
    runtime_allocated = parameter_gradients(model, nodes)  # outside the pattern
    position = {i: t for t, i in enumerate(order)}
    last_use: dict[str, int] = {}
    for i in order:
        for x in nodes[i].input:
            if x:
                last_use[x] = position[i]
    end = len(order)
    for o in graph_outputs:
        last_use[o] = end

    buffer_of: dict[str, int] = {}  # tensor -> buffer id
    buffers: list[dict] = []  # {size, key, start, users, live, spans}
    free_by_size: dict[int, list[int]] = {}
    live = 0
    timeline, unsized = [], []
    dynamic: dict[str, list] = {}  # root tensor -> [bytes, first, last]
    dynamic_root: dict[str, str] = {}  # tensor -> the run-time allocation it lives in
    for t, i in enumerate(order):
        n = nodes[i]
        for k, o in enumerate(n.output):
            if o and o not in sized and o not in feeds:
                unsized.append(o)
            if not o or o in feeds or o not in sized or o in runtime_allocated:
                continue
            src = n.input[0] if n.input else None
            if n.op_type == "PassThrough" and k < len(n.input):
                src = n.input[k]
            if n.op_type in ALIAS_OPS and src in dynamic_root:
                dynamic_root[o] = dynamic_root[src]
                continue
            if o not in shapes:  # sized only when the node runs
                dynamic_root[o] = o
                dynamic[o] = [nbytes(sized[o]), t, t]
                continue
            size = nbytes(shapes[o])
            if n.op_type in ALIAS_OPS and src in buffer_of:
                b = buffer_of[src]
            elif (n.op_type in INPLACE_OPS and k == 0 and src in buffer_of
                  and last_use.get(src) == t and buffers[buffer_of[src]]["size"] == size
                  and _users_dead(buffers[buffer_of[src]], last_use, t)):
                b = buffer_of[src]
            elif free_by_size.get(shapes[o]):
                b = free_by_size[shapes[o]].pop()
                buffers[b]["live"] = True
                live += size
            else:
                b = len(buffers)
                buffers.append({"size": size, "key": shapes[o], "start": t,
                                "users": [], "live": True, "spans": []})
                live += size
            buffer_of[o] = b
            buffers[b]["users"].append(o)
        # free buffers whose every user is dead after this node
        for x in set(list(n.input) + list(n.output)):
            b = buffer_of.get(x)
            if b is None or not buffers[b]["live"]:
                continue
            if _users_dead(buffers[b], last_use, t):
                buffers[b]["live"] = False
                buffers[b]["spans"].append((buffers[b]["start"], t))
                live -= buffers[b]["size"]
                free_by_size.setdefault(buffers[b]["key"], []).append(b)
                buffers[b]["start"] = t + 1
        timeline.append(live)
    for b in buffers:
        if b["live"]:
            b["spans"].append((b["start"], end))
    for tensor, root in dynamic_root.items():
        entry = dynamic[root]
        entry[2] = max(entry[2], min(last_use.get(tensor, entry[1]), end - 1))
    pattern = pack([(b["size"], tuple(b["spans"])) for b in buffers])
    return StepPlan(batch=batch, order=tuple(nodes[i].name for i in order),
                    pattern_bytes=pattern, live_peak_bytes=max(timeline, default=0),
                    timeline=tuple(timeline), unsized=tuple(unsized),
                    dynamic=tuple((o, b, s, e) for o, (b, s, e) in dynamic.items()))


def _users_dead(buf: dict, last_use: dict, t: int) -> bool:
    """No tensor sharing this buffer is read after node t."""
    return all(last_use.get(u, t) <= t for u in buf["users"])


def pack(blocks: list[tuple[int, tuple[tuple[int, int], ...]]]) -> int:
    """Best-fit placement of (size, live spans) blocks in allocation order, as ORT's
    MemPatternPlanner does with program counters: a buffer reused by several tensors is
    live only in their spans, so another block may sit in the time between them. Returns
    the pattern block's total size."""
    placed: list[tuple[int, int, tuple]] = []  # offset, size, spans
    total = 0
    for size, spans in sorted(blocks, key=lambda b: b[1][0][0]):
        size = -(-size // PATTERN_ALIGN) * PATTERN_ALIGN
        overlapping = sorted((o, s) for o, s, other in placed if _overlap(spans, other))
        best, waste, cur = None, None, 0
        for o, s in overlapping:
            if o - cur >= size and (waste is None or o - cur - size < waste):
                best, waste = cur, o - cur - size
            cur = max(cur, o + s)
        if best is None:
            best = cur
        placed.append((best, size, spans))
        total = max(total, best + size)
    return total


def _overlap(a: tuple[tuple[int, int], ...], b: tuple[tuple[int, int], ...]) -> bool:
    return any(s1 <= e2 and s2 <= e1 for s1, e1 in a for s2, e2 in b)
