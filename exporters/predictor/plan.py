"""ORT 1.19's memory plan of one training step, simulated (a prediction).

On the graph ORT runs (ortgraph.optimized_graph), in ORT's execution order, this follows
onnxruntime/core/framework/allocation_planner.cc (single stream) and session_state.cc:
  * reuse plan, node by node: a view op's output (Reshape, Squeeze, Unsqueeze, Flatten,
    Identity; PassThrough's k-th output) is its input's buffer; Relu, HardSigmoid and
    ScatterElements write into an input that dies there (same symbolic shape); otherwise the
    most recently freed buffer of the same symbolic shape and item size; otherwise a new
    buffer. A buffer is freed after the node where its last reader runs; one no node reads
    (a recomputed BatchNorm's output, when only its saved statistics are needed) is held to
    the end of the step (allocation_planner.cc CalculateProgramCounter: no release action, so
    its program counter ends with the program). Graph outputs get buffers of their own.
  * memory pattern: every new buffer whose shape ORT can resolve from the input shapes (all
    dimensions numbers or input symbols) is placed best-fit among the blocks live at that
    time, each slot a multiple of 256 bytes; the block's total is the pattern.
  * everything else (a shape computed inside the graph; graph outputs; a tensor bigger than
    ORT's graph says, e.g. ConvGrad's weight gradient) is a run-time allocation (`dynamic`),
    from its producer to its last reader, which scratch.py replays through the arena model.
The execution order is the order of the nodes in the graph ORT writes out (ORT writes them
in the order its GraphViewer runs them: a reverse DFS from the leaves, then, in a training
build, each Shape and Size node moved to just after its input's producer); checked against
ORT's profiler, node for node, on 1-D CNNs, a TCN and attention graphs, with and without
recompute.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from edgetrain.sessions import TRAINING_MEMORY_REUSE
from exporters.graph import ALIAS_OPS, drop_identities
from exporters.predictor.ortgraph import (OPTIMIZATION_LEVEL, SymbolicShapes, node_arg_shapes,
                                          optimized_graph)
from exporters.predictor.shapes import Shapes, nbytes, tensor_shapes

# output 0 may overwrite input 0 (the CPU kernel's MayInplace(0, 0)), each checked against
# the allocator: the sparse weights' scatter writes into its zeros (the memory-pattern block
# of C4, C5 and C6's steps predicted to within 0.9%, 0.01%, 0.01%); attention's Softmax
# writes into its scores (the arena grew at the scores' MatMul and not at the Softmax)
INPLACE_OPS = {"Relu", "HardSigmoid", "ScatterElements", "Softmax"}
# each buffer's slot in the memory pattern is a multiple of 256 bytes, not of kAllocAlignment
# (64): with 256, ORT's pattern block of imu_transformer's and a LayerNorm MLP's steps at
# batch 1, 2, 3, 4, 5, 8 and 16 is predicted to the byte (with 64, up to 4.8 KB short: the
# many shape tensors and scalars of attention graphs)
PATTERN_ALIGN = 256


@dataclass(frozen=True)
class StepPlan:
    batch: int
    order: tuple[str, ...]  # node names in execution order (of the optimised graph)
    pattern_bytes: int  # the memory-pattern block
    live_peak_bytes: int  # most pattern bytes live at once
    timeline: tuple[int, ...]  # pattern bytes live after each node, in execution order
    unsized: tuple[str, ...] = ()  # tensors whose size could not be found (counted as 0)
    # run-time allocations: (tensor, bytes, first node index, last node index) in `order`
    dynamic: tuple[tuple[str, int, int, int], ...] = ()
    # the pattern buffers live when most are (live_peak_bytes): (tensor, bytes), the tensor
    # the buffer holds at that moment (the last written into it: ORT reuses buffers)
    peak_buffers: tuple[tuple[str, int], ...] = ()
    graph_level: int = OPTIMIZATION_LEVEL  # ORT's optimisation level of the graph planned


def same_shape(a, b) -> bool:
    """ORT's SameShape: equal rank, each dimension the same number or the same symbol."""
    return (a is not None and b is not None and len(a) == len(b)
            and all(x == y and x is not None for x, y in zip(a, b)))


def plan_step(path: str, batch: int, known: Shapes | None = None,
              memory_reuse: bool = TRAINING_MEMORY_REUSE,
              memory_pattern: bool = True, graph_level: int = OPTIMIZATION_LEVEL
              ) -> StepPlan:
    """Simulate ORT's plan for one run of the graph at `path` (a training step, or a side
    graph's forward pass). known: forward tensor shapes found by running the eval graph
    (evaluated.py). memory_reuse: ORT's buffer reuse, as the runtime's training session sets
    it (side graphs: ORT's default, on). memory_pattern False (the runtime's side graphs,
    edgetrain/sessions.py): no pattern block; every new buffer is a run-time allocation.
    graph_level: ORT's optimisation level of the session (0 for the inference check)."""
    model = optimized_graph(path, graph_level)
    nodes, _ = drop_identities(model)
    order = list(range(len(nodes)))  # ORT's execution order: the order it wrote the nodes in
    sized = tensor_shapes(model, batch, known)
    symb = node_arg_shapes(model)
    reuse = _reuse_plan(model, nodes, order, symb, memory_reuse)
    plan = _trace(nodes, order, batch, sized, symb, reuse, model, memory_pattern)
    return replace(plan, graph_level=graph_level)


