"""Scenario metrics (seed paper 004): the largest batch that trains under a budget, and the
throughput there. The static predictor proposes the batch; real capped runs confirm it: the
batch must train, and one more sample must fail cleanly with a BudgetError. When the
prediction is off, the confirmed batch is walked to from it and both are reported."""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Callable

from edgetrain.budget import BudgetError

MAX_BATCH = 4096


@dataclass(frozen=True)
class FitResult:
    budget_bytes: int
    predicted_max_batch: int  # largest batch whose predicted peak fits (0: none)
    max_batch: int  # confirmed: trains at this batch (0: not even batch 1)
    peak_bytes: int | None  # measured at max_batch
    next_batch_error: str  # the BudgetError at max_batch + 1
    step_time_s: float | None  # measured at max_batch, on this machine
    throughput_samples_per_s: float | None
    runs: int  # capped runs it took to confirm

    def to_dict(self) -> dict:
        return asdict(self)


def largest_predicted(predict_peak: Callable[[int], int], budget_bytes: int) -> int:
    """Largest batch b with predict_peak(b) <= budget (predicted peaks grow with the batch)."""
    if predict_peak(1) > budget_bytes:
        return 0
    lo, hi = 1, 2
    while hi <= MAX_BATCH and predict_peak(hi) <= budget_bytes:
        lo, hi = hi, hi * 2
    hi = min(hi, MAX_BATCH + 1)
    while hi - lo > 1:  # predict_peak(lo) fits, predict_peak(hi) does not (or hi is the cap)
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if predict_peak(mid) <= budget_bytes else (lo, mid)
    return lo


def largest_batch(predict_peak: Callable[[int], int], run: Callable[[int], object],
                  budget_bytes: int) -> FitResult:
    """run(b) trains capped at the budget and returns a measurement or raises BudgetError."""
    if budget_bytes <= 0:
        raise ValueError(f"budget must be positive, got {budget_bytes}")
    predicted = largest_predicted(predict_peak, budget_bytes)
    runs = 0
    results: dict[int, object] = {}

    def fits(b: int) -> bool:
        nonlocal runs
        if b in results:
            return not isinstance(results[b], BudgetError)
        runs += 1
        try:
            results[b] = run(b)
        except BudgetError as e:
            results[b] = e
        return not isinstance(results[b], BudgetError)

    b = max(predicted, 1)
    if fits(b):
        while b < MAX_BATCH and fits(b + 1):
            b += 1
    else:
        b -= 1
        while b >= 1 and not fits(b):
            b -= 1
        if b == 0:
            return FitResult(budget_bytes, predicted, 0, None, str(results[1]), None, None, runs)
    fits(b + 1)  # known by now: the walk stopped at the first failure
    m = results[b]
    return FitResult(budget_bytes, predicted, b, m.peak_bytes, str(results[b + 1]),
                     m.step_time_s, round(b / m.step_time_s, 2), runs)
