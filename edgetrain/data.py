"""Smartwatch IMU data: recordings -> windows -> 3x224x224 images -> 32x32 patches.

numpy only: the device runs this. The recordings are the ones shipped inside the `seglearn`
wheel (10 subjects, 7 shoulder exercises, accelerometer + gyroscope at 50 Hz); the file is
located without importing seglearn, whose import would pull pandas and scikit-learn.

Time series to image (documented in docs/concepts.md): each window of 6 channels is resampled
to `image_size` points, standardised with the population's per-channel mean and scale, clipped
to [-1, 1], and turned into Gramian Angular Summation Fields (Wang & Oates 2015):
GASF[i, j] = cos(phi_i + phi_j) with phi = arccos(s). Image channel k (k = x, y, z) holds the
accelerometer k-axis GASF on and above the diagonal and the gyroscope k-axis GASF below it, so
all six signals reach the network in three channels.
"""
from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edgetrain.samples import (DataError, SampleArray, blocks, read_npz, refuse_beyond_float32,
                               refuse_untrainable_magnitude)

__all__ = ["DataError", "SampleArray", "check_xy", "load_npz"]  # and the functions below

SAMPLE_RATE_HZ = 50
WINDOW_SAMPLES = 200  # 4 s windows
WINDOW_STRIDE = 100  # 2 s hop inside one recording
IMAGE_SIZE = 224
PERSONALISE_SIDE = 0  # the held-out user's recordings on this arm personalise...
TEST_SIDE = 1  # ...and the other arm's recordings test (no window spans both sets)


@dataclass(frozen=True)
class Recordings:
    x: list  # list of float64 [T, 6] arrays (ax, ay, az, wx, wy, wz)
    y: np.ndarray  # [R] int class per recording
    subject: np.ndarray  # [R] subject id 1..10
    side: np.ndarray  # [R] arm 0/1
    classes: tuple[str, ...]
    session: np.ndarray | None = None  # [R] 1, 2, ... (None: one session, as the watch data)

    @property
    def sessions(self) -> np.ndarray:
        return np.ones(len(self.y), np.int64) if self.session is None else self.session

    def subset(self, index: np.ndarray, x: list | None = None) -> "Recordings":
        """The recordings at `index` (their samples replaced by `x` when given)."""
        index = np.asarray(index, np.int64)
        return Recordings([self.x[r] for r in index] if x is None else x, self.y[index],
                          self.subject[index], self.side[index], self.classes,
                          self.sessions[index])


def imu_file() -> Path:
    spec = importlib.util.find_spec("seglearn")
    if spec is None or spec.origin is None:
        raise DataError("the built-in IMU data ships in the seglearn wheel, which is not "
                        "installed; run `pip install --no-deps seglearn==1.2.5` (make setup does)")
    path = Path(spec.origin).parent / "data" / "watch_dataset.npy"
    if not path.is_file():
        raise DataError(f"{path} is missing from the seglearn install; reinstall seglearn==1.2.5")
    return path


def load_recordings() -> Recordings:
    d = np.load(imu_file(), allow_pickle=True).item()
    return Recordings(x=list(d["X"]), y=np.asarray(d["y"], dtype=np.int64),
                      subject=np.asarray(d["subject"], dtype=np.int64),
                      side=np.asarray(d["side"], dtype=np.int64),
                      classes=tuple(str(c) for c in d["y_labels"]))


def windows(recs: Recordings, index: np.ndarray, window: int = WINDOW_SAMPLES,
            stride: int = WINDOW_STRIDE) -> tuple[np.ndarray, np.ndarray]:
    """Cut the chosen recordings into windows. Returns x [N, window, 6] float32, y [N] int64."""
    xs, ys = [], []
    for r in index:
        rec = recs.x[r]
        for start in range(0, len(rec) - window + 1, stride):
            xs.append(rec[start:start + window])
            ys.append(recs.y[r])
    if not xs:
        return np.zeros((0, window, 6), np.float32), np.zeros((0,), np.int64)
    return np.stack(xs).astype(np.float32), np.asarray(ys, np.int64)


