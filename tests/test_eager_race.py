"""bench/eager_race.py times as many steps a round as the step's length asks: the first
portable step, timed once, sets the count, and a round is measured again only when the
count is more than one; a step of many micro-batches runs no warm-up step before it."""
from __future__ import annotations

import sys

import pytest

from conftest import ROOT

sys.path.insert(0, str(ROOT / "bench"))


def test_timed_steps_follow_the_steps_length():
    from eager_race import LONG_STEP_S, SHORT_STEP_S, timed_steps

    assert timed_steps(SHORT_STEP_S / 10) == 20
    assert timed_steps(SHORT_STEP_S) == timed_steps(LONG_STEP_S / 2) == 3
    assert timed_steps(LONG_STEP_S) == timed_steps(60.0) == 1


def test_only_a_step_of_few_micro_batches_is_warmed_up_first():
    from eager_race import WARM_IN_STEP, warm_up_steps

    assert warm_up_steps(1) == warm_up_steps(WARM_IN_STEP - 1) == 1
    assert warm_up_steps(WARM_IN_STEP) == warm_up_steps(1568) == 0


@pytest.mark.parametrize("config, step_s, calls", [
    ("C1", 20.0, [("portable", 2), ("host", 2), ("eager", 2)] * 3),  # the probe round is kept
    ("C1", 1.0, [("portable", 2)] + [("portable", 4), ("host", 4), ("eager", 4)] * 3),
    ("C1", 0.01, [("portable", 2)] + [("portable", 21), ("host", 21), ("eager", 21)] * 3),
    ("C6", 20.0, [("portable", 1), ("host", 1), ("eager", 1)] * 3),  # 1,568 micro-batches
    ("C6", 1.0, [("portable", 1)] + [("portable", 3), ("host", 3), ("eager", 3)] * 3)])
def test_a_race_probes_once_then_times_three_rounds(monkeypatch, tmp_path, config, step_s,
                                                    calls):
    import eager_race
    from stack_config import STACK

    made = []

    def measured_step(art, micro_batch, accumulation, steps):
        made.append((art, steps))
        warm = eager_race.warm_up_steps(c.accumulation)
        return {"step_times_s": [5 * step_s] * warm + [step_s] * (steps - warm)}

    def eager(c, trainable, steps):
        made.append(("eager", steps))
        return 2 * step_s

    monkeypatch.setattr(eager_race, "export", lambda out, *a, target, **k: target)
    monkeypatch.setattr(eager_race, "measured_step", measured_step)
    monkeypatch.setattr(eager_race, "eager_step_s", eager)
    c = next(c for c in STACK if c.name == config)
    row = eager_race.race(c, tmp_path)
    assert made == calls
    assert row["timed_steps"] == calls[-1][1] - row["warm_up_steps"]
    assert row["portable_step_s"] == row["host_step_s"] == [step_s] * 3
    assert row["portable_ratio"] == pytest.approx(0.5)
