"""The arena through a personalisation cycle, phase by phase (a prediction).

The capped env arena grows by a region of exactly a request's size when no free gap of its
regions holds the request (arena_extend_strategy 1) and never gives a region back, so what it
holds at the end is the most the cycle needed (scratch.RegionArena models it). The runtime
(edgetrain/runtime.py) fills it in this order:

1. load: a gradient buffer per trained tensor and AdamW's two moments, a chunk each;
2. a BatchNorm statistics pass, where the run adapts BatchNorm (`personalise --adapt`,
   `measure --adapt`): the side graph's session has no memory pattern, so its constants and
   each buffer of its run are arena allocations of their own, which leave their regions
   behind (edgetrain/sessions.py). The plan's preflight_order puts a training step before it
   ("step-first": the pass's buffers then take the regions the step freed) or not. The
   runtime copies each side run's outputs out of the arena (sidegraphs.py), so a run leaves
   no chunk behind to split the free space the next one takes;
3. the training step: its memory-pattern block takes a freed region big enough or grows the
   arena by its own size, then its run-time allocations (scratch.replay); then an eval pass
   (the Module's eval graph, with a memory pattern too), whose block can take the region
   the step's convolution buffer left and so push the next buffer into a new one (imu_cnn
   at width 0.5 with 8-bit frozen weights, micro-batch 2: 131,072 bytes);
4. the inference check: the training Module, optimizer and side graphs are freed, and the
   exported model (inferencegraph.py) runs one sample at a time, unoptimised and without a
   memory pattern, its weights the checkpoint's own buffers (edgetrain/inference.py): only
   its constants and what it computes (a frozen 8-bit weight rebuilt in float, MLAS's
   convolution buffer, one sample's activations) take arena space, in the regions the cycle
   left free, or grow it.

Steps and eval passes then alternate, and a later one can need a region the first did not:
each starts with every region the one before it made free, and best fit then places its
requests differently (a padded 1-D CNN's second step took a 51,200-byte region more; the patch
MobileNet at micro-batch 8 grew by 4,096 bytes in each of its first four steps). So the step
and the eval pass are replayed in turn until a round of both grows the arena no more (at most
STEADY_ROUNDS): a round that takes no new region ends with the arena as it began, so every
later one repeats it. Later statistics passes repeat the first one's requests. The side
graph's plan is ORT's default reuse plan (on outside training) in ORT's order, which runs a
Shape node just after its input's producer: a statistics graph reads each layer's input
again only for its Shape, at its end, and the allocator measured the input freed after its
layer (imu_cnn at micro-batch 8: 745,472 bytes of regions for the pass; holding each input to
the end would take 1,103,872).
"""
from __future__ import annotations

from dataclasses import dataclass

from edgetrain.budget import arena_rounded
from exporters.predictor.ortgraph import OPTIMIZATION_LEVEL, optimized_graph
from exporters.predictor.plan import StepPlan, plan_step
from exporters.predictor.scratch import RegionArena, replay, run_sizes
from exporters.predictor.shapes import Shapes, initializer_bytes

INFERENCE_BATCH = 1  # the inference check runs one sample at a time (edgetrain/inference.py)
STEADY_ROUNDS = 16  # step + eval rounds replayed at most to reach the arena's steady state


@dataclass(frozen=True)
class Run:
    """One session run the cycle replays: the graph's path, its plan, its tensors' shapes at
    the run's batch (scratch.run_sizes) and the initializers bound to the checkpoint's
    buffers (they take no arena space)."""
    path: str
    plan: StepPlan
    sizes: Shapes
    bound: frozenset[str] = frozenset()

    @classmethod
    def of(cls, path: str, plan: StepPlan, known: Shapes | None = None,
           bound: frozenset[str] = frozenset()) -> "Run":
        return cls(path, plan, run_sizes(path, plan, plan.batch, known), bound)


def side_run(side: str, batch: int, graph_level: int = OPTIMIZATION_LEVEL,
             known: Shapes | None = None, bound: frozenset[str] = frozenset()) -> Run:
    """A run of the graph at `side` in a session without a memory pattern (ORT's
    optimisation at `graph_level`: side graphs open at the default, the inference check
    unoptimised)."""
    return Run.of(side, plan_step(side, batch, known, memory_reuse=True,
                                  memory_pattern=False, graph_level=graph_level), known, bound)


def inference_run(model: str, known: Shapes | None, bound: frozenset[str]) -> Run:
    """The inference check's run of `model` (inferencegraph.inference_model): unoptimised, one
    sample, the checkpoint's tensors `bound` as its weights."""
    return side_run(model, INFERENCE_BATCH, 0, known, bound)


def cycle_activation_bytes(train: Run, eval_pass: Run, threads: int, state_chunks: list[int],
                           side: Run | None, inference: Run | None,
                           step_first: bool = False) -> int:
    """The arena bytes the cycle holds beyond the training state (`state_chunks`: the bytes
    of each gradient and moment buffer): the statistics pass `side` (None: no pass), the
    training step, an eval pass at the same batch, and the inference check (None: not
    modelled). step_first: the preflight runs a training step before the statistics pass
    (Plan.preflight_order "step-first"), so the pass takes the regions the step freed."""
    arena = RegionArena()
    for k, size in enumerate(state_chunks):
        arena.alloc(f"state{k}", size)
    state_bytes = sum(arena.regions)
    side_constants = []
    if step_first and side is not None:
        _step(arena, train, threads)
    if side is not None:
        side_constants = _open(arena, side, "side")
        replay(arena, side.path, threads, side.plan, side.sizes)
    for _ in range(STEADY_ROUNDS):  # steps and eval passes in turn, to the arena's steady state
        before = len(arena.regions)
        for run in (train, eval_pass):
            _step(arena, run, threads)
        if len(arena.regions) == before:
            break
    if inference is not None:
        for name in [*side_constants, *(f"state{k}" for k in range(len(state_chunks)))]:
            arena.free(name)
        _open(arena, inference, "inference")
        replay(arena, inference.path, threads, inference.plan, inference.sizes)
    return sum(arena.regions) - state_bytes


def step_activation_bytes(run: Run, threads: int) -> int:
    """One run of a session with a memory pattern, alone: its block (arena-rounded) plus the
    regions its run-time allocations take."""
    arena = RegionArena()
    _step(arena, run, threads)
    return sum(arena.regions)


def _step(arena: RegionArena, run: Run, threads: int) -> None:
    """A run of a session with a memory pattern: its block, then its run-time allocations."""
    arena.alloc("memory pattern", arena_rounded(run.plan.pattern_bytes))  # one run's block
    replay(arena, run.path, threads, run.plan, run.sizes)
    arena.free("memory pattern")


def _open(arena: RegionArena, run: Run, tag: str) -> list[str]:
    """A session without a memory pattern allocates each of its graph's constants when it
    opens and keeps them while open; returns their arena names. Graph inputs (weights the
    runtime feeds) and bound initializers (the checkpoint's buffers) take nothing."""
    taken = []
    graph = optimized_graph(run.path, run.plan.graph_level)
    for k, init in enumerate(graph.graph.initializer):
        if init.name not in run.bound and (size := initializer_bytes(init)):
            arena.alloc(f"{tag} constant{k}", size)
            taken.append(f"{tag} constant{k}")
    return taken


__all__ = ["Run", "cycle_activation_bytes", "inference_run", "side_run",
           "step_activation_bytes"]