@dataclass
class _Reuse:
    buffer: dict  # tensor -> the tensor whose buffer it uses (itself if new)
    new: set  # tensors that get a new buffer of their own (kAllocate)
    outputs: set  # graph outputs (allocated at run time)
    end: dict  # buffer -> index in order after which it is freed


def _reuse_plan(model, nodes, order, symb: SymbolicShapes, memory_reuse: bool) -> _Reuse:
    inputs = {i.name for i in model.graph.input} | {i.name for i in model.graph.initializer}
    outputs = {o.name for o in model.graph.output}
    use: dict[str, int] = {}
    for x in list(inputs) + list(outputs) + [x for i in order for x in
                                             list(nodes[i].input) + list(nodes[i].output) if x]:
        use[x] = use.get(x, 0) + 1
    buf: dict[str, str] = {}
    new, free, end = set(), [], {}
    read = {x for i in order for x in nodes[i].input if x}

    def base(x):
        return buf.get(x, x)

    def share(src, dst):
        root = base(src)
        buf[dst] = root
        use[root] = use.get(root, 0) + use.get(dst, 0)

    for t, i in enumerate(order):
        n = nodes[i]
        for k, o in enumerate(n.output):
            if not o or o in outputs:
                continue
            src = (n.input[k] if n.op_type == "PassThrough" and k < len(n.input) else
                   n.input[0] if n.op_type in ALIAS_OPS and k == 0 else None)
            if src:
                share(src, o)
                continue
            x = n.input[0] if n.op_type in INPLACE_OPS and k == 0 and n.input else None
            if (x and base(x) in new and use.get(base(x)) == 1
                    and same_shape(symb.get(x, (None, 0))[0], symb.get(o, (None, 0))[0])
                    and symb.get(x, (None, 0))[1] == symb.get(o, (None, 0))[1]):
                share(x, o)
                continue
            dims, item = symb.get(o, (None, 0))
            match = None if not (memory_reuse and dims) else next(
                (j for j, f in enumerate(free) if symb.get(f, (None, 0))[1] == item
                 and same_shape(symb.get(f, (None, 0))[0], dims)), None)
            if match is not None:
                share(free.pop(match), o)
                continue
            new.add(o)
        for x in list(n.input) + list(n.output):
            if x and base(x) in use:
                root = base(x)
                use[root] -= 1
                if use[root] == 0 and not memory_reuse and root in new and root not in read:
                    end[root] = len(order) - 1  # read by no node: held to the step's end
                elif use[root] == 0:
                    free.insert(0, root)
                    end[root] = t
    return _Reuse(buf, new, outputs, end)


def _trace(nodes, order, batch, sized, symb, reuse: _Reuse, model,
           memory_pattern: bool = True) -> StepPlan:
    symbols = {d.dim_param for v in model.graph.input for d in v.type.tensor_type.shape.dim
               if d.dim_param}
    last = len(order) - 1
    blocks: list[tuple[int, int, str]] = []  # offset, size, buffer
    total, timeline, dynamic, unsized = 0, [], [], []
    holds: dict[str, str] = {}  # buffer -> the tensor written into it last
    for t, i in enumerate(order):
        for o in nodes[i].output:
            if o:
                holds[reuse.buffer.get(o, o)] = o
        for o in nodes[i].output:
            if not o or (o not in reuse.new and o not in reuse.outputs):
                continue
            actual = sized.get(o)
            if actual is None:
                unsized.append(o)
            dims, item = symb.get(o, (None, 0))
            until = reuse.end.get(o, last) if o in reuse.new else last
            resolvable = dims is not None and all(
                (isinstance(d, int) and d > 0) or d in symbols for d in dims)
            if o in reuse.outputs or not resolvable or not memory_pattern:
                if actual is not None:
                    dynamic.append((o, nbytes(actual), t, until))
                continue
            numel = int(np.prod([batch if isinstance(d, str) else d for d in dims]))
            if actual is not None and nbytes(actual) > numel * item:  # ORT's shape is short
                dynamic.append((o, nbytes(actual), t, until))
            size = -(-numel * item // PATTERN_ALIGN) * PATTERN_ALIGN
            offset = _best_fit(blocks, size, total)
            total = max(total, offset + size)
            blocks.append((offset, size, o))
        freed = {reuse.buffer.get(x, x) for x in list(nodes[i].input) + list(nodes[i].output)
                 if x}
        blocks[:] = [b for b in blocks if not (b[2] in freed and reuse.end.get(b[2]) == t)]
        timeline.append(sum(b[1] for b in blocks))
        if timeline[-1] > max(timeline[:-1], default=-1):
            peak = tuple((holds.get(name, name), size) for _, size, name in blocks)
    return StepPlan(batch=batch, order=tuple(nodes[i].name for i in order),
                    pattern_bytes=total, live_peak_bytes=max(timeline, default=0),
                    timeline=tuple(timeline), unsized=tuple(unsized), dynamic=tuple(dynamic),
                    peak_buffers=peak if timeline else ())


def _best_fit(blocks, size: int, total: int) -> int:
    """MemPatternPlanner::TraceAllocation: the tightest gap among the live blocks (or the
    free tail of the block so far), else the end."""
    cur, best, waste = 0, None, None
    for offset, sz, _ in sorted(blocks):
        if offset >= cur and offset - cur >= size and (waste is None or offset - cur - size < waste):
            best, waste = cur, offset - cur - size
        cur = max(cur, offset + sz)
    if cur < total and total - cur >= size and (waste is None or total - cur - size < waste):
        best = cur
    return cur if best is None else best


__all__ = ["StepPlan", "plan_step", "same_shape"]
