"""Intervals over users and recordings, never single windows."""
from __future__ import annotations

import numpy as np
import pytest

from edgetrain.intervals import UserTest, gain_interval, window_interval


def clustered_user(rng, recordings=12, windows=8, p_before=0.6, p_after=0.75):
    """Every window of a recording shares its fate: a recording is right or wrong whole."""
    groups = np.repeat(np.arange(recordings), windows)
    before = np.repeat(rng.random(recordings) < p_before, windows).astype(int)
    after = np.repeat(rng.random(recordings) < p_after, windows).astype(int)
    return before, after, groups


def test_recording_interval_is_wider_than_the_window_one_on_clustered_data():
    rng = np.random.default_rng(0)
    b, a, g = clustered_user(rng)
    rec = gain_interval([UserTest.of(b, a, g)])
    gain, lo, hi = window_interval(b, a)
    assert rec.gain_points == pytest.approx(gain)
    assert rec.high_points - rec.low_points > 2 * (hi - lo)  # 8 windows a recording: ~sqrt(8)


def test_user_interval_resamples_users_too():
    """Users whose gains disagree give a wider interval than users whose gains agree, with the
    same recordings per user: the users themselves are resampled."""
    def user(gain_recordings: int) -> UserTest:
        g = np.arange(10)
        before = np.zeros(10, int)
        after = (g < gain_recordings).astype(int)
        return UserTest.of(before, after, g)
    alike = gain_interval([user(5), user(5), user(5), user(5)])
    unlike = gain_interval([user(0), user(10), user(1), user(9)])
    assert alike.gain_points == pytest.approx(unlike.gain_points) == pytest.approx(50.0)
    assert unlike.users == 4 and unlike.recordings == 40
    assert unlike.high_points - unlike.low_points > alike.high_points - alike.low_points


def test_error_reduction_and_strings():
    u = UserTest.of("0011", "0111", [0, 1, 2, 3])
    g = gain_interval([u])
    assert g.gain_points == pytest.approx(25.0)
    assert g.error_reduction == pytest.approx(0.5)  # error 0.5 -> 0.25
    with pytest.raises(ValueError, match="equally long"):
        UserTest.of("01", "011", [0, 1])
