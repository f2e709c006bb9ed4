"""Where a user's samples come from: a subject of the built-in data set, or their own .npz."""
from __future__ import annotations

import numpy as np

from edgetrain import data
from edgetrain.manifest import load_manifest

Arrays = tuple[np.ndarray, np.ndarray]


def user_data(artifact: str, user: int | None, data_file: str | None,
              test_file: str | None = None) -> tuple[Arrays, Arrays | None]:
    """(train, test) arrays for personalisation, checked against the artifact's input spec.

    --user N: the subject's recordings on one arm personalise, the other arm's test
    (edgetrain/data.py); the artifact must not have seen that subject in pretraining.
    --data FILE: x and y as the manifest's input spec says; --test FILE optional.
    """
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
        split = data.leave_one_subject_out(data.load_recordings(), user)
        train = data.check_xy(*split.personalise, shape, k, where=f"user {user}")
        test = data.check_xy(*split.test, shape, k, where=f"user {user} test")
        return train, test
    train = data.load_npz(data_file, shape, k)
    test = data.load_npz(test_file, shape, k) if test_file else None
    return train, test