def window_recordings(recs: Recordings, index: np.ndarray, window: int = WINDOW_SAMPLES,
                      stride: int = WINDOW_STRIDE) -> np.ndarray:
    """The recording (an index into recs) of each window `windows(recs, index)` cuts."""
    counts = [max(0, (len(recs.x[r]) - window) // stride + 1) for r in index]
    return np.repeat(np.asarray(index, np.int64), counts)


@dataclass(frozen=True)
class UserSplit:
    population: tuple[np.ndarray, np.ndarray]  # windows of the other subjects
    personalise: tuple[np.ndarray, np.ndarray]  # the user's windows on PERSONALISE_SIDE
    test: tuple[np.ndarray, np.ndarray]  # the user's windows on TEST_SIDE


def _check_subject(recs: Recordings, user: int) -> None:
    subjects = sorted(set(int(s) for s in recs.subject))
    if user not in subjects:
        raise DataError(f"user {user} is not in the built-in data set; choose one of {subjects}")


def population_windows(recs: Recordings, held_out: tuple[int, ...]
                       ) -> tuple[np.ndarray, np.ndarray]:
    """Windows of every subject not in `held_out` (the population a model pretrains on)."""
    for u in held_out:
        _check_subject(recs, u)
    return windows(recs, np.flatnonzero(~np.isin(recs.subject, held_out)))


def leave_one_subject_out(recs: Recordings, user: int) -> UserSplit:
    _check_subject(recs, user)
    mine = recs.subject == user
    return UserSplit(
        population=population_windows(recs, (user,)),
        personalise=windows(recs, np.flatnonzero(mine & (recs.side == PERSONALISE_SIDE))),
        test=windows(recs, np.flatnonzero(mine & (recs.side == TEST_SIDE))),
    )


def validation_split(recs: Recordings, user: int, val_fraction: float = 0.25
                     ) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """The user's personalisation windows cut in time into (train, validation).

    Each recording on PERSONALISE_SIDE is split at (1 - val_fraction) of its length: windows
    wholly before the cut train, windows wholly after it validate, and none spans it. Used to
    choose a learning rate from the user's own data without touching the test arm; neighbouring
    windows of one recording are alike, so validation accuracy reads optimistic (data.md) and
    only ranks settings against each other.
    """
    if not 0 < val_fraction < 1:
        raise ValueError(f"val_fraction must lie in (0, 1), got {val_fraction}")
    _check_subject(recs, user)
    mine = np.flatnonzero((recs.subject == user) & (recs.side == PERSONALISE_SIDE))
    cut = {int(r): int(round(len(recs.x[r]) * (1 - val_fraction))) for r in mine}
    head = recs.subset(mine, [recs.x[r][:cut[r]] for r in mine])
    tail = recs.subset(mine, [recs.x[r][cut[r]:] for r in mine])
    everything = np.arange(len(mine))
    train, val = windows(head, everything), windows(tail, everything)
    if len(val[1]) == 0:
        raise ValueError(f"val_fraction {val_fraction} leaves user {user} no validation window "
                         f"of {WINDOW_SAMPLES} samples; use a larger fraction")
    return train, val


def channel_stats(x: np.ndarray) -> tuple[list[float], list[float]]:
    """Per-channel mean and scale (3 standard deviations) of windows [N, T, 6]."""
    flat = x.reshape(-1, x.shape[-1]).astype(np.float64)
    return flat.mean(0).tolist(), (3.0 * flat.std(0) + 1e-6).tolist()


def standardised_signals(x: np.ndarray, mean, scale, image_size: int = IMAGE_SIZE
                         ) -> np.ndarray:
    """Raw windows [N, T, 6] -> resampled, standardised, clipped signals [N, image_size, 6]."""
    n, t, c = x.shape
    assert c == 6, x.shape
    src = np.linspace(0.0, 1.0, t)
    dst = np.linspace(0.0, 1.0, image_size)
    s = np.empty((n, image_size, 6), np.float32)
    for i in range(n):
        for ch in range(6):
            s[i, :, ch] = np.interp(dst, src, x[i, :, ch])
    return np.clip((s - np.float32(mean)) / np.float32(scale), -1.0, 1.0)


def standardised_windows(x: np.ndarray, mean, scale) -> np.ndarray:
    """Raw windows [N, T, 6] -> per-channel standardised windows [N, T, 6] float32 (what the
    raw-IMU networks read; the device does the same per sample, edgetrain/feed.py)."""
    return ((x - np.float32(mean)) / np.float32(scale)).astype(np.float32)


def gasf_region(s: np.ndarray, rows: slice, cols: slice) -> np.ndarray:
    """GASF image [3, len(rows), len(cols)] of one window's signals s [S, 6], for a region.

    Pixel (i, j) of channel k is cos(phi_i + phi_j) of accelerometer axis k where j >= i
    and of gyroscope axis k where j < i (i, j are whole-image indices).
    """
    size = len(s)
    i = np.arange(size)[rows]
    j = np.arange(size)[cols]
    a, b = s[rows], s[cols]  # [r, 6], [c, 6]
    sin_a = np.sqrt(np.maximum(0.0, 1.0 - a * a))
    sin_b = np.sqrt(np.maximum(0.0, 1.0 - b * b))
    g = a[:, None, :] * b[None, :, :] - sin_a[:, None, :] * sin_b[None, :, :]  # [r, c, 6]
    upper = (j[None, :] >= i[:, None])[..., None]
    img = np.where(upper, g[..., 0:3], g[..., 3:6])
    return np.ascontiguousarray(img.transpose(2, 0, 1), dtype=np.float32)


def gasf_images(x: np.ndarray, mean, scale, image_size: int = IMAGE_SIZE) -> np.ndarray:
    """Raw windows [N, T, 6] -> images [N, 3, image_size, image_size] float32 in [-1, 1]."""
    s = standardised_signals(x, mean, scale, image_size)
    whole = slice(None)
    return np.stack([gasf_region(w, whole, whole) for w in s]) if len(s) else \
        np.zeros((0, 3, image_size, image_size), np.float32)


def to_patches(images: np.ndarray, patch: int) -> np.ndarray:
    """[N, C, H, W] -> [N, P, C, patch, patch] with P = (H/patch) * (W/patch), row-major."""
    n, c, h, w = images.shape
    if h % patch or w % patch:
        raise DataError(f"image {h}x{w} does not divide into {patch}x{patch} patches")
    gh, gw = h // patch, w // patch
    p = images.reshape(n, c, gh, patch, gw, patch).transpose(0, 2, 4, 1, 3, 5)
    return np.ascontiguousarray(p.reshape(n, gh * gw, c, patch, patch))


def load_npz(path: str | os.PathLike, data_shape: tuple[int, ...], num_classes: int
             ) -> tuple[SampleArray, SampleArray]:
    """A user's `x`/`y` arrays, read from disk as needed (edgetrain/samples.py) and checked
    against the artifact's input spec."""
    x, y = read_npz(path)
    return check_xy(x, y, data_shape, num_classes, where=str(path))


def check_xy(x, y, data_shape: tuple[int, ...], num_classes: int, where: str = "data"):
    """Check x [N, *data_shape] and y [N] against the artifact, a block at a time; returns
    them as float32 and int64 (arrays converted, SampleArrays as they are: already so)."""
    want = tuple(int(d) for d in data_shape)
    if x.ndim != len(want) + 1 or tuple(x.shape[1:]) != want:
        raise DataError(f"{where}: x has shape {tuple(x.shape)}, the artifact expects "
                        f"[N, {', '.join(map(str, want))}]; reshape your windows to match")
    if len(x) == 0:
        raise DataError(f"{where}: x holds no samples; personalisation needs at least one")
    if not np.issubdtype(x.dtype, np.floating):
        raise DataError(f"{where}: x has dtype {x.dtype}, expected a float array")
    if tuple(y.shape) != (len(x),):
        raise DataError(f"{where}: y has shape {tuple(y.shape)}, expected ({len(x)},): "
                        "one label per sample of x")
    if not np.issubdtype(y.dtype, np.integer):
        raise DataError(f"{where}: y has dtype {y.dtype}, expected integer class labels")
    for lo, block in blocks(x):
        bad = ~np.isfinite(block)
        if bad.any():
            first = np.argwhere(bad)[0]
            first[0] += lo
            raise DataError(f"{where}: x holds NaN/Inf values (the first at index "
                            f"{tuple(int(i) for i in first)}); drop or repair those samples")
        refuse_beyond_float32(block, f"{where}: x")
        refuse_untrainable_magnitude(block, f"{where}: x", lo)
    for _, block in blocks(y):
        out = (block < 0) | (block >= num_classes)
        if out.any():
            raise DataError(f"{where}: label {int(block[out][0])} is out of range; the artifact "
                            f"has {num_classes} classes, labels must be 0..{num_classes - 1}")
    if isinstance(x, SampleArray):
        return x, y
    return np.asarray(x, np.float32), np.asarray(y, np.int64)
