"""The optimal planner's search: the lowest predicted peak within a FLOP budget, judged on the
training graph as it will ship.

Formulation. Choose checkpoints C among the forward graph's cut points (analysis.py) to
minimise P(C), the step's peak bytes, subject to F(C) <= (r - 1) * F0: F(C) the FLOPs of the
recompute copies counted on the training graph as it ships (the later passes applied), F0
the step's FLOPs without them, r the allowed step-time ratio (`--recompute-time`; FLOPs
stand in for time). P(C) has no closed form: ORT's allocation planner reuses buffers and
lays them out in one memory-pattern block, so holes between them count (on ResNet-50 at
micro-batch 8 the block was 13-41% larger than the most bytes live at once). The static
predictor replays that planner on the rewritten graph, a few seconds on ResNet-50; it is
the objective.

Search. The segment model (segment_model.py) gives, for any byte limit L on its own peak,
the exact fewest-FLOPs plan (a dynamic programme over every subset of cut points): its front
of (model peak, FLOPs) plans is where good plans are, and where the predictor looks:
  1. no checkpoints;
  2. the model's Pareto front within the budget (pareto_front), lowest model peak first:
     the model's optimum within the budget (plan_optimal), then the optimum within one FLOP
     less than that plan costs, and so on down to no extra FLOPs;
  3. local moves from the best plan so far (neighbours): each of its checkpoints dropped or
     moved to the next cut either side, each other cut added, for as long as a round
     improves it. The answer is no worse than any plan judged, among them every neighbour of
     itself; it is the exact optimum where the predictor agrees with the segment model.
A candidate whose modelled FLOPs exceed the budget is skipped unjudged (the model counts
only what the saved tensors need, never more than the rewrite copies); the others are
counted as shipped, and those over the budget are out. The best is the lowest predicted
peak; among equal predictions, the lowest segment-model peak (the predictor's peak is one
moment of the step: a plan with fewer bytes at the model's own worst moment has more room
where the predictor errs; on MobileNetV1 two plans predicted alike measured 27.8 and 29.4 MB,
the lower the one of lower model peak), then the fewest FLOPs. The search judges for at most
`deadline_s` seconds (OPTIMAL_SEARCH_S), then settles for the best so far and says so.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

from exporters.plans.recompute.analysis import Forward
from exporters.plans.recompute.planners import PlanRequest, lowest_peak_within
from exporters.plans.recompute.segment_model import SegmentModel

OPTIMAL_SEARCH_S = 150.0  # seconds of judging before the search settles for its best


@dataclass(frozen=True)
class Judged:
    checkpoints: tuple[str, ...]
    extra_flops: int  # the copies' FLOPs, counted on the graph as it ships
    predicted_peak_bytes: int
    model_peak_bytes: int  # the segment model's peak: the tie-break between equal predictions

    def rank(self) -> tuple[int, int, int]:
        return self.predicted_peak_bytes, self.model_peak_bytes, self.extra_flops


@dataclass(frozen=True)
class Search:
    best: Judged
    judged: int  # candidates the predictor judged
    stopped: bool  # the deadline ended the search before its candidates did


def search_optimal(fwd: Forward, req: PlanRequest,
                   judge: Callable[[tuple[str, ...]], tuple[int, int | None]],
                   deadline_s: float = OPTIMAL_SEARCH_S) -> Search:
    """The plan of lowest predicted peak whose counted FLOPs stay within req.max_extra_cost.

    judge(checkpoints) -> (the copies' FLOPs as shipped, the predicted peak bytes or None
    when the predictor cannot predict it). Raises ValueError when it cannot predict the
    graph without checkpoints (nothing to compare against)."""
    model = SegmentModel(fwd, req)
    budget = req.max_extra_cost
    start = time.monotonic()
    seen: dict[tuple[str, ...], Judged | None] = {}
    judged = 0

    def consider(ck: tuple[str, ...]) -> Judged | None:
        ck = tuple(c for c in fwd.cuts if c in ck)  # one order for one plan
        if ck in seen:
            return seen[ck]
        seen[ck] = None
        if model.cost(ck) > budget:
            return None
        nonlocal judged
        extra, peak = judge(ck)
        judged += 1
        if extra <= budget and peak is not None:
            seen[ck] = Judged(ck, extra, peak, model.peak(ck))
        return seen[ck]

    def best() -> Judged:
        found = [j for j in seen.values() if j is not None]
        return min(found, key=Judged.rank)

    if consider(()) is None:
        raise ValueError("the predictor cannot predict the training graph's peak")
    stopped = False
    for ck in pareto_front(fwd, req, model):
        if time.monotonic() - start > deadline_s:
            stopped = True
            break
        consider(ck)
    improved = not stopped
    while improved:
        improved = False
        current = best()
        moves = neighbours(fwd.cuts, current.checkpoints)
        for ck in moves:
            if time.monotonic() - start > deadline_s:
                stopped = True
                break
            found = consider(ck)
            if found is not None and found.rank() < current.rank():
                improved = True
        improved = improved and not stopped
    return Search(best(), judged, stopped)


def pareto_front(fwd: Forward, req: PlanRequest, model: SegmentModel | None = None
                 ) -> list[tuple[str, ...]]:
    """One plan for each (model peak, FLOPs) pair no other plan within req.max_extra_cost
    beats in both, lowest peak first. `model`: the segment model of fwd and req, if made."""
    out, budget = [], req.max_extra_cost
    if not fwd.cuts:
        return [()] if budget is not None and budget >= 0 else []
    model = model or SegmentModel(fwd, req)
    while budget is not None and budget >= 0:
        ck = lowest_peak_within(model, budget)
        out.append(ck)
        budget = model.cost(ck) - 1
    return out


def neighbours(cuts: tuple[str, ...], checkpoints: tuple[str, ...]) -> list[tuple[str, ...]]:
    """The plans one move from `checkpoints`: one dropped, one moved to the next cut either
    side (if that cut is free), one cut added."""
    chosen = set(checkpoints)
    out = [tuple(c for c in checkpoints if c != drop) for drop in checkpoints]
    for c in checkpoints:
        k = cuts.index(c)
        for j in (k - 1, k + 1):
            if 0 <= j < len(cuts) and cuts[j] not in chosen:
                out.append(tuple(cuts[j] if x == c else x for x in checkpoints))
    return out + [checkpoints + (add,) for add in cuts if add not in chosen]
