"""bench/eager_race.py times as many steps a round as the step's length asks: the first
portable step, timed once, sets the count, and a round is measured again only when the
count is more than one."""
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


@pytest.mark.parametrize("step_s, calls", [
    (20.0, [("portable", 2), ("host", 2), ("eager", 2)] * 3),  # the probe round is kept
    (1.0, [("portable", 2)] + [("portable", 4), ("host", 4), ("eager", 4)] * 3),
    (0.01, [("portable", 2)] + [("portable", 21), ("host", 21), ("eager", 21)] * 3)])
def test_a_race_probes_once_then_times_three_rounds(monkeypatch, tmp_path, step_s, calls):
    import eager_race
    from stack_config import STACK

    made = []

    def measured_step(art, micro_batch, accumulation, steps):
        made.append((art, steps))
        return {"step_times_s": [5 * step_s] + [step_s] * (steps - 1)}

    def eager(c, trainable, steps):
        made.append(("eager", steps))
        return 2 * step_s

    monkeypatch.setattr(eager_race, "export", lambda out, *a, target, **k: target)
    monkeypatch.setattr(eager_race, "measured_step", measured_step)
    monkeypatch.setattr(eager_race, "eager_step_s", eager)
    c = next(c for c in STACK if c.update == "all")
    row = eager_race.race(c, tmp_path)
    assert made == calls
    assert row["timed_steps"] == calls[-1][1] - 1
    assert row["portable_step_s"] == row["host_step_s"] == [step_s] * 3
    assert row["portable_ratio"] == pytest.approx(0.5)
