"""Recompute planners: small functions in PLANNERS, (Forward, PlanRequest) -> checkpoints.

  none:   no checkpoints
  sqrt:   about sqrt(n) checkpoints among the n cut points (Chen et al. 2016)
  budget: the fewest recomputed FLOPs whose predicted peak fits a byte budget (SegmentModel
          finds exact plans for a limit; the static predictor judges each on its rewritten
          graph)
  optimal: the lowest segment-model peak whose recompute cost (predicted time) stays within
          a step budget (exact over every subset of the cut points)
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Mapping

import onnx

from exporters.plans.recompute.analysis import Forward, RecomputePlan, analyse, recomputed_tensors
from exporters.plans.recompute.segment_model import SegmentModel


@dataclass(frozen=True)
class PlanRequest:
    """What a planner may use besides the forward graph."""

    budget_bytes: int | None = None  # the device's whole training peak must fit in this
    tensor_bytes: Mapping[str, int] = field(default_factory=dict)  # at the planned batch
    # forward node name -> the cost of running it again: FLOPs (sqrt, budget), or the
    # predicted nanoseconds of the step-time model (optimal, whose budget is a time ratio)
    node_cost: Mapping[str, int] = field(default_factory=dict)
    # checkpoints -> predicted peak bytes of the step with that plan written in (the static
    # predictor on the rewritten graph); the budget planner checks its answer with it
    predict_peak: Callable[[tuple[str, ...]], int] | None = None
    max_extra_cost: int | None = None  # the optimal planner's budget of node_cost


def plan_none(fwd: Forward, req: PlanRequest) -> tuple[str, ...]:
    return ()


def plan_sqrt(fwd: Forward, req: PlanRequest) -> tuple[str, ...]:
    """Chen et al. 2016's sqrt(n) memory, placed by bytes: the checkpoints whose segments
    give the lowest activation peak of the segment model (SegmentModel.lowest_peak: exact
    over all subsets of the cut points; with equal blocks it spaces about sqrt(n) of them
    evenly). Spacing by node count instead put transformers' large attention tensors in one
    segment and raised their activations. Without tensor sizes: sqrt(n) spaced by count."""
    n = len(fwd.cuts)
    if n < 2:
        return ()
    if req.tensor_bytes:
        return SegmentModel(fwd, req).lowest_peak()
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
    on rewritten graphs. When neither the segment model's lowest-peak plan nor sqrt fits (the
    model misjudges graphs whose peak is a rebuilt weight beside early, large activations:
    C6 at 4 patches, its 4-checkpoint plan predicted 16,956,672 bytes where one checkpoint
    after the third block gives 12,758,016), checkpoints are added greedily by the predictor
    itself (_greedy_cuts). Raises ValueError, naming the smallest predicted peak reached, when
    no plan fits."""
    if req.budget_bytes is None or req.predict_peak is None:
        raise ValueError("the budget planner needs a byte budget (--budget or --device)")
    usable = req.budget_bytes - headroom_bytes(req.budget_bytes)
    model = SegmentModel(fwd, req)
    predicted: dict[tuple[str, ...], int] = {}

    def fits(ck: tuple[str, ...]) -> bool:
        if ck not in predicted:  # a plan the predictor cannot size counts as not fitting
            peak = req.predict_peak(ck)
            predicted[ck] = math.inf if peak is None else peak
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
        return min(fitting, key=lambda ck: (model.cost(ck), predicted[ck]))
    greedy = _greedy_cuts(fwd, fits, predicted, model.cost)
    if greedy is not None:
        return greedy
    best = min(predicted, key=predicted.get)
    raise ValueError(
        f"no recompute plan fits the budget of {req.budget_bytes:,} bytes: the smallest "
        f"predicted peak of the {len(predicted)} plans checked is {predicted[best]:,} bytes "
        f"({len(best)} checkpoints), and a plan must leave {headroom_bytes(req.budget_bytes):,} "
        f"bytes of headroom. Raise the budget to at least {budget_for_peak(predicted[best]):,} "
        f"bytes, lower the micro-batch (--micro-batch), or use a smaller network.")


