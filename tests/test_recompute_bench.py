"""bench/recompute.py's table: a budget the planner refuses is a row of its own."""
from __future__ import annotations

import statistics
import sys

from conftest import ROOT

sys.path.insert(0, str(ROOT / "bench"))
import recompute  # noqa: E402


def test_a_refused_budget_is_a_row_with_the_planners_reason_and_every_cell():
    refusal = ("no recompute plan fits the budget of 4,698,009 bytes: the smallest predicted "
               "peak of the 113 plans checked is 4,767,488 bytes (4 checkpoints), and a plan "
               "must leave 262,144 bytes of headroom. Raise the budget to at least 5,029,632")
    measured = {"network": "n", "plan": "sqrt", "batch": 8, "budget_bytes": None,
                "checkpoints": 4, "recomputed_tensors": 9, "extra_flops": 2e8,
                "peak_bytes": 31_290_368, "within_budget": True,
                "predicted_peak_bytes": 32_017_920, "activation_bytes": 27_799_808,
                "activation_cut_ratio": 1.596, "step_time_s": 0.13, "time_ratio": 1.5,
                "time_vs_sqrt": 1.0}
    refused = {"network": "n", "plan": "budget@10%", "batch": 8, "budget_bytes": 4_698_009,
               "refused": refusal}
    lines = recompute.table([measured, refused]).splitlines()
    cells = [line.count("|") for line in lines]
    assert len(set(cells)) == 1, cells  # every row has the header's columns
    assert "| 4,698,009 | refused: the smallest predicted peak of the 113 plans checked is " \
        "4,767,488 bytes (4 checkpoints), and a plan must leave 262,144 bytes of headroom |" \
        in lines[-1]


def _row(plan: str, acts: int, time_ratio: float, peak: int, predicted: int) -> dict:
    return {"network": "n", "plan": plan, "activation_bytes": acts, "time_ratio": time_ratio,
            "peak_bytes": peak, "predicted_peak_bytes": predicted}


def test_guards_flag_an_unordered_network_and_an_optimal_plan_over_its_time():
    ok = [_row("none", 300, 1.0, 500, 500), _row("sqrt", 200, 1.2, 400, 404),
          _row("optimal", 150, 1.34, 350, 346)]
    g = recompute.guards(ok)[0]
    assert g["ordered"] and g["within_time"] and g["optimal_peak_error_ratio"] == -0.0114
    bad = [_row("none", 300, 1.0, 500, 500), _row("sqrt", 200, 1.2, 400, 400),
           _row("optimal", 210, 1.36, 410, 410)]
    g = recompute.guards(bad)[0]
    assert not g["ordered"] and not g["within_time"]
    lines = recompute.guard_table(bad).splitlines()
    assert lines[-1] == "| n | 300 | 200 | 210 | **no** | 1.36x **over** | - | +0.0% | - |"
    bad[2]["predicted_time_ratio"] = 1.284
    assert "| 1.36x **over** | 1.28x | +0.0% |" in recompute.guard_table(bad)
    for r, quiet in zip(bad, ([True, True], [True, False], [True, True])):
        r["host_load_runs"] = [{"quiet": q} for q in quiet]
    assert recompute.guard_table(bad).splitlines()[-1].endswith("| +0.0% | 1 of 6 |")
    assert recompute.guards(bad[:2]) == []  # no optimal row: nothing to guard


def test_time_ratios_pair_each_round_with_nones_and_sqrts_of_the_same_round():
    # the host is fast in round 1 only: round by round optimal takes 1.1x, 0.75x and 1.1x
    # none's time, and the ratio is their median; a refused budget row has no times
    rows = [{"network": "n", "plan": "none", "step_times_s": [1.0, 2.0, 2.0]},
            {"network": "n", "plan": "sqrt", "step_times_s": [1.2, 2.4, 2.0]},
            {"network": "n", "plan": "optimal", "step_times_s": [1.1, 1.5, 2.2]},
            {"network": "n", "plan": "budget@10%", "refused": "no plan"}]
    out = recompute.with_time_ratios(rows)
    opt = out[2]
    assert opt["time_ratio_rounds"] == [1.1, 0.75, 1.1] and opt["time_ratio"] == 1.1
    assert opt["time_vs_sqrt"] == round(statistics.median([1.1 / 1.2, 1.5 / 2.4, 1.1]), 3)
    assert out[0]["time_ratio"] == 1.0 and out[3] == rows[3]  # a refusal has no times
    assert "time_ratio" not in rows[2]  # the rows given are left as they were


def test_short_steps_get_more_rounds():
    assert recompute.rounds_for(recompute.SHORT_STEP_S) == recompute.ROUNDS
    assert recompute.rounds_for(recompute.SHORT_STEP_S / 10) == recompute.SHORT_ROUNDS
