"""Intervals for a personalisation gain that resample what is independent: users, and within a
user, recordings; never single windows.

Test windows overlap by half and every window of a recording shares its class, its day and its
placement, so a model's errors come in runs, a recording at a time. A bootstrap over windows
treats each window as news and gives intervals far too narrow (tests/test_intervals.py shows it
on data with known clustering). Here each draw resamples the users (with replacement) and,
for every drawn user, their test recordings (with replacement); a recording's windows move
together, and before and after stay paired (the same windows score both models).

A user is (before, after, groups): which test windows each model got right ("0"/"1" strings
or 0/1 arrays, in order) and the recording of each window.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

DRAWS = 4000
CONFIDENCE = 0.95


def _bits(s) -> np.ndarray:
    if isinstance(s, str):
        return np.frombuffer(s.encode(), np.uint8).astype(np.int64) - ord("0")
    return np.asarray(s, np.int64)


@dataclass(frozen=True)
class UserTest:
    """One user's test windows, summed per recording."""

    right_before: np.ndarray  # [G] windows right before personalising, per recording
    right_after: np.ndarray  # [G]
    windows: np.ndarray  # [G] windows per recording

    @classmethod
    def of(cls, before, after, groups) -> "UserTest":
        b, a = _bits(before), _bits(after)
        g = np.asarray(groups)
        if not (len(b) == len(a) == len(g)) or not len(g):
            raise ValueError(f"before, after and groups must be equally long and not empty "
                             f"({len(b)}, {len(a)}, {len(g)})")
        _, idx = np.unique(g, return_inverse=True)
        return cls(np.bincount(idx, b), np.bincount(idx, a), np.bincount(idx))

    @property
    def recordings(self) -> int:
        return len(self.windows)

    @property
    def accuracy_before(self) -> float:
        return float(self.right_before.sum() / self.windows.sum())

    @property
    def accuracy_after(self) -> float:
        return float(self.right_after.sum() / self.windows.sum())


@dataclass(frozen=True)
class GainInterval:
    """Mean gain over users in points, and the error reduction, with 95% intervals."""

    gain_points: float
    low_points: float
    high_points: float
    error_reduction: float  # 1 - mean error after / mean error before (pooled over users)
    error_reduction_low: float
    error_reduction_high: float
    users: int
    recordings: int

    def to_dict(self) -> dict:
        return {k: round(v, 6) if isinstance(v, float) else v for k, v in vars(self).items()}


def _accuracies(u: UserTest, pick: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Before and after accuracies of `u` for each row of recording indices `pick` [D, G]."""
    n = u.windows[pick].sum(axis=-1)
    return u.right_before[pick].sum(axis=-1) / n, u.right_after[pick].sum(axis=-1) / n


def gain_interval(users: list[UserTest], draws: int = DRAWS, seed: int = 0) -> GainInterval:
    """Mean over users of (after - before) accuracy, and of error rates, with percentile
    intervals from a two-level paired bootstrap (users, then each user's recordings); one user
    gives the recording-level interval of that user."""
    if not users:
        raise ValueError("an interval needs at least one user")
    rng = np.random.default_rng(seed)
    k = len(users)
    chosen = rng.integers(0, k, (draws, k)) if k > 1 else np.zeros((draws, 1), np.int64)
    before = np.empty((draws, k))
    after = np.empty((draws, k))
    for i, u in enumerate(users):  # each slot a user fills gets its own recordings drawn
        slots = np.argwhere(chosen == i)
        if not len(slots):
            continue
        pick = rng.integers(0, u.recordings, (len(slots), u.recordings))
        b, a = _accuracies(u, pick)
        before[slots[:, 0], slots[:, 1]] = b
        after[slots[:, 0], slots[:, 1]] = a
    gains = 100.0 * (after - before).mean(axis=1)
    err_b, err_a = 1.0 - before.mean(axis=1), 1.0 - after.mean(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        reductions = np.where(err_b > 0, 1.0 - err_a / err_b, 0.0)
    tail = 100 * (1 - CONFIDENCE) / 2
    lo, hi = np.percentile(gains, [tail, 100 - tail])
    rlo, rhi = np.percentile(reductions, [tail, 100 - tail])
    mb = np.mean([u.accuracy_before for u in users])
    ma = np.mean([u.accuracy_after for u in users])
    reduction = 1.0 - (1.0 - ma) / (1.0 - mb) if mb < 1.0 else 0.0
    return GainInterval(100.0 * float(ma - mb), float(lo), float(hi), float(reduction),
                        float(rlo), float(rhi), k, int(sum(u.recordings for u in users)))


def window_interval(before, after, draws: int = DRAWS, seed: int = 0
                    ) -> tuple[float, float, float]:
    """The naive interval: a paired bootstrap over single windows (every window its own
    recording). Kept to show how much narrower it is; never reported as a result."""
    b = _bits(before)
    g = gain_interval([UserTest.of(b, after, np.arange(len(b)))], draws, seed)
    return g.gain_points, g.low_points, g.high_points
