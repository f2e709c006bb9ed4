"""Largest batch under a budget: predicted, then confirmed by capped runs."""
from __future__ import annotations

import json
from dataclasses import dataclass

import pytest

from conftest import cli
from edgetrain.budget import BudgetError
from device_sim.scenario import MAX_BATCH, largest_batch, largest_predicted


@dataclass
class FakeRun:
    peak_bytes: int
    step_time_s: float = 0.01


def make(true_per_sample: int, predicted_per_sample: int, fixed: int = 1000):
    calls = []

    def run(b):
        calls.append(b)
        peak = fixed + true_per_sample * b
        if peak > 10_000:
            raise BudgetError(f"batch {b} needs {peak}", 10_000, peak)
        return FakeRun(peak)

    return (lambda b: fixed + predicted_per_sample * b), run, calls


@pytest.mark.parametrize("true, predicted, expected_pred", [
    (100, 100, 90),   # exact predictor
    (100, 90, 100),   # under-predicts: walk down
    (100, 120, 75),   # over-predicts: walk up
])
def test_confirmed_batch_fits_and_next_fails(true, predicted, expected_pred):
    predict, run, calls = make(true, predicted)
    r = largest_batch(predict, run, 10_000)
    assert r.predicted_max_batch == expected_pred
    assert r.max_batch == 90 and r.peak_bytes == 1000 + 90 * true
    assert "batch 91" in r.next_batch_error
    assert r.throughput_samples_per_s == pytest.approx(90 / 0.01)
    assert r.runs == len(calls) and 90 in calls and 91 in calls


def test_throughput_counts_every_micro_batch_a_step_sums():
    predict, run, _ = make(100, 100)
    r = largest_batch(predict, run, 10_000, accumulation_steps=3)
    assert r.max_batch == 90 and r.accumulation_steps == 3
    assert r.throughput_samples_per_s == pytest.approx(90 * 3 / 0.01)


def test_nothing_fits():
    predict, run, _ = make(100_000, 100_000)
    r = largest_batch(predict, run, 10_000)
    assert (r.predicted_max_batch, r.max_batch, r.peak_bytes) == (0, 0, None)
    assert "batch 1" in r.next_batch_error


def test_largest_predicted_binary_search():
    assert largest_predicted(lambda b: 7 * b, 7 * 37) == 37
    assert largest_predicted(lambda b: 7 * b, 6) == 0
    # a batch the predictor cannot size ends the search below it (capped runs go on)
    assert largest_predicted(lambda b: 7 * b if b < 16 else None, 7 * 37) == 15
    with pytest.raises(ValueError):
        largest_batch(lambda b: b, lambda b: None, 0)


@pytest.mark.slow
def test_fit_cli_confirms_on_tiny_artifact(tiny_artifact):
    r = cli("fit", tiny_artifact, "--budget", "300KiB", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["max_batch"] >= 1 and d["peak_bytes"] <= d["budget_bytes"]
    assert "needs more memory than the budget" in d["next_batch_error"]


@pytest.mark.parametrize("true", [1, 2, 37, 900, 4000])
def test_without_a_prediction_the_search_ends_in_at_most_16_runs(true):
    """The predictor cannot size the step (None): two measured runs give the first guess,
    then gallop and bisection; the answer is exact and the runs few."""
    per = 9000 // true
    _, run, calls = make(per, 1)
    r = largest_batch(lambda b: None, run, 10_000)
    assert r.max_batch == min(9000 // per, MAX_BATCH) and r.predicted_max_batch is None
    assert r.runs == len(set(calls)) <= 16
    assert r.max_batch + 1 in calls or r.max_batch == 4096


@pytest.mark.parametrize("predicted", [1, 3, 500])
def test_a_wrong_prediction_costs_log_runs(predicted):
    """True answer 90; a prediction off by 90x or 5x either way still ends in few runs."""
    _, run, calls = make(100, 1)
    r = largest_batch(lambda b: 1000 + (9000 // predicted) * b, run, 10_000)
    assert r.max_batch == 90 and 91 in calls and r.runs <= 16
