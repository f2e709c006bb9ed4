"""The personalisation gate's verdicts (bench/personalise_gate.py) follow the figures."""
from __future__ import annotations

import sys

from conftest import ROOT

sys.path.insert(0, str(ROOT / "bench"))
import personalise_gate as gate  # noqa: E402

BASE = {"gain_points": 2.9, "low_points": 0.2, "high_points": 5.8, "error_reduction": 0.33,
        "error_reduction_low": 0.03, "error_reduction_high": 0.65, "users_below_0": 4,
        "users_below_minus_5": 0, "worst_user": 20, "worst_points": -1.8, "commit": "abc1234", "peak_bytes": 1_005_568}


def test_the_headline_needs_a_reduction_or_a_gain_a_positive_lower_end_and_no_big_loser():
    headline = gate.POINTS[0]
    assert gate.verdict(headline, BASE).startswith("**met**")
    assert "not met" in gate.verdict(headline, {**BASE, "low_points": -0.1})
    assert "not met" in gate.verdict(headline, {**BASE, "users_below_minus_5": 1})
    assert "not met" in gate.verdict(headline, {**BASE, "error_reduction": 0.29})
    assert gate.verdict(headline, {**BASE, "error_reduction": 0.29, "gain_points": 5.0}
                        ).startswith("**met**")
    assert gate.verdict(headline, None) == "not measured"


def test_an_aim_is_reported_as_reached_not_as_met():
    aim = next(p for p in gate.POINTS if not p.required)
    assert gate.verdict(aim, BASE).startswith("**reached**")
    assert "not reached" in gate.verdict(aim, {**BASE, "low_points": -0.3})


def test_the_small_tiers_points():
    mcu2, mcu256 = (next(p for p in gate.POINTS if p.device == d)
                    for d in ("mcu-2mb", "mcu-256kb"))
    assert "not met" in gate.verdict(mcu2, BASE)  # +2.9 < +3
    assert gate.verdict(mcu2, {**BASE, "gain_points": 3.0}).startswith("**met**")
    assert gate.verdict(mcu256, {**BASE, "gain_points": 0.1, "low_points": -2}
                        ).startswith("**met**")
    assert "not met" in gate.verdict(mcu256, {**BASE, "gain_points": 0.0})


def test_the_one_megabyte_point_needs_the_peak_under_it_and_the_gain():
    mcu1 = next(p for p in gate.POINTS if p.device == "mcu-1mb")
    fine = {**BASE, "gain_points": 3.0}
    assert gate.verdict(mcu1, fine).startswith("**met**")
    assert "not met" in gate.verdict(mcu1, BASE)  # +2.9 < +3
    assert "not met" in gate.verdict(mcu1, {**fine, "peak_bytes": (1 << 20) + 1})
    assert "not met" in gate.verdict(mcu1, {**fine, "low_points": 0.0})
