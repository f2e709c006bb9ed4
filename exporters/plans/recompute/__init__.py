"""Recompute (gradient checkpointing) written into ORT's training graph.

ORT's own memory optimizer does nothing on on-device artifacts, so the exporter rewrites the
training graph itself. A plan names *checkpoints*: forward tensors that cut the graph in two,
which backward keeps. The forward nodes between two checkpoints form a segment. Every tensor
of a segment that backward needs (other than the segment's checkpoints) is *recomputed*: the
segment's nodes are copied, the copies start from the segment's input checkpoint, and the
backward consumers read the copies. The original forward tensors then die as soon as the
forward pass no longer needs them.

  analysis.py       the forward graph, cut points, segments
  planners.py       PLANNERS: none, sqrt, budget, optimal (on the segment model)
  optimal.py        the optimal planner's search, judged by the static predictor
  timebudget.py     its answer within a time budget, re-judged by the whole cycle; fallback
  nested.py         its nested plans: checkpoints rebuilt from the kept one before them
  counting.py       FLOPs and predicted time a plan adds (the optimal planner's budget)
  segment_model.py  bytes and FLOPs of a plan; exact search for the budget planner
  rewrite.py        the plan written into the graph
  remat.py          computed weights (masked, BatchNorm-folded) rebuilt in backward
This module: plan_and_rewrite, the one call the exporter's recompute pass makes
(exporters/passes/recompute.py).
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Callable

import onnx

from exporters.predictor.cost import node_costs
from exporters.predictor.steptime import TimeModel, host_time_model
from exporters.graph import without_identities
from exporters.predictor.shapes import Shapes, nbytes, tensor_shapes
from exporters.plans.recompute.analysis import (Forward, RecomputePlan, analyse,
                                                recomputed_tensors, segments)
from exporters.plans.recompute.planners import (PLANNERS, PlanRequest, budget_for_peak,
                                                headroom_bytes, make_plan, plan_forward)
from exporters.plans.recompute.counting import count_step
from exporters.plans.recompute.timebudget import TimeBudget, plan_within_time
from exporters.plans.recompute.remat import rematerialize_weights
from exporters.plans.recompute.rewrite import apply
from exporters.plans.recompute.segment_model import SegmentModel

__all__ = ["PLANNERS", "Forward", "PlanRequest", "RecomputePlan", "SegmentModel", "analyse",
           "apply", "budget_for_peak", "headroom_bytes", "make_plan",
           "plan_and_rewrite", "plan_forward", "recomputed_tensors",
           "rematerialize_weights", "segments"]


def plan_and_rewrite(original: onnx.ModelProto, planner: str, *, batch: int = 1,
                     budget_bytes: int | None = None,
                     predict_model_peak: Callable[[onnx.ModelProto], int | None] | None = None,
                     known_shapes: Shapes | None = None,
                     min_saving_bytes: int = 0, time_ratio: float | None = None,
                     shipped_costs: Callable[[onnx.ModelProto], list] | None = None,
                     time_model: TimeModel | None = None,
                     predict_cycle_peak: Callable[[onnx.ModelProto], int | None] | None = None
                     ) -> tuple[RecomputePlan, onnx.ModelProto]:
    """Plan recompute for the training graph `original`; returns the plan and the graph with
    it written in (`original` itself when the plan rewrites nothing; never changed).

    Both work on the graph as ORT runs it (Identity nodes removed), so names match.
    batch: the micro-batch the plan is for (tensor sizes). predict_model_peak(graph): the
    predicted peak bytes of the artifact with that training graph, None when the predictor
    cannot predict it (the budget planner checks its candidates by it; the sqrt planner keeps
    no checkpoints when they do not lower it by at least min_saving_bytes). known_shapes:
    tensor shapes found by evaluating the forward graph. time_ratio: the optimal planner's
    budget, the step's predicted time with the plan at most this many times its time without
    (time_model's prediction, default the host's fitted model: `edgetrain measure` times the
    step). shipped_costs(graph): cost.node_costs' rows of a training graph as it will ship
    (default: of the graph as given). predict_cycle_peak(graph): the predicted peak of the
    whole training cycle (the manifest's), by which the optimal planner ranks its finalists
    (without it, by the step's)."""
    model, renamed = without_identities(original)
    fwd = analyse(model)

    written: dict[tuple, tuple[RecomputePlan, onnx.ModelProto]] = {}

    def write(checkpoints: tuple[str, ...], masked_only: bool = False,
              rebuilt: tuple[str, ...] = ()) -> tuple[RecomputePlan, onnx.ModelProto]:
        """The plan and its graph (made once per plan: the callers may recognise the graph)."""
        if (checkpoints, masked_only, rebuilt) not in written:
            written[checkpoints, masked_only, rebuilt] = rewrite(checkpoints, masked_only,
                                                                 rebuilt)
        return written[checkpoints, masked_only, rebuilt]

    def rewrite(checkpoints: tuple[str, ...], masked_only: bool, rebuilt: tuple[str, ...]
                ) -> tuple[RecomputePlan, onnx.ModelProto]:
        plan = RecomputePlan(planner, checkpoints,
                             recomputed_tensors(fwd, checkpoints, rebuilt), rebuilt=rebuilt)
        if planner == "none":  # the graph stays exactly as ORT's artifact builder wrote it
            return plan, original
        rewritten = apply(model, plan, renamed)
        weights = rematerialize_weights(rewritten, masked_only)
        return (dataclasses.replace(plan, recomputed=plan.recomputed + weights),
                rewritten if plan.recomputed or weights else original)

    if planner == "budget" and predict_model_peak is None:
        raise ValueError("the budget planner needs the artifact's predictor")
    predicted: dict[tuple, int | None] = {}

    def predict_peak(checkpoints: tuple[str, ...], masked_only: bool = False,
                     rebuilt: tuple[str, ...] = ()) -> int | None:
        key = (checkpoints, masked_only, rebuilt)
        if key not in predicted:
            predicted[key] = predict_model_peak(write(*key)[1])
        return predicted[key]

    def predict_lowest(checkpoints: tuple[str, ...], rebuilt: tuple[str, ...] = ()
                       ) -> int | None:
        """The predicted peak of the better of finish's two ways to write the plan."""
        both = (predict_peak(checkpoints, False, rebuilt), predict_peak(checkpoints, True,
                                                                        rebuilt))
        return None if None in both else min(both)

    def masked_only(checkpoints: tuple[str, ...], rebuilt: tuple[str, ...] = ()) -> bool:
        """Rebuild only the masked weights in backward, or every computed one: whichever the
        predictor puts lower (only the masked ones without it: rebuilding costs a small
        network more than it frees)."""
        if predict_model_peak is None or planner == "none":
            return True
        full = predict_peak(checkpoints, False, rebuilt)
        only = predict_peak(checkpoints, True, rebuilt)
        return full is None or only is not None and only <= full

    def finish(checkpoints: tuple[str, ...], note: str = "", rebuilt: tuple[str, ...] = ()
               ) -> tuple[RecomputePlan, onnx.ModelProto]:
        """The plan written in, its computed weights rebuilt as masked_only says."""
        plan, graph = write(checkpoints, masked_only(checkpoints, rebuilt), rebuilt)
        return dataclasses.replace(plan, note=note), graph

    req = PlanRequest(budget_bytes=budget_bytes)
    costs = node_costs(model, batch) if planner != "none" else []
    if planner != "none":
        req = PlanRequest(
            budget_bytes=budget_bytes,
            tensor_bytes={t: nbytes(s) for t, s in tensor_shapes(model, batch,
                                                                 known_shapes).items()},
            node_cost={name: f for name, _, f, _ in costs},
            predict_peak=predict_peak if predict_model_peak else None)
    if planner == "optimal":
        timing = time_model or host_time_model()
        counted = shipped_costs or (lambda graph: node_costs(graph, batch))
        return finish(*plan_within_time(
            fwd, req, TimeBudget(time_ratio, timing, functools.cache(  # once a plan
                lambda ck, rb=(): count_step(counted(write(ck, rebuilt=rb)[1]), timing))),
            predict_peak if predict_model_peak else None, predict_lowest,
            min_saving_bytes, costs,
            predict_cycle=(None if predict_cycle_peak is None
                           else lambda ck, rb=(): predict_cycle_peak(
                               write(ck, masked_only(ck, rb), rb)[1]))))
    plan = plan_forward(fwd, planner, req)
    if planner == "sqrt" and plan.checkpoints and predict_model_peak is not None:
        with_plan, without = predict_lowest(plan.checkpoints), predict_peak((), True)
        if with_plan is None or without is None:
            return finish((), (
                f"no checkpoints: the predictor cannot predict this graph's peak, so "
                f"it cannot confirm that the {planner} plan lowers it (on attention graphs "
                "it can raise it); `edgetrain measure` an export with and without"))
        if without - with_plan < min_saving_bytes:
            return finish((), (
                f"no checkpoints: the {planner} plan's predicted peak ({with_plan:,} "
                f"bytes) is not at least {min_saving_bytes:,} bytes below keeping every "
                f"tensor ({without:,} bytes)"))
    return finish(plan.checkpoints)
