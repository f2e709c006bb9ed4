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
  segment_model.py  bytes and FLOPs of a plan; exact search for the budget planner
  rewrite.py        the plan written into the graph
  remat.py          computed weights (masked, BatchNorm-folded) rebuilt in backward
This module: plan_and_rewrite, the one call the exporter's recompute pass makes
(exporters/passes/recompute.py).
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import onnx

from exporters.predictor.cost import node_costs, recompute_flops
from exporters.graph import without_identities
from exporters.predictor.shapes import Shapes, nbytes, tensor_shapes
from exporters.plans.recompute.analysis import (Forward, RecomputePlan, analyse,
                                                recomputed_tensors, segments)
from exporters.plans.recompute.planners import (PLANNERS, PlanRequest, budget_for_peak,
                                                headroom_bytes, make_plan, plan_forward)
from exporters.plans.recompute.optimal import OPTIMAL_SEARCH_S, search_optimal
from exporters.plans.recompute.remat import rematerialize_weights
from exporters.plans.recompute.rewrite import apply
from exporters.plans.recompute.segment_model import SegmentModel

__all__ = ["PLANNERS", "Forward", "PlanRequest", "RecomputePlan", "SegmentModel", "analyse",
           "apply", "budget_for_peak", "counted_flops", "headroom_bytes", "make_plan",
           "plan_and_rewrite", "plan_forward", "recomputed_tensors",
           "rematerialize_weights", "segments"]


def plan_and_rewrite(original: onnx.ModelProto, planner: str, *, batch: int = 1,
                     budget_bytes: int | None = None,
                     predict_model_peak: Callable[[onnx.ModelProto], int | None] | None = None,
                     known_shapes: Shapes | None = None,
                     min_saving_bytes: int = 0, time_ratio: float | None = None,
                     count_flops: Callable[[onnx.ModelProto], tuple[int, int]] | None = None
                     ) -> tuple[RecomputePlan, onnx.ModelProto]:
    """Plan recompute for the training graph `original`; returns the plan and the graph with
    it written in (`original` itself when the plan rewrites nothing; never changed).

    Both work on the graph as ORT runs it (Identity nodes removed), so names match.
    batch: the micro-batch the plan is for (tensor sizes). predict_model_peak(graph): the
    predicted peak bytes of the artifact with that training graph, None when the predictor
    cannot predict it (the budget planner checks its candidates by it; the sqrt planner keeps
    no checkpoints when they do not lower it by at least min_saving_bytes). known_shapes:
    tensor shapes found by evaluating the forward graph. time_ratio: the optimal planner's
    budget, the step's FLOPs with the plan at most this many times those without it (FLOPs
    stand in for time: a prediction; `edgetrain measure` times the step). count_flops(graph):
    (the step's FLOPs without recompute copies, the copies' FLOPs) of a training graph as it
    will ship (default: counted on the graph as given)."""
    model, renamed = without_identities(original)
    fwd = analyse(model)

    written: dict[tuple, tuple[RecomputePlan, onnx.ModelProto]] = {}

    def write(checkpoints: tuple[str, ...], masked_only: bool = False
              ) -> tuple[RecomputePlan, onnx.ModelProto]:
        """The plan and its graph (made once per plan: the callers may recognise the graph)."""
        if (checkpoints, masked_only) not in written:
            written[checkpoints, masked_only] = rewrite(checkpoints, masked_only)
        return written[checkpoints, masked_only]

    def rewrite(checkpoints: tuple[str, ...], masked_only: bool
                ) -> tuple[RecomputePlan, onnx.ModelProto]:
        plan = RecomputePlan(planner, checkpoints, recomputed_tensors(fwd, checkpoints))
        if planner == "none":  # the graph stays exactly as ORT's artifact builder wrote it
            return plan, original
        rewritten = apply(model, plan, renamed)
        weights = rematerialize_weights(rewritten, masked_only)
        return (dataclasses.replace(plan, recomputed=plan.recomputed + weights),
                rewritten if plan.recomputed or weights else original)

    if planner == "budget" and predict_model_peak is None:
        raise ValueError("the budget planner needs the artifact's predictor")
    predicted: dict[tuple, int | None] = {}

    def predict_peak(checkpoints: tuple[str, ...], masked_only: bool = False) -> int | None:
        if (checkpoints, masked_only) not in predicted:
            predicted[checkpoints, masked_only] = predict_model_peak(
                write(checkpoints, masked_only)[1])
        return predicted[checkpoints, masked_only]

    def predict_lowest(checkpoints: tuple[str, ...]) -> int | None:
        """The predicted peak of the better of finish's two ways to write the plan."""
        both = (predict_peak(checkpoints), predict_peak(checkpoints, True))
        return None if None in both else min(both)

    def finish(checkpoints: tuple[str, ...], note: str = ""
               ) -> tuple[RecomputePlan, onnx.ModelProto]:
        """The plan written in, with every computed weight rebuilt in backward or only the
        masked ones, whichever the predictor puts lower (only the masked ones without it:
        rebuilding costs a small network more than it frees)."""
        masked = True
        if predict_model_peak is not None and planner != "none":
            full, only = predict_peak(checkpoints), predict_peak(checkpoints, True)
            masked = full is None or only is not None and only <= full
        plan, graph = write(checkpoints, masked_only=masked)
        return dataclasses.replace(plan, note=note), graph

    req = PlanRequest(budget_bytes=budget_bytes)
    count = count_flops or (lambda graph: counted_flops(graph, batch))
    step_flops = 0
    if planner != "none":
        costs = node_costs(model, batch)
        step_flops = count(write(())[1])[0] if planner == "optimal" else 0
        req = PlanRequest(
            budget_bytes=budget_bytes,
            tensor_bytes={t: nbytes(s) for t, s in tensor_shapes(model, batch,
                                                                 known_shapes).items()},
            node_cost={name: f for name, _, f, _ in costs},
            predict_peak=predict_peak if predict_model_peak else None,
            max_extra_cost=(None if time_ratio is None
                             else int((time_ratio - 1.0) * step_flops)))
    if planner == "optimal":
        return finish(*_optimal(fwd, req, write, count, predict_peak if predict_model_peak
                                else None, predict_lowest, time_ratio, step_flops,
                                min_saving_bytes))
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


