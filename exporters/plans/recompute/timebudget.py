"""The optimal planner within a time budget (`--recompute optimal --recompute-time r`): the
search's answer (optimal.py) re-judged by the whole training cycle's predicted peak, its
note, and the fallback where the predictor cannot predict the graph (the segment model's
optimum, its time counted as shipped).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable

from exporters.plans.recompute.analysis import Forward
from exporters.plans.recompute.counting import StepCount, node_time_ns
from exporters.plans.recompute.nested import NESTED_PLANS
from exporters.plans.recompute.optimal import (OPTIMAL_PLANS, OPTIMAL_SEARCH_S, Judged, Search,
                                               robust_choice, search_optimal)
from exporters.plans.recompute.planners import PlanRequest, plan_forward
from exporters.plans.recompute.segment_model import SegmentModel
from exporters.predictor.steptime import TimeModel


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
