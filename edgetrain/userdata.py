"""Where a user's samples come from (a subject of the built-in data set, or their own .npz),
and how they are cut: training windows, a validation slice for on-device selection, a test set.

The validation slice is cut in time, never at random: neighbouring windows of one recording
overlap (a 4 s window every 2 s) and are alike, so a random split would let validation see
what training saw. --user N: the data set's protocol splits the subject (edgetrain/datasets.py:
HAPT personalises on session 1 and tests on the later session). --data FILE: the windows are
taken to be in time order; the last `fraction` of each class's windows validate, and the
window just before each class's first validation window is dropped (it overlaps it). The test
windows' recordings (--user), or a `groups` array in the --test file, let intervals resample
recordings rather than overlapping windows; without one, contiguous blocks of
TEST_BLOCK_WINDOWS test windows stand in for recordings.
"""
from __future__ import annotations

import zipfile
from dataclasses import dataclass

import numpy as np

from edgetrain import data, datasets
from edgetrain.manifest import load_manifest
from edgetrain.samples import Rows, read_npz

Arrays = tuple[np.ndarray, np.ndarray]


@dataclass(frozen=True)
class UserData:
    train: Arrays
    val: Arrays | None  # the validation slice (None: no selection)
    test: Arrays | None  # read only for the final number
    test_groups: np.ndarray | None = None  # the recording (or block) of each test window
    protocol: str | None = None  # how the windows were split (edgetrain.datasets.PROTOCOLS)
    test_unit: str = "recordings"  # what test_groups holds: recordings, or blocks of windows


TEST_BLOCK_WINDOWS = 5  # --test without `groups`: blocks of this many windows in time order


def user_data(artifact: str, user: int | None, data_file: str | None,
              test_file: str | None = None, dataset: str | None = None,
              protocol: str | None = None) -> tuple[Arrays, Arrays | None]:
    """(train, test) arrays for personalisation, checked against the artifact's input spec."""
    d = user_split(artifact, user, data_file, test_file, dataset=dataset, protocol=protocol)
    return d.train, d.test


def user_split(artifact: str, user: int | None, data_file: str | None,
               test_file: str | None = None, val_fraction: float | None = None,
               val_file: str | None = None, dataset: str | None = None,
               protocol: str | None = None) -> UserData:
    """The user's windows, checked against the artifact's input spec, with a validation slice
    when val_fraction (or val_file, for --data) is given.

    --user N: subject N of `dataset` (default: the one the artifact pretrained on) split by
    `protocol` (default: the data set's; edgetrain/datasets.py); the artifact must not have
    seen that subject in pretraining. --data: x and y as the manifest's input spec says;
    --test FILE optional."""
    m = load_manifest(artifact, verify=False)  # the runtime verifies files when it opens
    shape, k = m.input.data_shape(), m.num_classes
    if user is not None:
        return subject_split(m, artifact, user, dataset, protocol, val_fraction)
    train = data.load_npz(data_file, shape, k)
    test = data.load_npz(test_file, shape, k) if test_file else None
    groups, unit = test_groups(test_file, len(test[1])) if test is not None else (None, "")
    if val_file:
        return UserData(train, data.load_npz(val_file, shape, k), test, groups, test_unit=unit)
    if not val_fraction:
        return UserData(train, None, test, groups, test_unit=unit)
    fit, val = datasets.time_cut(np.asarray(train[1][:]), val_fraction)
    return UserData((Rows(train[0], fit), Rows(train[1], fit)),
                    (Rows(train[0], val), Rows(train[1], val)), test, groups, test_unit=unit)


def subject_split(m, artifact: str, user: int, dataset: str | None, protocol: str | None,
                  val_fraction: float | None) -> UserData:
    """Subject `user` of a built-in data set under a protocol, every part checked against the
    manifest `m` (input spec, classes); refused when the artifact pretrained on the user or on
    another data set."""
    if m.input.preprocess not in ("imu_gasf", "imu_window"):
        raise data.DataError(f"--user needs an artifact built on the IMU data; "
                             f"{artifact} takes {m.input.preprocess!r} input: use --data")
    built_on = m.provenance.get("dataset", "watch")
    dataset = dataset or built_on
    if dataset != built_on:
        raise data.DataError(f"{artifact} was pretrained on the {built_on} data, not "
                             f"{dataset}: its classes and input statistics are {built_on}'s. "
                             f"Export with --dataset {dataset}, or drop --dataset")
    seen = m.provenance.get("population_subjects", [])
    if user in seen:
        free = sorted(set(int(u) for u in datasets.recordings(dataset).subject) - set(seen))
        raise data.DataError(f"user {user} was in this artifact's pretraining population; "
                             f"accuracy on them would be optimistic. Export with "
                             f"--holdout-user {user}, or pick one of its held-out users {free}")
    return recordings_split(datasets.recordings(dataset), user,
                            datasets.protocol_of(dataset, protocol), m.input.data_shape(),
                            m.num_classes, val_fraction)


def recordings_split(recs: data.Recordings, user: int, protocol: str, shape: tuple[int, ...],
                     k: int, val_fraction: float | None) -> UserData:
    """Subject `user` of `recs` split by `protocol` (edgetrain.datasets.PROTOCOLS), every part
    checked against the input spec (shape, k classes)."""
    split = datasets.split_recordings(recs, user, protocol, val_fraction)
    train = data.check_xy(*split.train, shape, k, where=f"user {user}")
    val = (data.check_xy(*split.val, shape, k, where=f"user {user} validation")
           if split.val is not None else None)
    test = data.check_xy(*split.test, shape, k, where=f"user {user} test")
    return UserData(train, val, test, split.test_groups, protocol)


def test_groups(test_file: str, n: int) -> tuple[np.ndarray, str]:
    """The recording of each window of a --test file: its `groups` array if it has one (one
    integer per window), else blocks of TEST_BLOCK_WINDOWS windows in time order."""
    with zipfile.ZipFile(test_file) as z:  # load_npz has checked it is a sound archive
        has_groups = "groups.npy" in z.namelist()
    if not has_groups:
        return (np.arange(n, dtype=np.int64) // TEST_BLOCK_WINDOWS,
                f"blocks of {TEST_BLOCK_WINDOWS} windows")
    (g,) = read_npz(test_file, names=("groups",))
    if tuple(g.shape) != (n,) or not np.issubdtype(g.dtype, np.integer):
        raise data.DataError(f"{test_file}: groups has shape {tuple(g.shape)} and dtype "
                             f"{g.dtype}; it must hold one integer recording id per test "
                             f"window ({n})")
    return np.asarray(g[:], np.int64), "recordings"


def first_per_class(y: np.ndarray, n: int) -> np.ndarray:
    """Indices of each class's first n windows in time order (the few a user labels)."""
    if n < 1:
        raise ValueError(f"labels per class must be at least 1, got {n}")
    return np.sort(np.concatenate([np.flatnonzero(y == c)[:n] for c in np.unique(y)]))
