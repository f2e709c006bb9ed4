"""The optimal recompute planner: the lowest peak within a cost budget, as exhaustive search
finds it, and written into an exported artifact with the same gradients."""
from __future__ import annotations

import re
from itertools import combinations

import numpy as np
import onnx
import pytest
import torch

from edgetrain.manifest import Plan, load_manifest
from exporters.export import ExportOptions, export_artifact
from exporters.plans.recompute import Forward, PlanRequest, SegmentModel
from exporters.plans.recompute.optimal import (PREDICTION_BAND_RATIO, Judged, neighbours,
                                               pareto_front, robust_choice, search_optimal)
from exporters.plans.recompute.planners import plan_optimal
from test_recompute import chain, one_step_gradients


def _chain_forward(sizes, costs) -> tuple[Forward, PlanRequest]:
    nodes, size, flops = [], {}, {}
    for k, (b, f) in enumerate(zip(sizes, costs)):
        nodes.append(onnx.helper.make_node("Relu", [f"t{k}"], [f"t{k + 1}"], name=f"n{k}"))
        size[f"t{k + 1}"], flops[f"n{k}"] = b, f
    n = len(sizes)
    fwd = Forward(tuple(nodes), tuple(f"t{k}" for k in range(1, n)),
                  frozenset(f"t{k}" for k in range(1, n + 1)), {f"t{k + 1}": k for k in range(n)})
    return fwd, PlanRequest(tensor_bytes=size, node_cost=flops)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_optimal_plan_is_the_lowest_peak_within_the_cost_budget(seed):
    rng = np.random.default_rng(seed)
    sizes, costs = rng.integers(1, 40, 10).tolist(), rng.integers(1, 9, 10).tolist()
    fwd, req = _chain_forward(sizes, costs)
    seg = SegmentModel(fwd, req)
    plans = [c for r in range(len(fwd.cuts) + 1) for c in combinations(fwd.cuts, r)]
    most = max(seg.cost(c) for c in plans)
    for budget in range(0, most + 2):
        req_b = PlanRequest(tensor_bytes=req.tensor_bytes, node_cost=req.node_cost,
                            max_extra_cost=budget)
        found = plan_optimal(fwd, req_b)
        best = min(seg.peak(c) for c in plans if seg.cost(c) <= budget)
        assert seg.cost(found) <= budget
        assert seg.peak(found) == best, (budget, found)
    # a budget of no cost allows only checkpoints whose segments rebuild nothing
    free = plan_optimal(fwd, PlanRequest(tensor_bytes=req.tensor_bytes,
                                         node_cost=req.node_cost, max_extra_cost=0))
    assert seg.cost(free) == 0


def test_the_optimal_planner_needs_its_budget():
    fwd, req = _chain_forward([4, 5, 6], [1, 1, 1])
    with pytest.raises(ValueError, match="budget of node cost"):
        plan_optimal(fwd, req)