def plan_optimal(fwd: Forward, req: PlanRequest) -> tuple[str, ...]:
    """The plan with the lowest segment-model peak whose recompute cost is at most
    req.max_extra_cost (the cheapest among plans of that peak). Exact on the model: its
    cheapest plan within a byte limit L (SegmentModel.cheapest_within, dynamic programming
    over every subset of cut points) costs less the larger L is, so the smallest L whose
    cheapest plan fits the budget, found by bisection over whole bytes, is the optimum."""
    if req.max_extra_cost is None or not req.tensor_bytes:
        raise ValueError("the optimal planner needs tensor sizes and a budget of node cost "
                         "(the export's recompute_time_ratio)")
    if len(fwd.cuts) < 1:
        return ()
    return lowest_peak_within(SegmentModel(fwd, req), req.max_extra_cost)


def lowest_peak_within(model: SegmentModel, max_extra_cost: int) -> tuple[str, ...]:
    """plan_optimal on a segment model already made (its segment costs cached): the lowest
    model peak within max_extra_cost, the cheapest among equals."""
    lo, hi = model.peak(model.lowest_peak()), model.peak(())
    best = model.cheapest_within(lo)
    if best is not None and model.cost(best) <= max_extra_cost:
        return best
    best = ()  # keeping every tensor: the peak hi at no extra cost
    while hi - lo > 1:  # the plan at hi fits the budget, none at lo does
        mid = (lo + hi) // 2
        ck = model.cheapest_within(mid)
        if ck is not None and model.cost(ck) <= max_extra_cost:
            hi, best = mid, ck
        else:
            lo = mid
    return best


BUDGET_SEARCH_STEPS = 512  # the search stops when the limit is known to 1/512 of its range
GREEDY_MAX_CHECKPOINTS = 4  # the greedy fallback's rounds (each predicts every cut once)


def _greedy_cuts(fwd: Forward, fits: Callable[[tuple[str, ...]], bool], predicted: dict,
                 flops: Callable[[tuple[str, ...]], int]) -> tuple[str, ...] | None:
    """Checkpoints added one at a time: each round tries every cut beside those chosen, by
    the static predictor; the first round with a fitting plan returns its fitting plan of
    fewest recomputed FLOPs, else the round's lowest-peak plan is kept for the next. None
    when a round lowers the peak no further or GREEDY_MAX_CHECKPOINTS rounds did not fit.
    `fits` fills `predicted` (plan -> predicted peak)."""
    chosen: tuple[str, ...] = ()
    peak = predicted.get(chosen)
    for _ in range(GREEDY_MAX_CHECKPOINTS):
        trials = [tuple(c for c in fwd.cuts if c in chosen or c == cut)
                  for cut in fwd.cuts if cut not in chosen]
        fitting = [ck for ck in trials if fits(ck)]
        if fitting:
            return min(fitting, key=lambda ck: (flops(ck), predicted[ck]))
        if not trials:
            return None
        best = min(trials, key=lambda ck: predicted[ck])
        if peak is not None and predicted[best] >= peak:
            return None
        chosen, peak = best, predicted[best]
    return None


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
    "optimal": plan_optimal,
}


def make_plan(model: onnx.ModelProto, planner: str, req: PlanRequest = PlanRequest()
              ) -> RecomputePlan:
    return plan_forward(analyse(model), planner, req)


def plan_forward(fwd: Forward, planner: str, req: PlanRequest) -> RecomputePlan:
    if planner not in PLANNERS:
        raise ValueError(f"unknown recompute planner {planner!r}; choose one of {sorted(PLANNERS)}")
    checkpoints = PLANNERS[planner](fwd, req)
    recomputed = recomputed_tensors(fwd, checkpoints)
    return RecomputePlan(planner, checkpoints if recomputed else (), recomputed)
