"""Arena growth outside ORT's memory pattern during a step, replayed from the graph.

Run-time allocations, in the plan's execution order (plan.StepPlan):
  * forward Conv (and FusedConv): MLAS's working buffer (MlasConvPrepare): none for a
    pointwise conv; output pixels x K when the filter count exceeds them; otherwise
    threads x 16384 floats;
  * ConvGrad: a column buffer of K x output pixels and a bias multiplier of output pixels
    (orttraining/training_ops/cpu/nn/conv_grad.cc), freed when the kernel returns;
  * ConvTranspose: a column buffer of K x its input's pixels (core/providers/cpu/nn/
    conv_transpose.cc), freed when the kernel returns;
  * Sum, Mean, Max and Min of N > 2 inputs: N - 2 temporaries, each the running result of
    the inputs so far, asked for before the output (element_wise_ops.cc
    UntypedBroadcastVariadic: a temporary is freed once the next one, or the output, holds
    the running result); a gradient summed over three readers takes one;
  * the tensors the plan could not lay out in the pattern (StepPlan.dynamic), from the node
    that produces them until their last reader has run.
They go through a model of the arena (RegionArena): a request takes the best-fitting free gap
of an existing region, or the arena grows by a new region of exactly its size. The regions'
total is the scratch. The constants are MLAS's in onnxruntime 1.19.2 (exporters/predictor/
__init__.py checks it).
"""
from __future__ import annotations

import numpy as np

from edgetrain.budget import arena_rounded
from edgetrain.names import NCHWC_DOMAIN
from exporters.graph import CONV_OPS, attributes, drop_identities
from exporters.predictor.ortgraph import optimized_graph
from exporters.predictor.plan import StepPlan
from exporters.predictor.shapes import Shapes, runtime_shapes

MLAS_CONV_BUFFER_FLOATS_PER_THREAD = 16384  # MLAS_CONV_WORKING_BUFFER_SIZE_PER_THREAD
MLAS_SGEMM_THREAD_COMPLEXITY = 65536
MLAS_MAXIMUM_THREAD_COUNT = 16
VARIADIC_OPS = ("Sum", "Mean", "Max", "Min")  # UntypedBroadcastVariadic's kernels


def scratch_bytes(path: str, batch: int, threads: int, plan: StepPlan,
                  known: Shapes | None = None) -> int:
    """The arena's growth outside the memory pattern in one step at `batch` with `threads`,
    for the training graph at `path` and its plan (plan_step)."""
    arena = RegionArena()
    replay(arena, path, threads, plan, run_sizes(path, plan, batch, known))
    return sum(arena.regions)


def run_sizes(path: str, plan: StepPlan, batch: int, known: Shapes | None = None) -> Shapes:
    """The shapes a run of the graph at `path` (as `plan` planned it) has at `batch`."""
    return runtime_shapes(optimized_graph(path, plan.graph_level), batch, known=known)


def replay(arena: "RegionArena", path: str, threads: int, plan: StepPlan, sizes: Shapes) -> None:
    """Put one run's run-time allocations (the graph at `path`, its plan, its run_sizes)
    through `arena`, in the plan's execution order; everything they take is free again when
    the run ends."""
    nodes, _ = drop_identities(optimized_graph(path, plan.graph_level))
    by_name = {n.name: n for n in nodes}
    starts: dict[int, list[tuple[str, int]]] = {}
    ends: dict[str, int] = {}
    for name, size, first, last in plan.dynamic:
        starts.setdefault(first, []).append((name, size))
        ends[name] = last
    live: list[str] = []
    for t, name in enumerate(plan.order):
        running = None  # a variadic kernel's running result, asked for before its output
        for k, size in enumerate(variadic_temporaries(by_name[name], sizes)):
            arena.alloc(f"sum{t}.{k}", size)
            if running:
                arena.free(running)
            running = f"sum{t}.{k}"
        for tensor, size in starts.get(t, []):  # a kernel asks for its outputs first
            arena.alloc(tensor, size)
            live.append(tensor)
        if running:
            arena.free(running)
        temps = conv_temporaries(by_name[name], sizes, threads)
        for k, size in enumerate(temps):
            arena.alloc(f"tmp{t}.{k}", size)
        for k in range(len(temps)):
            arena.free(f"tmp{t}.{k}")
        for tensor in [x for x in live if ends[x] <= t]:
            arena.free(tensor)
            live.remove(tensor)
    for tensor in live:
        arena.free(tensor)