def _optimal(fwd: Forward, req: PlanRequest, write, count, predict_peak, predict_lowest,
             time_ratio: float, step_flops: int, min_saving_bytes: int
             ) -> tuple[tuple[str, ...], str]:
    """The optimal plan's checkpoints and note: searched by the predictor (optimal.py), or,
    where it cannot predict the graph, the segment model's optimum within the budget."""
    budget = f"{time_ratio:g}x the step's FLOPs"
    if predict_peak is not None and fwd.cuts:
        try:
            found = search_optimal(fwd, req, lambda ck: (count(write(ck)[1])[1],
                                                         predict_peak(ck)))
        except ValueError:
            found = None
        if found is not None:
            best, none_peak = found.best, predict_lowest(())
            best_peak = predict_lowest(best.checkpoints)
            stopped = (f"; the search stopped after {found.judged} plans at its "
                       f"{OPTIMAL_SEARCH_S:g} s bound" if found.stopped else "")
            added = best.extra_flops / max(1, step_flops)
            if (best.checkpoints and None not in (none_peak, best_peak)
                    and none_peak - best_peak >= min_saving_bytes):
                return best.checkpoints, (
                    f"the lowest predicted step peak of {found.judged} plans within {budget}: "
                    f"{best_peak:,} bytes, +{added:.1%} FLOPs recomputed (counted on the "
                    f"graph as it ships){stopped}")
            kept = "" if none_peak is None else f" ({none_peak:,} bytes)"
            return (), (f"no checkpoints: none of the {found.judged} plans judged within "
                        f"{budget} is predicted at least {min_saving_bytes:,} bytes below "
                        f"keeping every tensor{kept}{stopped}")
    plan = plan_forward(fwd, "optimal", req)
    plan, extra = _withincounted_flops(fwd, req, plan, write, count)
    why = ("the predictor cannot predict this graph's peak, so " if predict_peak is not None
           else "")
    return plan.checkpoints, (
        f"{why}the lowest peak of the segment model within {budget}: "
        f"+{extra / max(1, step_flops):.1%} FLOPs recomputed (counted on the graph as it "
        "ships)" if plan.checkpoints else
        f"no checkpoints: {why}no plan that lowers the segment model's peak keeps the step "
        f"within {budget}")


OPTIMAL_ROUNDS = 4  # plans the segment model's optimum tries before it settles for a cheaper one


def _withincounted_flops(fwd: Forward, req: PlanRequest, plan: RecomputePlan, write,
                          count) -> tuple[RecomputePlan, int]:
    """The segment model's optimal plan whose recompute copies, counted by `count` on the
    graph as it will ship, stay within req.max_extra_cost, and their FLOPs. The segment
    model counts the nodes a segment's saved tensors need; the rewrite can copy more (e.g.
    what a BatchNorm's gradient reads), so a plan over budget is planned again with the
    model's budget scaled by how far it undercounted, for up to OPTIMAL_ROUNDS plans; then
    no checkpoints (no extra FLOPs)."""
    model_req = req
    for _ in range(OPTIMAL_ROUNDS):
        extra = count(write(plan.checkpoints)[1])[1]
        if extra <= req.max_extra_cost:
            return plan, extra
        modelled = SegmentModel(fwd, model_req).cost(plan.checkpoints)
        model_req = dataclasses.replace(model_req, max_extra_cost=int(
            model_req.max_extra_cost * modelled / max(1, extra)) - 1)
        if model_req.max_extra_cost < 0:
            break
        plan = plan_forward(fwd, "optimal", model_req)
    return plan_forward(fwd, "none", req), 0


def counted_flops(graph: onnx.ModelProto, batch: int) -> tuple[int, int]:
    """(the step's FLOPs without recompute copies, the copies' FLOPs) of a training graph."""
    costs = node_costs(graph, batch)
    extra = recompute_flops(costs)
    return sum(f for _, _, f, _ in costs) - extra, extra
