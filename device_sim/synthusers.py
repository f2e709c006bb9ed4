"""Users beyond the ten: synthetic wearers made from a real subject's recordings by the ways
one person's watch data differs from another's, each drawn from a seeded generator, so user
N of seed S is the same arrays on every machine.

A synthetic user is (the real subject it starts from, and):
  * placement: how the watch sits on the wrist, a fixed rotation of the sensor frame applied
    to both triads (accelerometer ax..az, gyroscope wx..wz): up to +-ROLL_DEG about the
    forearm axis (x; the watch slid round the wrist), up to +-TILT_DEG about y and z (strap
    tightness, wrist shape). A rotation keeps |a| (gravity) and |w|, as a real one does;
  * per-axis gain (1 + N(0, GAIN_SD)) and offset (N(0, OFFSET_SD) of that channel's spread
    over the whole data set): sensor calibration, which differs between units;
  * sampling-rate jitter: the watch's clock runs fast or slow by up to +-RATE_JITTER, so a
    recording is resampled (linear interpolation) at (1 + e) times the nominal 50 Hz step;
  * arm: with probability 1/2 the user wears the watch on the subject's other arm: the
    subject's arms swap roles (personalisation on one, the held-out test on the other). Both
    arms are real recordings of that subject: nothing is mirrored by hand.
The recordings are whole and in time order, so a synthetic user is cut into windows, a
validation slice and a test arm exactly as a real one (edgetrain/data.py).

Synthetic user ids start at SYNTHETIC_BASE (real subjects are 1..10): user SYNTHETIC_BASE + k
of seed s is drawn from np.random.default_rng((s, k)) and starts from `sources[k %
len(sources)]`.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from edgetrain import data

SYNTHETIC_BASE = 1000
ROLL_DEG, TILT_DEG = 30.0, 10.0
GAIN_SD, OFFSET_SD = 0.03, 0.05
RATE_JITTER = 0.02


@dataclass(frozen=True)
class Wearer:
    """How a synthetic user differs from the real subject it starts from."""
    user: int
    source_subject: int
    roll_deg: float
    tilt_deg: tuple[float, float]  # about y, about z
    gain: tuple[float, ...]  # 6 channels
    offset: tuple[float, ...]  # 6 channels, in the channel's units
    rate_ratio: float  # the watch's sample interval / the nominal one
    arms_swapped: bool

    def to_dict(self) -> dict:
        return asdict(self)


def is_synthetic(user: int) -> bool:
    return user >= SYNTHETIC_BASE


def rotation(roll_deg: float, tilt_y_deg: float, tilt_z_deg: float) -> np.ndarray:
    """Rz @ Ry @ Rx, a proper rotation (det +1)."""
    a, b, c = np.radians([roll_deg, tilt_y_deg, tilt_z_deg])
    rx = np.array([[1, 0, 0], [0, np.cos(a), -np.sin(a)], [0, np.sin(a), np.cos(a)]])
    ry = np.array([[np.cos(b), 0, np.sin(b)], [0, 1, 0], [-np.sin(b), 0, np.cos(b)]])
    rz = np.array([[np.cos(c), -np.sin(c), 0], [np.sin(c), np.cos(c), 0], [0, 0, 1]])
    return rz @ ry @ rx


def wearer(user: int, seed: int, sources: tuple[int, ...], channel_sd: np.ndarray) -> Wearer:
    """The seeded draw for synthetic user `user` (>= SYNTHETIC_BASE)."""
    if not is_synthetic(user):
        raise ValueError(f"synthetic user ids start at {SYNTHETIC_BASE}, got {user}")
    if not sources:
        raise ValueError("synthetic users need at least one real subject to start from")
    k = user - SYNTHETIC_BASE
    rng = np.random.default_rng((seed, k))
    return Wearer(
        user=user, source_subject=int(sources[k % len(sources)]),
        roll_deg=float(rng.uniform(-ROLL_DEG, ROLL_DEG)),
        tilt_deg=tuple(float(v) for v in rng.uniform(-TILT_DEG, TILT_DEG, 2)),
        gain=tuple(float(v) for v in 1 + rng.normal(0, GAIN_SD, 6)),
        offset=tuple(float(v) for v in rng.normal(0, OFFSET_SD, 6) * channel_sd),
        rate_ratio=float(1 + rng.uniform(-RATE_JITTER, RATE_JITTER)),
        arms_swapped=bool(rng.integers(0, 2)))


def transform(x: np.ndarray, w: Wearer) -> np.ndarray:
    """One recording [T, 6] as wearer w's watch would have recorded it."""
    r = rotation(w.roll_deg, *w.tilt_deg)
    out = np.concatenate([x[:, :3] @ r.T, x[:, 3:6] @ r.T], axis=1)
    out = out * np.asarray(w.gain) + np.asarray(w.offset)
    t = np.arange(0, len(x) - 1, w.rate_ratio)  # sample instants in nominal sample units
    return np.stack([np.interp(t, np.arange(len(x)), out[:, c]) for c in range(6)], axis=1)


def channel_spread(recs: data.Recordings) -> np.ndarray:
    """Each channel's standard deviation over every recording (offsets are scaled by it)."""
    return np.concatenate(recs.x).std(axis=0)


def synthetic_recordings(recs: data.Recordings, user: int, seed: int,
                         sources: tuple[int, ...]) -> tuple[data.Recordings, Wearer]:
    """The recordings of synthetic user `user`, labelled with subject id `user`: those of its
    source subject, transformed, arms swapped when the draw says so."""
    w = wearer(user, seed, sources, channel_spread(recs))
    idx = np.flatnonzero(recs.subject == w.source_subject)
    if not len(idx):
        raise data.DataError(f"subject {w.source_subject} is not in the data set")
    side = recs.side[idx]
    return data.Recordings(x=[transform(recs.x[i], w) for i in idx], y=recs.y[idx],
                           subject=np.full(len(idx), user, dtype=np.int64),
                           side=1 - side if w.arms_swapped else side,
                           classes=recs.classes, session=recs.sessions[idx]), w