def test_an_optimal_export_keeps_the_gradients_and_records_its_budget(tmp_path):
    opts = ExportOptions(plan=Plan(micro_batch=4), recompute="optimal",
                         recompute_time_ratio=1.25)
    m = export_artifact(chain(), torch.zeros(2, 3, 32, 32), tmp_path / "opt",
                        classes=list("abcd"), options=opts)
    none = export_artifact(chain(), torch.zeros(2, 3, 32, 32), tmp_path / "none",
                           classes=list("abcd"), options=opts.replace(recompute="none"))
    assert m.plan.recompute == "optimal" and m.plan.recompute_time_ratio == 1.25
    assert none.plan.recompute_time_ratio is None
    assert m.plan.checkpoints and "within 1.25x the step's predicted time" in (
        m.plan.recompute_note)
    # the copies' predicted time, counted on the graph as it ships, stays within the budget
    added = float(re.search(r"\+([\d.]+)% predicted time", m.plan.recompute_note).group(1))
    assert 0 < added <= 25.0, m.plan.recompute_note
    assert load_manifest(tmp_path / "opt").plan == m.plan
    assert m.predicted["peak_bytes"] < none.predicted["peak_bytes"]
    a, b = one_step_gradients(tmp_path / "none"), one_step_gradients(tmp_path / "opt")
    for name in a:
        ga, gb = np.array(a[name]), np.array(b[name])
        assert np.abs(ga - gb).max() <= 1e-6 * max(1e-12, np.abs(ga).max()), name
    # a budget of no extra time: nothing recomputed, and the note says why
    flat = export_artifact(chain(), torch.zeros(2, 3, 32, 32), tmp_path / "flat",
                           classes=list("abcd"), options=opts.replace(recompute_time_ratio=1.0))
    assert not flat.plan.recomputed and "no checkpoints" in flat.plan.recompute_note
    with pytest.raises(ValueError, match="at least 1.0"):
        ExportOptions(recompute="optimal", recompute_time_ratio=0.9)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_search_finds_the_exhaustive_optimum_of_its_judge(seed):
    """Judged by the segment model itself, the search returns the exhaustive optimum within
    the budget. Judged by a peak that punishes a cut the model's optimum uses (as the memory
    pattern's holes can), its answer is no worse than any plan on the model's Pareto front
    and than every plan one move from it; the front holds every Pareto-optimal (peak, cost)
    pair of the exhaustive enumeration."""
    rng = np.random.default_rng(seed)
    sizes, costs = rng.integers(1, 40, 9).tolist(), rng.integers(1, 9, 9).tolist()
    fwd, req = _chain_forward(sizes, costs)
    seg = SegmentModel(fwd, req)
    plans = [c for r in range(len(fwd.cuts) + 1) for c in combinations(fwd.cuts, r)]
    budget = max(seg.cost(c) for c in plans) // 2
    req = PlanRequest(tensor_bytes=req.tensor_bytes, node_cost=req.node_cost,
                      max_extra_cost=budget)
    found = search_optimal(fwd, req, lambda ck, rb: (seg.cost(ck, rb), seg.peak(ck, rb)))
    assert found.best.predicted_peak_bytes <= min(seg.peak(c) for c in plans
                                                  if seg.cost(c) <= budget)
    kept = search_optimal(fwd, req, lambda ck, rb: (seg.cost(ck, rb), seg.peak(ck, rb)),
                          nested_plans=0)  # without nested plans: the exhaustive optimum
    assert kept.best.predicted_peak_bytes == min(seg.peak(c) for c in plans
                                                 if seg.cost(c) <= budget)
    bad = set(plan_optimal(fwd, req)[:1])

    def holes(ck, rb=()):
        return seg.peak(ck, rb) + (1000 if bad & set(ck) else 0)

    found = search_optimal(fwd, req, lambda ck, rb: (seg.cost(ck, rb), holes(ck, rb)))
    best = found.best
    assert not found.stopped and seg.cost(best.checkpoints, best.rebuilt) <= budget
    assert best.predicted_peak_bytes == holes(best.checkpoints, best.rebuilt)
    lowest = min(holes(c) for c in pareto_front(fwd, req) if seg.cost(c) <= budget)
    assert found.best.predicted_peak_bytes <= lowest * (1 + PREDICTION_BAND_RATIO)
    exact = search_optimal(fwd, req, lambda ck, rb: (seg.cost(ck, rb), holes(ck, rb)),
                           band_ratio=0.0)
    rivals = pareto_front(fwd, req) + neighbours(fwd.cuts, exact.best.checkpoints)
    assert exact.best.predicted_peak_bytes <= min(holes(c) for c in rivals
                                                  if seg.cost(c) <= budget)
    values = {(seg.peak(c), seg.cost(c)) for c in plans if seg.cost(c) <= budget}
    pareto = {v for v in values if not any(w[0] <= v[0] and w[1] <= v[1] and w != v
                                           for w in values)}
    assert {(seg.peak(c), seg.cost(c)) for c in pareto_front(fwd, req)} == pareto
    stopped = search_optimal(fwd, req, lambda ck, rb: (seg.cost(ck, rb), seg.peak(ck, rb)),
                             deadline_s=0)
    assert stopped.stopped and stopped.timed_out
    assert stopped.judged >= 1  # no checkpoints is always judged
    for bound in (1, 3, 5):  # a count bound: the same plans judged on any host, at any speed
        counted = [search_optimal(fwd, req, lambda ck, rb: (seg.cost(ck, rb),
                                                            seg.peak(ck, rb)),
                                  max_plans=bound, nested_plans=2) for _ in range(2)]
        assert all(c.stopped and not c.timed_out for c in counted)
        assert counted[0].judged == counted[1].judged == bound + 2
        assert counted[0].ranked == counted[1].ranked


