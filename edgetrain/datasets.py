"""The built-in data sets and how a user's recordings are split to personalise and to test.

Two data sets, one windowing API (edgetrain.data.windows: 4 s windows of 6 channels at 50 Hz):
- `watch`: the smartwatch IMU recordings in the seglearn wheel (10 subjects, 7 shoulder
  exercises, one session: one recording per subject, class and arm).
- `hapt`: UCI HAPT (30 subjects, 6 activities, two sessions; edgetrain/hapt.py). A waist-worn
  phone, not a wrist: session 2 has the phone placed where the subject chose.

A protocol turns one user's recordings into training windows, a validation slice (cut in time
from the training recordings, for on-device selection and the guard) and test windows with
the recording each came from (intervals resample recordings, never single windows):
- `later-session` (hapt, the gate): personalise on session 1, validate on the end of each
  class's session-1 windows (one window dropped between: no sample in both), test on the later
  session, as a watch lives it: the same wearer, a later day, the device put on again.
- `other-arm` (watch; a placement shift, context only): personalise on the left arm, test on
  the right. A watch never sees its wearer's other arm.
- `within-set` (watch; an upper bound, context only): each left-arm recording cut in time,
  0-50% train, 50-75% validate, 75-100% test: the same set of repetitions, memorised easily.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from edgetrain import data, hapt
from edgetrain.datacache import cached_recordings
from edgetrain.samples import DataError

Arrays = tuple[np.ndarray, np.ndarray]


@dataclass(frozen=True)
class Split:
    """One user's windows under a protocol."""

    train: Arrays
    val: Arrays | None  # None when no validation slice was asked for
    test: Arrays
    test_groups: np.ndarray  # [N test] the recording each test window comes from


@dataclass(frozen=True)
class DataSet:
    name: str
    load: Callable[[], data.Recordings]
    protocol: str  # the default protocol of --user runs
    protocols: tuple[str, ...]
    summary: str
    source: Callable[[], Path]  # the shipped file `load` decodes (the decoded cache's key)


def _windows_of(recs: data.Recordings, index: np.ndarray) -> tuple[np.ndarray, np.ndarray,
                                                                   np.ndarray]:
    """x, y and the recording index of every window of the recordings `index`, in order."""
    x, y = data.windows(recs, index)
    return x, y, data.window_recordings(recs, index)