def variadic_temporaries(n, shapes) -> list[int]:
    """Bytes of the running results a variadic element-wise kernel (Sum, Mean, Max, Min)
    allocates, in order: one per input after the second but the last, each the broadcast of
    the inputs so far."""
    if n.op_type not in VARIADIC_OPS or len(n.input) < 3:
        return []
    if any(x not in shapes for x in n.input):
        return []
    out = []
    dims = tuple(shapes[n.input[0]][0])
    for x in n.input[1:-1]:
        dims = tuple(np.broadcast_shapes(dims, tuple(shapes[x][0])))
        out.append(int(np.prod(dims, dtype=np.int64)) * shapes[n.input[0]][1])
    return out


def conv_temporaries(n, shapes, threads: int) -> list[int]:
    """Bytes of the temporaries a Conv or ConvGrad kernel allocates while it runs (MLAS's
    NCHWc Conv, exporters/passes/nchwc.py, works in its output alone)."""
    if n.op_type not in CONV_OPS + ("ConvGrad", "ConvTranspose") or n.domain == NCHWC_DOMAIN:
        return []
    a = attributes(n)
    group = int(a.get("group", 1))
    w = n.input[1] if n.op_type in CONV_OPS + ("ConvTranspose",) else n.input[2]
    # a ConvGrad's dY has its convolution's output shape; the weight [M, C/group, k...] gives
    # K, so neither needs X or the forward output (a recompute plan renames both); a frozen
    # layer's input gradient, ConvTranspose(dY, W) (frozenconvgrad.py), reads the same two
    y = n.output[0] if n.op_type in CONV_OPS else n.input[0]
    if w not in shapes or y not in shapes:
        return []
    ws = shapes[w][0]
    kernel = int(np.prod(ws[2:]))
    k = ws[1] * kernel  # K: input channels per group x kernel size
    pixels = int(np.prod(shapes[y][0][2:]))
    if n.op_type == "ConvGrad":
        return [k * pixels * 4, pixels * 4]
    if n.op_type == "ConvTranspose":  # its column buffer (cpu/nn/conv_transpose.cc)
        return [k * pixels * 4]
    filters = ws[0] // group
    pointwise = (kernel == 1 and group == 1 and all(s == 1 for s in a.get("strides", [1]))
                 and not any(a.get("pads", [0])))
    if pointwise:
        return []
    if filters > pixels:
        return [pixels * k * 4]
    complexity = filters * pixels * k
    n_threads = min(int(complexity / MLAS_SGEMM_THREAD_COMPLEXITY) + 1,
                    MLAS_MAXIMUM_THREAD_COUNT, max(1, threads))
    return [n_threads * MLAS_CONV_BUFFER_FLOATS_PER_THREAD * 4]


class RegionArena:
    """BFC-like: regions never merge; a request takes the best-fitting free gap, all of it
    unless the gap is at least twice the request (BFCArena's split rule), or a new region."""

    def __init__(self):
        self.regions: list[int] = []
        self.chunks: list[list[tuple[int, int, str]]] = []

    def alloc(self, name: str, size: int) -> None:
        size = arena_rounded(size)
        best = None  # (waste, region, offset)
        for j, region in enumerate(self.regions):
            cur = 0
            for off, sz, _ in sorted(self.chunks[j]) + [(region, 0, "")]:
                if off - cur >= size and (best is None or off - cur - size < best[0]):
                    best = (off - cur - size, j, cur)
                cur = max(cur, off + sz)
        if best is None:
            self.regions.append(size)
            self.chunks.append([(0, size, name)])
        else:
            gap = best[0] + size
            if gap < 2 * size:  # BFCArena splits a free chunk only if it is twice the request
                size = gap
            self.chunks[best[1]].append((best[2], size, name))

    def free(self, name: str) -> None:
        for c in self.chunks:
            c[:] = [x for x in c if x[2] != name]