def test_within_the_predictors_band_the_lower_model_peak_wins():
    """The lowest of many predictions is the likeliest to be too low: a plan predicted under
    another by less than the band loses to it when the other's segment-model peak is lower;
    outside the band, the lower prediction wins whatever the model says."""
    a = Judged(("a",), 5, 1_000_000, 900_000)
    b = Judged(("b",), 9, 1_000_000 + PREDICTION_BAND_RATIO * 1_000_000 // 2, 700_000)
    c = Judged(("c",), 1, 1_000_000 + 2 * PREDICTION_BAND_RATIO * 1_000_000, 100_000)
    assert robust_choice([a, b, c]) == b
    assert robust_choice([a, b, c], band_ratio=0.0) == a
    assert robust_choice([a, c]) == a
    # equal predictions and model peaks: the cheaper plan
    assert robust_choice([a, Judged(("d",), 3, 1_000_000, 900_000)]).checkpoints == ("d",)


def test_without_a_predictor_the_segment_models_optimum_keeps_within_the_predicted_time(
        tmp_path):
    """Where the predictor cannot judge, optimal is the segment model's optimum within the
    time budget, its copies counted on the rewritten graph by the same step-time model; a
    budget that allows no copies gives no checkpoints, and the note says why."""
    from exporters.plans.recompute import plan_and_rewrite
    from exporters.plans.recompute.counting import count_step
    from exporters.predictor.cost import node_costs
    from exporters.predictor.steptime import OpTime, TimeModel

    export_artifact(chain(), torch.zeros(2, 3, 32, 32), tmp_path / "none", classes=list("abcd"),
                    plan=Plan(micro_batch=4))
    graph = onnx.load(str(tmp_path / "none" / "training_model.onnx"))
    timing = TimeModel(2e-6, OpTime(1e-6, 1e-10, 0.0), {"Conv": OpTime(5e-6, 1e-10, 0.0)})
    plan, rewritten = plan_and_rewrite(graph, "optimal", batch=4, time_ratio=1.3,
                                       time_model=timing)
    assert plan.checkpoints and "within 1.3x the step's predicted time" in plan.note
    assert "lowest peak of the segment model" in plan.note
    count = count_step(node_costs(rewritten, 4), timing)
    assert count.extra_ns > 0 and count.time_ratio() <= 1.3
    flat, same = plan_and_rewrite(graph, "optimal", batch=4, time_ratio=1.0, time_model=timing)
    assert not flat.checkpoints and flat.note.startswith("no checkpoints") and same is graph


def test_the_finalists_are_rejudged_by_the_whole_cycles_peak():
    """The plans of lowest predicted step peak, and sqrt's, are ranked again by the whole
    cycle's predicted peak; without a cycle prediction the search's answer stands."""
    from exporters.plans.recompute.optimal import Search
    from exporters.plans.recompute.timebudget import FINALISTS, finalists

    ranked = tuple(Judged((f"c{k}",), k, 1000 + 100 * k, 500) for k in range(FINALISTS + 2))
    sqrt_plan = ranked[-1].checkpoints  # ranked last by the step, but a finalist
    search = Search(ranked[0], len(ranked), False, ranked)
    cycle = {j.checkpoints: 5000 - 100 * k for k, j in enumerate(ranked)}
    best, how = finalists(search, sqrt_plan, lambda ck, rb: cycle.get(ck))
    assert best.checkpoints == sqrt_plan and best.predicted_peak_bytes == cycle[sqrt_plan]
    assert "whole training cycle" in how
    # sqrt's not judged: 4 finalists
    best, _ = finalists(search, ("nowhere",), lambda ck, rb: cycle.get(ck))
    assert best.checkpoints == ranked[FINALISTS - 1].checkpoints
    assert finalists(search, sqrt_plan, None)[0] == ranked[0]
    assert finalists(search, sqrt_plan, lambda ck, rb: None)[0] == ranked[0]


def test_nested_rounds_start_from_the_plan_of_fewest_checkpoints_of_the_lowest_prediction():
    """Plans predicted alike (as ResNet-50's best kept plans were) differ in what nesting
    can add, so the nested rounds start from the one of fewest checkpoints (then least
    cost), not from the one of lowest model peak (more checkpoints). Here
    every plan of two checkpoints or more is predicted alike, and only a nested plan of two
    is lower: one move from the cheapest start, none from a many-cut one."""
    fwd, req = _chain_forward([30, 5, 30, 5, 30, 5, 30, 5, 30], [1, 9, 1, 9, 1, 9, 1, 9, 1])
    seg = SegmentModel(fwd, req)
    req = PlanRequest(tensor_bytes=req.tensor_bytes, node_cost=req.node_cost,
                      max_extra_cost=1000)

    def judge(ck, rb):  # as shipped, each checkpoint costs a little more (its PassThrough)
        peak = 900 if rb and len(ck) == 2 else 1000 if len(ck) >= 2 else 1500
        return seg.cost(ck, rb) + 10 * len(ck), peak

    found = search_optimal(fwd, req, judge)
    tied = [j for j in found.ranked if not j.rebuilt and j.predicted_peak_bytes == 1000]
    assert len({len(j.checkpoints) for j in tied}) > 1  # a cheap start and a many-cut one
    assert found.best.predicted_peak_bytes == 900 and found.best.rebuilt
