"""The optimal planner's search: the lowest predicted peak within a time budget, judged on the
training graph as it will ship.

Formulation. Choose checkpoints C among the forward graph's cut points (analysis.py) to
minimise P(C), the step's peak bytes, subject to T(C) <= (r - 1) * T0: T(C) the predicted
time of the recompute copies counted node by node on the training graph as it ships (the
later passes applied; counting.py, the step-time model of predictor/steptime.py), T0 the
step's predicted time without them, r the allowed step-time ratio (`--recompute-time`).
P(C) has no closed form: ORT's allocation planner reuses buffers and lays them out in one
memory-pattern block, so holes between them count (on ResNet-50 at micro-batch 8 the block
was 13-41% larger than the most bytes live at once). The static predictor replays that
planner on the rewritten graph, a few seconds on ResNet-50; it is the objective.

Search. The segment model (segment_model.py) gives, for any byte limit L on its own peak,
the exact cheapest plan (a dynamic programme over every subset of cut points; node costs in
predicted nanoseconds): its front of (model peak, time) plans is where good plans are, and
where the predictor looks:
  1. no checkpoints;
  2. the sqrt planner's plan (`also`), so that a plan sqrt would ship is always weighed,
     even when the deadline stops the search early;
  3. the model's Pareto front within the budget (pareto_front), lowest model peak first:
     the model's optimum within the budget (plan_optimal), then the optimum within one
     nanosecond less than that plan costs, and so on down to no extra time;
  4. local moves from the best plan so far (neighbours): each of its checkpoints dropped or
     moved to the next cut either side, each other cut added, for as long as a round
     improves the lowest prediction.
A candidate whose modelled time exceeds the budget is skipped unjudged (the model counts
only what the saved tensors need, never more than the rewrite copies); the others are
counted as shipped, and those over the budget are out. The answer (robust_choice): among the
plans predicted within PREDICTION_BAND_RATIO of the lowest prediction, the one of lowest
segment-model peak, then lowest prediction, then least time. The predictor's peak is one
moment of the step, and the lowest of many predictions is the likeliest to be too low: on
MobileNetV1 two plans predicted alike measured 27.8 and 29.4 MB, the lower the one of lower
model peak; on imu_transformer a plan predicted 3 KB under sqrt's measured 66 KB over it.
So the answer is within the band of every plan judged, among them every neighbour of the
lowest; where the predictor agrees with the segment model, it is the exact optimum.

Bound. The search judges at most OPTIMAL_PLANS plans, then the nested rounds at most
NESTED_PLANS more (nested.py), and settles for the best so far, saying so. A count, not a
time: the same graph gets the same plan on every machine (with a time bound, ResNet-50's plan
depended on how fast the host judged: 40 to 60 plans, 2.33x to 2.83x fewer activations).
A wall-clock bound (OPTIMAL_SEARCH_S) remains as a safety net only for graphs far larger than
ResNet-50; the note says when it, and not the count, ended the search.
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Callable

from exporters.plans.recompute.analysis import Forward
from exporters.plans.recompute.counting import StepCount, node_time_ns
from exporters.plans.recompute.nested import NESTED_PLANS, nested_rounds
from exporters.plans.recompute.planners import PlanRequest, lowest_peak_within, plan_forward
from exporters.plans.recompute.segment_model import SegmentModel
from exporters.predictor.steptime import TimeModel

OPTIMAL_PLANS = 160  # plans judged before the nested rounds (front and local moves)
OPTIMAL_SEARCH_S = 1800.0  # a safety net: seconds of judging (both phases) before it settles
# predictions this close to the lowest count as equal (robust_choice); the predictor's
# peaks of optimal plans were 0-5.5% off the measured ones (docs/recompute.md, guards)
PREDICTION_BAND_RATIO = 0.01


@dataclass(frozen=True)
class Judged:
    checkpoints: tuple[str, ...]
    extra_cost: int  # the copies' cost (predicted ns), counted on the graph as it ships
    predicted_peak_bytes: int
    model_peak_bytes: int  # the segment model's peak: the tie-break between equal predictions
    rebuilt: tuple[str, ...] = ()  # checkpoints rebuilt rather than kept (a nested plan)

    def rank(self) -> tuple[int, int, int]:
        return self.predicted_peak_bytes, self.model_peak_bytes, self.extra_cost

    def improves_on(self, best: "Judged") -> bool:
        """Whether the search goes on from this plan (another round of moves): a lower
        predicted peak than the best so far. An equal prediction of lower model peak or cost
        still ranks first, but walking on over such plans wandered: on ResNet-50, 120 plans
        one checkpoint apart, each predicted at the same peak, without ending a round."""
        return self.predicted_peak_bytes < best.predicted_peak_bytes


@dataclass(frozen=True)
class Search:
    best: Judged
    judged: int  # candidates the predictor judged
    stopped: bool  # a bound (plans judged, or the safety net's time) ended the search
    ranked: tuple[Judged, ...] = ()  # every plan judged within the budget, lowest rank first
    timed_out: bool = False  # the bound was the safety net's time (the plan may vary by host)


def search_optimal(fwd: Forward, req: PlanRequest,
                   judge: Callable[[tuple[str, ...], tuple[str, ...]], tuple[int, int | None]],
                   deadline_s: float = OPTIMAL_SEARCH_S,
                   also: tuple[tuple[str, ...], ...] = (),
                   band_ratio: float = PREDICTION_BAND_RATIO,
                   max_plans: int = OPTIMAL_PLANS, nested_plans: int = NESTED_PLANS
                   ) -> Search:
    """The plan of lowest predicted peak whose counted FLOPs stay within req.max_extra_cost.

    judge(checkpoints, rebuilt) -> (the copies' cost as shipped, the predicted peak bytes or
    None when the predictor cannot predict it). At most max_plans plans over kept
    checkpoints, then up to nested_plans nested plans (nested.py); deadline_s seconds for
    both, a safety net. `also`: plans judged right after no checkpoints, before the front
    (the sqrt plan). Raises ValueError when it cannot predict the graph without checkpoints
    (nothing to compare against)."""
    model = SegmentModel(fwd, req)
    budget = req.max_extra_cost
    start = time.monotonic()
    seen: dict[tuple[tuple[str, ...], tuple[str, ...]], Judged | None] = {}  # (ck, rebuilt)
    judged = 0

    def consider(ck: tuple[str, ...], rb: tuple[str, ...] = ()) -> Judged | None:
        ck = tuple(c for c in fwd.cuts if c in ck)  # one order for one plan
        rb = tuple(c for c in ck if c in rb)
        if (ck, rb) in seen:
            return seen[ck, rb]
        seen[ck, rb] = None
        if model.cost(ck, rb) > budget:
            return None
        nonlocal judged
        extra, peak = judge(ck, rb)
        judged += 1
        if extra <= budget and peak is not None:
            seen[ck, rb] = Judged(ck, extra, peak, model.peak(ck, rb), rb)
        return seen[ck, rb]

    def best() -> Judged:
        found = [j for j in seen.values() if j is not None]
        return min(found, key=Judged.rank)

    if consider(()) is None:
        raise ValueError("the predictor cannot predict the training graph's peak")
    timed_out = False

    def out_of_time() -> bool:
        nonlocal timed_out
        timed_out = timed_out or time.monotonic() - start > deadline_s
        return timed_out

    stopped = False
    for ck in [*also, *pareto_front(fwd, req, model)]:
        if judged >= max_plans or out_of_time():
            stopped = True
            break
        consider(ck)
    improved = not stopped
    while improved:
        improved = False
        current = best()
        moves = neighbours(fwd.cuts, current.checkpoints)
        for ck in moves:
            if judged >= max_plans or out_of_time():
                stopped = True
                break
            found = consider(ck)
            if found is not None and found.improves_on(current):
                improved = True
        improved = improved and not stopped
    first = judged
    stopped = nested_rounds(fwd, model, budget, consider, best,
                            lambda: judged - first >= nested_plans or out_of_time()) or stopped
    found = [j for j in seen.values() if j is not None]
    return Search(robust_choice(found, band_ratio), judged, stopped,
                  tuple(sorted(found, key=Judged.rank)), timed_out)


def robust_choice(judged: list[Judged], band_ratio: float = PREDICTION_BAND_RATIO) -> Judged:
    """Among the plans predicted within band_ratio of the lowest prediction, the one of lowest
    segment-model peak (then lowest prediction, then least cost). Taking the lowest of many
    predictions favours the plans the predictor misjudges low (the optimiser's curse); within
    the predictor's error a plan whose own worst moment holds fewer bytes is the safer one."""
    lowest = min(j.predicted_peak_bytes for j in judged)
    near = [j for j in judged if j.predicted_peak_bytes <= lowest * (1 + band_ratio)]
    return min(near, key=lambda j: (j.model_peak_bytes, j.predicted_peak_bytes, j.extra_cost))


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


@dataclass(frozen=True)
class TimeBudget:
    ratio: float  # the step's predicted time with the plan over its time without, at most
    model: TimeModel
    # a plan's step (checkpoints, rebuilt checkpoints), counted as it ships
    count: Callable[..., StepCount]


def finalists(search: Search, also: tuple[str, ...], predict_cycle) -> tuple[Judged, str]:
    """The search's answer re-judged by the whole training cycle's predicted peak (the one the
    manifest gives and the runtime meets): the FINALISTS plans of lowest predicted step
    peak, and `also` (the sqrt plan) if it was within the budget, each with its cycle's peak;
    robust_choice among them. The step is not the whole story: on a transformer encoder the
    plan of lowest step peak had 2.1 MB more activations elsewhere in the cycle than in its
    step, sqrt's none. Returns the answer and how it was chosen, for the note (the search's
    own answer where there is no cycle predictor or it cannot predict)."""
    step = "the lowest predicted step peak (within the band, of lowest segment-model peak)"
    if predict_cycle is None:
        return search.best, step
    chosen = list(search.ranked[:FINALISTS])
    chosen += [j for j in search.ranked if (j.checkpoints, j.rebuilt) == (also, ())
               and j not in chosen]
    cycle = [predict_cycle(j.checkpoints, j.rebuilt) for j in chosen]
    if None in cycle:
        return search.best, step
    judged = [dataclasses.replace(j, predicted_peak_bytes=c) for j, c in zip(chosen, cycle)]
    return robust_choice(judged), (f"of the {len(judged)} plans of lowest predicted step peak "
                                   "and sqrt's, the lowest predicted peak of the whole "
                                   "training cycle (within the band, of lowest segment-model "
                                   "peak)")


FINALISTS = 4  # plans of lowest predicted step peak that the cycle's prediction re-judges


def plan_within_time(fwd: Forward, req: PlanRequest, budget: TimeBudget, predict_peak,
                     predict_lowest, min_saving_bytes: int, costs: list, predict_cycle=None
                     ) -> tuple[tuple[str, ...], str, tuple[str, ...]]:
    """The optimal plan's checkpoints, note and rebuilt checkpoints: the search above with
    node costs and the budget in predicted nanoseconds (`costs`: node_costs' rows of the
    forward graph), or, where the predictor cannot predict the graph, the segment model's
    optimum within it. predict_peak(ck, rebuilt=rb) / predict_lowest(ck, rb): the predicted
    step peak of a plan (None: unknown), the latter the lower of its two ways of rebuilding
    computed weights; budget.count(ck, rb) and predict_cycle(ck, rb) take nested plans."""
    if budget.ratio is None or budget.ratio < 1.0:
        raise ValueError(f"the optimal planner needs a time ratio of at least 1.0, not "
                         f"{budget.ratio!r} (--recompute-time)")
    base = budget.count(())
    req = dataclasses.replace(req, node_cost={r[0]: node_time_ns(budget.model, r)
                                              for r in costs},
                              max_extra_cost=int((budget.ratio - 1.0) * base.step_ns))
    within = f"{budget.ratio:g}x the step's predicted time"

    def added(ck, rb=()) -> str:
        c = budget.count(ck, rb)
        return (f"+{c.time_ratio() - 1:.1%} predicted time, +{c.flops_ratio() - 1:.1%} FLOPs "
                "recomputed (counted on the graph as it ships)")
    if predict_peak is not None and fwd.cuts:
        sqrt_plan = plan_forward(fwd, "sqrt", req).checkpoints
        try:
            found = search_optimal(fwd, req, lambda ck, rb: (
                budget.count(ck, rb).extra_ns, predict_peak(ck, rebuilt=rb)), also=(sqrt_plan,))
        except ValueError:
            found = None
        if found is not None:
            best, cycle_note = finalists(found, sqrt_plan, predict_cycle)
            none_peak = predict_lowest(())
            best_peak = predict_lowest(best.checkpoints, best.rebuilt)
            stopped = (f"; the search stopped after {found.judged} plans at its time bound "
                       f"({OPTIMAL_SEARCH_S:g} s; a faster host may judge more and choose "
                       "another plan)" if found.timed_out else
                       f"; the search stopped at its bound of {OPTIMAL_PLANS} plans, then "
                       f"{NESTED_PLANS} nested" if found.stopped else "")
            if (best.checkpoints and None not in (none_peak, best_peak)
                    and none_peak - best_peak >= min_saving_bytes):
                nested = (f"; {len(best.rebuilt)} of its {len(best.checkpoints)} checkpoints "
                          "rebuilt in backward from the kept one before them (a nested plan)"
                          if best.rebuilt else "")
                return best.checkpoints, (
                    f"{found.judged} plans judged within {within}; chosen: {cycle_note}; its "
                    f"predicted step peak {best_peak:,} bytes, "
                    f"{added(best.checkpoints, best.rebuilt)}{nested}{stopped}"), best.rebuilt
            kept = "" if none_peak is None else f" ({none_peak:,} bytes)"
            return (), (f"no checkpoints: none of the {found.judged} plans judged within "
                        f"{within} is predicted at least {min_saving_bytes:,} bytes below "
                        f"keeping every tensor{kept}{stopped}"), ()
    plan = _within_counted(fwd, req, plan_forward(fwd, "optimal", req), budget)
    why = ("the predictor cannot predict this graph's peak, so " if predict_peak is not None
           else "")
    return plan, (
        f"{why}the lowest peak of the segment model within {within}: {added(plan)}"
        if plan else f"no checkpoints: {why}no plan that lowers the segment model's peak "
        f"keeps the step within {within}"), ()


OPTIMAL_ROUNDS = 4  # plans the segment model's optimum tries before it settles for a cheaper one


def _within_counted(fwd: Forward, req: PlanRequest, plan, budget: TimeBudget
                    ) -> tuple[str, ...]:
    """The segment model's optimal plan whose recompute copies, counted on the graph as it
    will ship, stay within req.max_extra_cost. The segment model counts the nodes a
    segment's saved tensors need; the rewrite can copy more (e.g. what a BatchNorm's
    gradient reads), so a plan over budget is planned again with the model's budget scaled
    by how far it undercounted, for up to OPTIMAL_ROUNDS plans; then no checkpoints."""
    model_req = req
    for _ in range(OPTIMAL_ROUNDS):
        extra = budget.count(plan.checkpoints).extra_ns
        if extra <= req.max_extra_cost:
            return plan.checkpoints
        modelled = SegmentModel(fwd, model_req).cost(plan.checkpoints)
        model_req = dataclasses.replace(model_req, max_extra_cost=int(
            model_req.max_extra_cost * modelled / max(1, extra)) - 1)
        if model_req.max_extra_cost < 0:
            break
        plan = plan_forward(fwd, "optimal", model_req)
    return ()
