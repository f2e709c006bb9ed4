"""A training cycle whose first step follows a BatchNorm statistics pass, through one arena
(a prediction).

Where a run adapts BatchNorm (`personalise`'s recipe, `measure --adapt`), the runtime's
preflight runs the statistics side graph once before the first training step
(edgetrain/runtime.py), in the same capped arena. A side graph's session has no memory pattern
(edgetrain/sessions.py), so its graph constants and each buffer of its run are ordinary arena
allocations: the arena grows by a region of exactly a request's size when no freed gap holds
it (arena_extend_strategy 1) and keeps every region after the pass. The training step's
memory-pattern block then takes a freed region big enough or grows the arena by its own size,
and the step's run-time allocations take gaps of either (scratch.RegionArena, scratch.replay).
Later statistics passes and steps repeat the same requests into the same regions, so the
first pass and the first step set the peak.

The side graph's plan is ORT's default reuse plan (on for side graphs) in the order with
Shape nodes run as early as possible (plan.hoist_shape_ops): a statistics graph reads each
layer's input again only for its Shape, at the end of the graph, and the allocator measured
the input freed after its layer (imu_cnn at micro-batch 8: 745,472 bytes of regions for the
pass; holding each input to the end would take 1,103,872).
"""
from __future__ import annotations

from edgetrain.budget import arena_rounded
from exporters.predictor.ortgraph import optimized_graph
from exporters.predictor.plan import StepPlan, plan_step
from exporters.predictor.scratch import RegionArena, replay
from exporters.predictor.shapes import Shapes, initializer_bytes


def side_graph_plan(side: str, batch: int) -> StepPlan:
    """The plan of one run of the side graph at `side` at `batch`, as its session runs it."""
    return plan_step(side, batch, hoist_shapes=True, memory_reuse=True, memory_pattern=False)


def cycle_activation_bytes(train: str, train_plan: StepPlan, side: str, side_plan: StepPlan,
                           batch: int, threads: int, known: Shapes | None) -> int:
    """The arena's activation bytes (everything but the training state) after the side graph
    at `side` runs once and then the training step of `train_plan`."""
    arena = RegionArena()
    for k, init in enumerate(optimized_graph(side).graph.initializer):
        if size := initializer_bytes(init):  # the session keeps its constants while open
            arena.alloc(f"constant{k}", size)
    replay(arena, side, batch, threads, side_plan)
    arena.alloc("memory pattern", arena_rounded(train_plan.pattern_bytes))
    replay(arena, train, batch, threads, train_plan, known)
    return sum(arena.regions)


__all__ = ["cycle_activation_bytes", "side_graph_plan"]
