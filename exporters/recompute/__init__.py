"""Recompute (gradient checkpointing) written into ORT's training graph.

ORT's own memory optimizer does nothing on on-device artifacts, so the exporter rewrites the
training graph itself. A plan names *checkpoints*: forward tensors that cut the graph in two,
which backward keeps. The forward nodes between two checkpoints form a segment. Every tensor
of a segment that backward needs (other than the segment's checkpoints) is *recomputed*: the
segment's nodes are copied, the copies start from the segment's input checkpoint, and the
backward consumers read the copies. The original forward tensors then die as soon as the
forward pass no longer needs them.

  analysis.py       the forward graph, cut points, segments
  planners.py       PLANNERS: none, sqrt, budget
  segment_model.py  bytes and FLOPs of a plan; exact search for the budget planner
  rewrite.py        the plan written into the graph
  remat.py          masked layers' dense weights rebuilt in backward
This module: plan_and_rewrite, the one call the exporter makes (graph file in, file out).
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import onnx

from exporters.cost import node_costs
from exporters.graph import without_identities
from exporters.predictor.shapes import Shapes, nbytes, tensor_shapes
from exporters.recompute.analysis import Forward, RecomputePlan, analyse, recomputed_tensors, segments
from exporters.recompute.planners import (PLANNERS, PlanRequest, budget_for_peak, headroom_bytes,
                                          make_plan, plan_forward)
from exporters.recompute.remat import rematerialize_masked_weights
from exporters.recompute.rewrite import apply
from exporters.recompute.segment_model import SegmentModel

__all__ = ["PLANNERS", "Forward", "PlanRequest", "RecomputePlan", "SegmentModel", "analyse",
           "apply", "budget_for_peak", "headroom_bytes", "make_plan", "plan_and_rewrite",
           "plan_forward", "recomputed_tensors", "rematerialize_masked_weights", "segments"]


def plan_and_rewrite(path: str, planner: str, *, batch: int = 1,
                     budget_bytes: int | None = None,
                     predict_file_peak: Callable[[], int] | None = None,
                     known_shapes: Shapes | None = None,
                     min_saving_bytes: int = 0) -> RecomputePlan:
    """Plan recompute for the training graph at `path` and rewrite the file in place.

    Both work on the graph as ORT runs it (Identity nodes removed), so names match.
    batch: the micro-batch the plan is for (tensor sizes). predict_file_peak: the predicted
    peak bytes of the artifact with the training graph now at `path`, None when the
    predictor cannot predict it (the budget planner
    writes candidates there to check them; the sqrt planner keeps no checkpoints when they
    do not lower it by at least min_saving_bytes). known_shapes: tensor shapes found by
    evaluating the forward graph.
    If planning fails the file is left as it was."""
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

    if planner == "budget" and predict_file_peak is None:
        raise ValueError("the budget planner needs the artifact's predictor")

    def predict_peak(checkpoints: tuple[str, ...]) -> int:
        write(checkpoints)
        return predict_file_peak()

    req = PlanRequest(budget_bytes=budget_bytes)
    if planner != "none":
        req = PlanRequest(
            budget_bytes=budget_bytes,
            tensor_bytes={t: nbytes(s) for t, s in tensor_shapes(model, batch,
                                                                 known_shapes).items()},
            node_flops={name: f for name, _, f, _ in node_costs(model, batch)},
            predict_peak=predict_peak if predict_file_peak else None)
    try:
        plan = plan_forward(fwd, planner, req)
        if planner == "sqrt" and plan.checkpoints and predict_file_peak is not None:
            with_plan, without = predict_peak(plan.checkpoints), predict_peak(())
            if with_plan is None or without is None:
                note = ("no checkpoints: the predictor cannot predict this graph's peak, so "
                        "it cannot confirm that the sqrt plan lowers it (on attention graphs "
                        "it can raise it); `edgetrain measure` an export with and without")
                return dataclasses.replace(write(()), note=note)
            if without - with_plan < min_saving_bytes:
                note = (f"no checkpoints: the sqrt plan's predicted peak ({with_plan:,} bytes) "
                        f"is not at least {min_saving_bytes:,} bytes below keeping every "
                        f"tensor ({without:,} bytes)")
                return dataclasses.replace(write(()), note=note)
    except BaseException:
        onnx.save(original, path)
        raise
    return write(plan.checkpoints)