def time_cut(y: np.ndarray, fraction: float, gap: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """(training, validation) indices of time-ordered windows: per class the last `fraction`
    validate, the `gap` windows before them are dropped (they overlap), the rest train."""
    if not 0 < fraction < 1:
        raise ValueError(f"the validation fraction must lie in (0, 1), got {fraction}")
    fit, val = [], []
    for c in np.unique(y):
        idx = np.flatnonzero(y == c)
        n_val = int(np.ceil(fraction * len(idx))) if len(idx) >= 2 + gap else 0
        val.append(idx[len(idx) - n_val:] if n_val else idx[:0])
        fit.append(idx[:max(0, len(idx) - n_val - gap)] if n_val else idx)
    val_idx = np.sort(np.concatenate(val))
    if not len(val_idx):
        raise DataError(f"no class has the {2 + gap} windows a validation slice needs; supply "
                        "more windows, a --val file, or run with --no-select")
    return np.sort(np.concatenate(fit)), val_idx


def later_session(recs: data.Recordings, user: int, val_fraction: float | None) -> Split:
    mine = recs.subject == user
    first = np.flatnonzero(mine & (recs.sessions == 1))
    later = np.flatnonzero(mine & (recs.sessions > 1))
    if not len(later):
        raise DataError(f"user {user} has no later session to test on")
    x, y, _ = _windows_of(recs, first)
    xt, yt, gt = _windows_of(recs, later)
    if not val_fraction:
        return Split((x, y), None, (xt, yt), gt)
    fit, val = time_cut(y, val_fraction)
    return Split((x[fit], y[fit]), (x[val], y[val]), (xt, yt), gt)


def other_arm(recs: data.Recordings, user: int, val_fraction: float | None) -> Split:
    mine = recs.subject == user
    xt, yt, gt = _windows_of(recs, np.flatnonzero(mine & (recs.side == data.TEST_SIDE)))
    if not val_fraction:
        x, y = data.windows(recs, np.flatnonzero(mine & (recs.side == data.PERSONALISE_SIDE)))
        return Split((x, y), None, (xt, yt), gt)
    train, val = data.validation_split(recs, user, val_fraction)
    return Split(train, val, (xt, yt), gt)


WITHIN_SET_CUTS = (0.5, 0.75)  # train | validate | test, as shares of each recording


def within_set(recs: data.Recordings, user: int, val_fraction: float | None) -> Split:
    mine = np.flatnonzero((recs.subject == user) & (recs.side == data.PERSONALISE_SIDE))
    a, b = WITHIN_SET_CUTS

    def part(lo: float, hi: float) -> data.Recordings:
        return recs.subset(mine, [recs.x[r][int(len(recs.x[r]) * lo):int(len(recs.x[r]) * hi)]
                                  for r in mine])

    everything = np.arange(len(mine))
    xt, yt, gt = _windows_of(part(b, 1.0), everything)
    if not val_fraction:
        return Split(data.windows(part(0.0, b), everything), None, (xt, yt), mine[gt])
    return Split(data.windows(part(0.0, a), everything), data.windows(part(a, b), everything),
                 (xt, yt), mine[gt])


PROTOCOLS: dict[str, Callable[[data.Recordings, int, float | None], Split]] = {
    "later-session": later_session, "other-arm": other_arm, "within-set": within_set}

PROTOCOL_LABELS = {
    "later-session": "personalised on session 1, tested on the later session",
    "other-arm": "other arm (placement shift): personalised on the left arm, tested on the right",
    "within-set": "same arm, within one set (upper bound): the end of each recording tests",
}

DATASETS: dict[str, DataSet] = {d.name: d for d in [
    DataSet("watch", data.load_recordings, "other-arm", ("other-arm", "within-set"),
            "smartwatch IMU, 10 subjects, 7 shoulder exercises, one session (seglearn wheel)",
            data.imu_file),
    DataSet("hapt", hapt.load, "later-session", ("later-session",),
            "UCI HAPT, 30 subjects, 6 activities, two sessions, waist-worn phone",
            hapt.hapt_file),
]}


def get(name: str) -> DataSet:
    if name not in DATASETS:
        raise DataError(f"unknown data set {name!r}; choose one of {sorted(DATASETS)}")
    return DATASETS[name]


@functools.lru_cache(maxsize=None)
def recordings(name: str) -> data.Recordings:
    """The data set's recordings (read once per process; decoded once per machine:
    edgetrain/datacache.py)."""
    ds = get(name)
    return cached_recordings(ds.name, ds.source(), ds.load)


def protocol_of(name: str, protocol: str | None = None) -> str:
    """`protocol`, or data set `name`'s default, checked to apply to that data set."""
    ds = get(name)
    protocol = protocol or ds.protocol
    if protocol not in ds.protocols:
        raise DataError(f"protocol {protocol!r} does not apply to the {name} data; choose one "
                        f"of {list(ds.protocols)}")
    return protocol


def split_recordings(recs: data.Recordings, user: int, protocol: str,
                     val_fraction: float | None = None) -> Split:
    """Subject `user` of `recs` (a data set, or synthetic users made from one) under
    `protocol`."""
    subjects = sorted(set(int(s) for s in recs.subject))
    if user not in subjects:
        raise DataError(f"user {user} is not in the data set; choose one of "
                        f"{subjects[0]}..{subjects[-1]}")
    return PROTOCOLS[protocol](recs, user, val_fraction)


def user_split(name: str, user: int, val_fraction: float | None = None,
               protocol: str | None = None) -> Split:
    """One user's windows of data set `name` under `protocol` (default: the data set's)."""
    return split_recordings(recordings(name), user, protocol_of(name, protocol), val_fraction)


def population_windows(name: str, held_out: tuple[int, ...]) -> Arrays:
    """Windows (every session) of the subjects of `name` not in `held_out`."""
    recs = recordings(name)
    subjects = set(int(s) for s in recs.subject)
    missing = [u for u in held_out if u not in subjects]
    if missing:
        raise DataError(f"users {missing} are not in the {name} data set")
    return data.windows(recs, np.flatnonzero(~np.isin(recs.subject, held_out)))
