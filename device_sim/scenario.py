"""Scenario metrics (seed paper 004): the largest batch that trains under a budget, and the
throughput there. The static predictor proposes the batch; real capped runs confirm it: the
batch must train, and one more sample must fail cleanly with a BudgetError. When the
prediction is off, or there is none, a galloping search and bisection between proven batches
find it in O(log n) runs; both figures are reported."""
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


def largest_predicted(predict_peak: Callable[[int], int | None], budget_bytes: int) -> int:
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


def largest_batch(predict_peak: Callable[[int], int | None], run: Callable[[int], object],
                  budget_bytes: int) -> FitResult:
    """The largest batch that trains under budget_bytes, confirmed by capped runs.

    run(b) trains capped at the budget and returns a measurement (peak_bytes, step_time_s) or
    raises BudgetError. predict_peak(b) is the static prediction, or None where the predictor
    cannot size the step: then the first guess comes from two measured runs (batch 1 and 2,
    peaks linear in the batch). From the guess the search gallops (steps that double) until
    it holds a batch proven to fit and one proven to fail, then bisects between them: O(log n)
    capped runs however wrong the guess. The result is the largest fitting batch b with b + 1
    proven to fail (or MAX_BATCH)."""
    if budget_bytes <= 0:
        raise ValueError(f"budget must be positive, got {budget_bytes}")
    predictable = predict_peak(1) is not None
    predicted = largest_predicted(predict_peak, budget_bytes) if predictable else None
    results: dict[int, object] = {}

    def fits(b: int) -> bool:
        if b not in results:
            try:
                results[b] = run(b)
            except BudgetError as e:
                results[b] = e
        return not isinstance(results[b], BudgetError)

    if predicted is not None:
        guess = max(predicted, 1)
    elif not fits(1):
        guess = 1
    elif not fits(2):
        guess = 1
    else:
        p1, p2 = results[1].peak_bytes, results[2].peak_bytes
        guess = 2 + max(0, budget_bytes - p2) // max(1, p2 - p1)
    guess = min(guess, MAX_BATCH)
    lo, hi = 0, MAX_BATCH + 1  # largest proven to fit (0: none yet), smallest proven to fail
    step = max(1, guess // 8)
    if fits(guess):
        lo = guess
        while lo < MAX_BATCH:
            nxt = min(lo + step, MAX_BATCH)
            if not fits(nxt):
                hi = nxt
                break
            lo, step = nxt, step * 2
    else:
        hi = guess
        while hi > 1:
            nxt = max(hi - step, 1)
            if fits(nxt):
                lo = nxt
                break
            hi, step = nxt, step * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    if lo == 0:
        return FitResult(budget_bytes, predicted or 0, 0, None, str(results[1]), None, None,
                         len(results))
    m = results[lo]
    nxt = str(results[hi]) if hi in results else f"batch {hi} is beyond the search's limit"
    return FitResult(budget_bytes, predicted or 0, lo, m.peak_bytes, nxt, m.step_time_s,
                     round(lo / m.step_time_s, 2), len(results))
