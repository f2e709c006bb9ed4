"""Data pipeline: the GASF transform, patches, and the checks on a user's arrays."""
from __future__ import annotations

import numpy as np
import pytest

from edgetrain import data


def windows(n=3, t=50, seed=0):
    return np.random.default_rng(seed).normal(0, 1, (n, t, 6)).astype(np.float32)


def test_gasf_region_equals_slice_of_whole_image():
    x = windows()
    mean, scale = data.channel_stats(x)
    img = data.gasf_images(x, mean, scale, image_size=64)
    assert img.shape == (3, 3, 64, 64) and img.dtype == np.float32
    sig = data.standardised_signals(x, mean, scale, 64)
    region = data.gasf_region(sig[1], slice(16, 32), slice(48, 64))
    np.testing.assert_array_equal(region, img[1, :, 16:32, 48:64])
    patches = data.to_patches(img, 16)
    assert patches.shape == (3, 16, 3, 16, 16)
    np.testing.assert_array_equal(patches[1, 1 * 4 + 3], region)


def test_gasf_holds_accelerometer_above_and_gyroscope_below_diagonal():
    x = windows(1)
    mean, scale = data.channel_stats(x)
    s = data.standardised_signals(x, mean, scale, 32)[0]
    img = data.gasf_images(x, mean, scale, 32)[0]
    i, j = 3, 20  # above the diagonal: accelerometer x
    phi = np.arccos(s[:, 0])
    assert img[0, i, j] == pytest.approx(np.cos(phi[i] + phi[j]), abs=1e-5)
    phi_g = np.arccos(s[:, 3])  # below: gyroscope x
    assert img[0, j, i] == pytest.approx(np.cos(phi_g[j] + phi_g[i]), abs=1e-5)


def test_windows_do_not_cross_recordings():
    recs = data.Recordings(x=[np.zeros((450, 6)), np.ones((250, 6))], y=np.array([0, 1]),
                           subject=np.array([1, 1]), side=np.array([0, 1]), classes=("a", "b"))
    xw, yw = data.windows(recs, np.array([0, 1]), window=200, stride=100)
    assert xw.shape == (3 + 1, 200, 6)
    assert list(yw) == [0, 0, 0, 1]


@pytest.mark.parametrize("mutate, message", [
    (lambda x, y: (x[:, :, :5], y), "expects"),
    (lambda x, y: (x[:0], y[:0]), "no samples"),
    (lambda x, y: (x.astype(np.int32), y), "float"),
    (lambda x, y: (x, y[:-1]), "one label per sample"),
    (lambda x, y: (np.where(np.arange(x.size).reshape(x.shape) == 7, np.nan, x), y), "NaN/Inf"),
    (lambda x, y: (np.where(np.arange(x.size).reshape(x.shape) == 3, np.inf, x), y), "NaN/Inf"),
    (lambda x, y: (x, np.where(np.arange(len(y)) == 2, 7, y)), "out of range"),
    (lambda x, y: (x, np.where(np.arange(len(y)) == 2, -1, y)), "out of range"),
    (lambda x, y: (x, y.astype(np.float32)), "integer"),
])
def test_check_xy_refuses_bad_input(mutate, message):
    x = np.zeros((4, 3, 8, 8), np.float32)
    y = np.array([0, 1, 2, 0])
    with pytest.raises(data.DataError, match=message):
        data.check_xy(*mutate(x, y), (3, 8, 8), 3)


def test_load_npz_names_missing_arrays(tmp_path):
    np.savez(tmp_path / "d.npz", inputs=np.zeros((2, 3)))
    with pytest.raises(data.DataError, match="named 'x' and 'y'"):
        data.load_npz(tmp_path / "d.npz", (3,), 2)
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    with pytest.raises(data.DataError, match="not a .npz archive"):
        data.load_npz(tmp_path / "junk.npz", (3,), 2)


def test_builtin_data_split_by_arm_without_overlap():
    recs = data.load_recordings()
    assert len(recs.x) == 140 and len(recs.classes) == 7
    split = data.leave_one_subject_out(recs, 10)
    assert len(split.personalise[1]) > 50 and len(split.test[1]) > 50
    assert set(split.personalise[1]) == set(range(7)) == set(split.test[1])
    # no personalisation window equals any test window
    a = split.personalise[0].reshape(len(split.personalise[0]), -1)
    b = split.test[0].reshape(len(split.test[0]), -1)
    assert not (a[:, None, :5] == b[None, :, :5]).all(-1).any()
    with pytest.raises(data.DataError, match="not in the built-in data set"):
        data.leave_one_subject_out(recs, 11)


def test_validation_split_cuts_each_recording_in_time_without_shared_samples():
    recs = data.load_recordings()
    (xt, yt), (xv, yv) = data.validation_split(recs, 9, 0.25)
    full = data.leave_one_subject_out(recs, 9).personalise
    assert len(yt) + len(yv) <= len(full[1]) and len(yv) >= 7  # every recording validates
    assert set(yv) == set(range(7)) == set(yt)
    # no validation window shares a sample row with any training window
    rows_t = {r.tobytes() for r in xt.reshape(-1, 6)}
    assert not any(r.tobytes() in rows_t for r in xv.reshape(-1, 6))
    test_rows = {r.tobytes() for r in data.leave_one_subject_out(recs, 9).test[0].reshape(-1, 6)}
    assert not any(r.tobytes() in test_rows for r in xv.reshape(-1, 6))
    with pytest.raises(ValueError, match="val_fraction must lie"):
        data.validation_split(recs, 9, 1.0)
    with pytest.raises(ValueError, match="no validation window"):
        data.validation_split(recs, 9, 0.01)
