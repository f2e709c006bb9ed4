"""Where a user's samples come from (a subject of the built-in data set, or their own .npz),
and how they are cut: training windows, a validation slice for on-device selection, a test set.

The validation slice is cut in time, never at random: neighbouring windows of one recording
overlap (a 4 s window every 2 s) and are alike, so a random split would let validation see
what training saw. --user N: each recording of the personalisation arm is cut at 1 - fraction
of its length (edgetrain.data.validation_split). --data FILE: the windows are taken to be in
time order; the last `fraction` of each class's windows validate, and the window just before
each class's first validation window is dropped (it overlaps it).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from edgetrain import data
from edgetrain.manifest import load_manifest
from edgetrain.samples import Rows

Arrays = tuple[np.ndarray, np.ndarray]


@dataclass(frozen=True)
class UserData:
    train: Arrays
    val: Arrays | None  # the validation slice (None: no selection)
    test: Arrays | None  # read only for the final number


def user_data(artifact: str, user: int | None, data_file: str | None,
              test_file: str | None = None) -> tuple[Arrays, Arrays | None]:
    """(train, test) arrays for personalisation, checked against the artifact's input spec."""
    d = user_split(artifact, user, data_file, test_file)
    return d.train, d.test


def user_split(artifact: str, user: int | None, data_file: str | None,
               test_file: str | None = None, val_fraction: float | None = None,
               val_file: str | None = None) -> UserData:
    """The user's windows, checked against the artifact's input spec, with a validation slice
    when val_fraction (or val_file, for --data) is given.

    --user N: the subject's recordings on one arm personalise, the other arm's test
    (edgetrain/data.py); the artifact must not have seen that subject in pretraining.
    --data: x and y as the manifest's input spec says; --test FILE optional."""
    m = load_manifest(artifact, verify=False)  # the runtime verifies files when it opens
    shape, k = m.input.data_shape(), m.num_classes
    if user is not None:
        if m.input.preprocess not in ("imu_gasf", "imu_window"):
            raise data.DataError(f"--user needs an artifact built on the IMU data; "
                                 f"{artifact} takes {m.input.preprocess!r} input: use --data")
        seen = m.provenance.get("population_subjects", [])
        if user in seen:
            raise data.DataError(f"user {user} was in this artifact's pretraining population "
                                 f"{seen}; accuracy on them would be optimistic. Export with "
                                 f"--holdout-user {user}, or pick user "
                                 f"{m.provenance.get('holdout_user')}")
        return recordings_split(data.load_recordings(), user, shape, k, val_fraction)
    train = data.load_npz(data_file, shape, k)
    test = data.load_npz(test_file, shape, k) if test_file else None
    if val_file:
        return UserData(train, data.load_npz(val_file, shape, k), test)
    if not val_fraction:
        return UserData(train, None, test)
    fit, val = time_split(np.asarray(train[1][:]), val_fraction)
    return UserData((Rows(train[0], fit), Rows(train[1], fit)),
                    (Rows(train[0], val), Rows(train[1], val)), test)


def recordings_split(recs: data.Recordings, user: int, shape: tuple[int, ...], k: int,
                     val_fraction: float | None) -> UserData:
    """Subject `user` of `recs` cut by arm (one personalises, the other tests), the
    personalisation arm cut in time into training and validation when val_fraction is given;
    every part checked against the input spec (shape, k classes)."""
    split = data.leave_one_subject_out(recs, user)
    test = data.check_xy(*split.test, shape, k, where=f"user {user} test")
    if not val_fraction:
        return UserData(data.check_xy(*split.personalise, shape, k, where=f"user {user}"),
                        None, test)
    train, val = data.validation_split(recs, user, val_fraction)
    return UserData(data.check_xy(*train, shape, k, where=f"user {user}"),
                    data.check_xy(*val, shape, k, where=f"user {user} validation"), test)


def time_split(y: np.ndarray, fraction: float) -> tuple[np.ndarray, np.ndarray]:
    """(training, validation) indices of time-ordered windows: per class the last `fraction`
    validate, the one before them is dropped (it overlaps), the rest train."""
    if not 0 < fraction < 1:
        raise ValueError(f"the validation fraction must lie in (0, 1), got {fraction}")
    fit, val = [], []
    for c in np.unique(y):
        idx = np.flatnonzero(y == c)
        n_val = int(np.ceil(fraction * len(idx))) if len(idx) >= 3 else 0
        val.append(idx[len(idx) - n_val:] if n_val else idx[:0])
        fit.append(idx[:max(0, len(idx) - n_val - 1)] if n_val else idx)
    val_idx = np.sort(np.concatenate(val))
    if not len(val_idx):
        raise data.DataError(f"no class has the 3 windows a validation slice needs; supply "
                             "more windows, a --val file, or run with --no-select")
    return np.sort(np.concatenate(fit)), val_idx


def first_per_class(y: np.ndarray, n: int) -> np.ndarray:
    """Indices of each class's first n windows in time order (the few a user labels)."""
    if n < 1:
        raise ValueError(f"labels per class must be at least 1, got {n}")
    return np.sort(np.concatenate([np.flatnonzero(y == c)[:n] for c in np.unique(y)]))
