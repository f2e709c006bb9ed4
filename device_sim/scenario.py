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
    predicted_max_batch: int | None  # largest batch whose predicted peak fits (0: none; None:
    # the predictor cannot size the step)
    max_batch: int  # confirmed: trains at this batch (0: not even batch 1)
    peak_bytes: int | None  # measured at max_batch
    next_batch_error: str  # the BudgetError at max_batch + 1
    step_time_s: float | None  # measured at max_batch, on this machine: one optimizer step
    # of accumulation_steps micro-batches
    throughput_samples_per_s: float | None  # every sample a timed step trained, per second
    runs: int  # capped runs it took to confirm
    accumulation_steps: int = 1  # micro-batches each capped run's steps summed

    def to_dict(self) -> dict:
        return asdict(self)


def largest_predicted(predict_peak: Callable[[int], int | None], budget_bytes: int) -> int:
    """Largest batch b with predict_peak(b) <= budget (predicted peaks grow with the batch). A
    batch the predictor cannot size (None) counts as not fitting: the search ends below it,
    and the capped runs of largest_batch go on from there."""
    def fits(b: int) -> bool:
        p = predict_peak(b)
        return p is not None and p <= budget_bytes

    if not fits(1):
        return 0
    lo, hi = 1, 2
    while hi <= MAX_BATCH and fits(hi):
        lo, hi = hi, hi * 2
    hi = min(hi, MAX_BATCH + 1)
    while hi - lo > 1:  # lo is predicted to fit; hi is not (or cannot be sized, or is the cap)
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def largest_batch(predict_peak: Callable[[int], int | None], run: Callable[[int], object],
                  budget_bytes: int, accumulation_steps: int = 1) -> FitResult:
    """The largest batch that trains under budget_bytes, confirmed by capped runs.

    run(b) trains capped at the budget and returns a measurement (peak_bytes, step_time_s: an
    optimizer step of accumulation_steps micro-batches of b) or raises BudgetError.
    predict_peak(b) is the static prediction, or None where the predictor
    cannot size the step: then the first guess comes from two measured runs (batch 1 and 2,
    peaks linear in the batch). From the guess the search moves, by the line through the
    largest measured peaks or by doubling steps, until it holds a batch proven to fit and one
    proven to fail, then narrows between them, by the line's guess when it falls inside and
    by bisection otherwise: O(log n) capped runs however wrong the guess, a handful when the
    peaks are near linear. The result is the largest fitting batch b with b + 1
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

    def secant() -> int | None:
        """Where the two largest fitting batches' measured peaks, extended in a line, reach the
        budget (peaks grow about linearly with the batch); None without two such points."""
        pts = sorted(b for b, r in results.items() if not isinstance(r, BudgetError))
        if len(pts) < 2:
            return None
        (b1, b2), (p1, p2) = pts[-2:], (results[pts[-2]].peak_bytes, results[pts[-1]].peak_bytes)
        if p2 <= p1:
            return None
        return b2 + (budget_bytes - p2) * (b2 - b1) // (p2 - p1)

    lo, hi = 0, MAX_BATCH + 1  # largest proven to fit (0: none yet), smallest proven to fail
    step = max(1, guess // 8)
    if fits(guess):
        lo = guess
        while lo < MAX_BATCH:  # up: to where the line says, else by doubling steps
            line = secant()
            nxt = min(line if line is not None and line > lo else lo + step, MAX_BATCH)
            if not fits(nxt):
                hi = nxt
                break
            lo, step = nxt, step * 2
    else:
        hi = guess
        while hi > 1:  # down by doubling steps until a batch fits
            nxt = max(hi - step, 1)
            if fits(nxt):
                lo = nxt
                break
            hi, step = nxt, step * 2
    halved = True
    while hi - lo > 1:  # the line's guess when it falls inside, else (and after a step
        line = secant()  # that did not halve the interval) the middle: O(log n) runs
        mid = (lo + hi) // 2
        c = line if halved and line is not None and lo < line < hi else mid
        if c == lo:
            c = lo + 1
        width = hi - lo
        lo, hi = (c, hi) if fits(c) else (lo, c)
        halved = hi - lo <= width // 2
    if lo == 0:
        return FitResult(budget_bytes, predicted, 0, None, str(results[1]), None, None,
                         len(results), accumulation_steps)
    m = results[lo]
    nxt = str(results[hi]) if hi in results else f"batch {hi} is beyond the search's limit"
    return FitResult(budget_bytes, predicted, lo, m.peak_bytes, nxt, m.step_time_s,
                     round(lo * accumulation_steps / m.step_time_s, 2), len(results),
                     accumulation_steps)
