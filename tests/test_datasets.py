"""The data sets and their protocols: HAPT read without running its pickle, session splits
that never leak, and test windows tagged with their recordings."""
from __future__ import annotations

import gzip
import io
import json
import os
import pickle

import numpy as np
import pytest

from conftest import cli
from edgetrain import data, datasets, hapt
from edgetrain.samples import DataError


class Boom:
    """A pickle that would run a command when loaded."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def gz(obj, protocol=2) -> bytes:
    return gzip.compress(pickle.dumps(obj, protocol=protocol))


@pytest.mark.parametrize("payload", [
    lambda m: Boom(m),                                   # os.system
    lambda m: {1: [Boom(m)]},                            # nested inside the expected dict
    lambda m: {1: [data.Recordings]},                    # any other class, even ours
    lambda m: {1: [np.ma.masked_array([1, 2])]},         # a numpy subclass
])
def test_restricted_unpickler_refuses_any_other_class(tmp_path, payload):
    marker = tmp_path / "ran"
    path = tmp_path / "HAPT.pkl.gz"
    path.write_bytes(gz(payload(marker)))
    with pytest.raises(DataError, match="not a HAPT pickle"):
        hapt.read_pickle(path)
    assert not marker.exists()


def test_restricted_unpickler_allows_only_latin1_bytes():
    """_codecs.encode spells bytes in protocol 2; another codec (zlib could inflate) is not."""
    import codecs

    class Zipped:
        def __reduce__(self):
            return codecs.encode, ("x" * 10, "zlib")

    with pytest.raises(pickle.UnpicklingError, match="refusing _codecs.encode"):
        hapt.RestrictedUnpickler(io.BytesIO(pickle.dumps(Zipped(), protocol=2))).load()
    assert hapt.RestrictedUnpickler(io.BytesIO(pickle.dumps(b"ab", protocol=2)),
                                    encoding="latin1").load() == b"ab"


def test_restricted_unpickler_builds_arrays_and_plain_data():
    blob = pickle.dumps({3: [{"x": np.arange(6.0).reshape(2, 3), "s": slice(0, 2, 1)}]},
                        protocol=2)
    out = hapt.RestrictedUnpickler(io.BytesIO(blob)).load()
    np.testing.assert_array_equal(out[3][0]["x"], np.arange(6.0).reshape(2, 3))
    assert out[3][0]["s"] == slice(0, 2, 1)


def test_hapt_loads_thirty_subjects_with_two_sessions():
    recs = datasets.recordings("hapt")
    assert sorted(set(recs.subject.tolist())) == list(range(1, 31))
    assert recs.classes == hapt.CLASSES and set(recs.y.tolist()) == set(range(6))
    for u in range(1, 31):
        mine = recs.subject == u
        assert set(recs.sessions[mine].tolist()) == {1, 2}
    assert all(x.shape[1] == 6 and x.dtype == np.float64 for x in recs.x)


def sessions_recordings() -> data.Recordings:
    """Two users, two sessions, 3 classes; every sample's value unique (sample id in ch 0)."""
    xs, ys, subj, sess = [], [], [], []
    start = 0
    for user in (1, 2):
        for session in (1, 2):
            for c in (0, 1, 2, 0, 1, 2):  # each class twice a session, in time order
                n = 650
                x = np.zeros((n, 6))
                x[:, 0] = np.arange(start, start + n)
                start += n
                xs.append(x), ys.append(c), subj.append(user), sess.append(session)
    return data.Recordings(xs, np.array(ys), np.array(subj), np.zeros(len(ys), np.int64),
                           ("a", "b", "c"), np.array(sess))


def test_session_split_never_puts_a_test_session_window_in_training_or_validation():
    recs = sessions_recordings()
    split = datasets.later_session(recs, 2, 0.25)
    ids = {k: set(v[0][:, :, 0].ravel().tolist()) for k, v in
           (("train", split.train), ("val", split.val), ("test", split.test))}
    later = set(np.concatenate([recs.x[r][:, 0] for r in
                                np.flatnonzero((recs.subject == 2) & (recs.sessions == 2))]))
    first = set(np.concatenate([recs.x[r][:, 0] for r in
                                np.flatnonzero((recs.subject == 2) & (recs.sessions == 1))]))
    assert ids["test"] <= later and ids["train"] <= first and ids["val"] <= first
    assert not ids["train"] & ids["val"]  # the gap: no sample in both
    assert not (ids["train"] | ids["val"]) & ids["test"]
    assert set(split.val[1].tolist()) == {0, 1, 2}  # every class validates
    # validation comes from the end of session 1: after every training window of its class
    for c in range(3):
        t = split.train[0][split.train[1] == c][:, 0, 0]
        v = split.val[0][split.val[1] == c][:, 0, 0]
        assert t.max() + data.WINDOW_SAMPLES <= v.min()
    # test windows carry their recording: all windows of one group from one recording
    for g in np.unique(split.test_groups):
        assert recs.sessions[g] == 2 and recs.subject[g] == 2
        w = split.test[0][split.test_groups == g][:, :, 0]
        assert set(w.ravel().tolist()) <= set(recs.x[g][:, 0].tolist())


def test_no_later_session_is_refused():
    recs = sessions_recordings()
    one = recs.subset(np.flatnonzero(recs.sessions == 1))
    with pytest.raises(DataError, match="no later session"):
        datasets.later_session(one, 1, 0.25)


def test_watch_protocols_keep_their_splits():
    within = datasets.user_split("watch", 3, 0.25, "within-set")
    arm = datasets.user_split("watch", 3, 0.25)
    recs = datasets.recordings("watch")
    assert set(recs.side[np.unique(arm.test_groups)].tolist()) == {data.TEST_SIDE}
    assert set(recs.side[np.unique(within.test_groups)].tolist()) == {data.PERSONALISE_SIDE}
    with pytest.raises(DataError, match="does not apply"):
        datasets.user_split("watch", 3, 0.25, "later-session")
    with pytest.raises(DataError, match="user 31 is not in the data set"):
        datasets.user_split("hapt", 31)


@pytest.mark.slow
def test_hapt_artifact_personalises_a_held_out_user_across_sessions(tmp_path):
    art = tmp_path / "h"
    r = cli("export", "--model", "imu_cnn", "--dataset", "hapt", "--epochs", "0", "--no-cache",
            "--holdout-user", "4", "--out", art, "--json")
    assert r.returncode == 0, r.stderr
    prov = json.loads(r.stdout)["provenance"]
    assert prov["dataset"] == "hapt" and 4 not in prov["population_subjects"]
    r = cli("personalise", art, "--user", "4", "--dataset", "watch", "--budget", "8MiB",
            "--out", tmp_path / "w")
    assert r.returncode == 2 and "pretrained on the hapt data" in r.stderr
    r = cli("personalise", art, "--user", "4", "--device", "watchos-extension", "--epochs",
            "1", "--lr-grid", "3e-4", "--adapt", "bn", "--out", tmp_path / "u4")
    assert r.returncode == 0, r.stderr
    assert "protocol: personalised on session 1, tested on the later session" in r.stdout
    assert "test recordings" in r.stdout
    res = json.loads((tmp_path / "u4" / "result.json").read_text())
    split = datasets.user_split("hapt", 4)
    assert res["test_recordings"] == split.test_groups.tolist()


def test_a_test_file_names_its_recordings_or_blocks_stand_in(tmp_path):
    from edgetrain.userdata import TEST_BLOCK_WINDOWS, test_groups

    x = np.zeros((12, 4), np.float32)
    np.savez(tmp_path / "g.npz", x=x, y=np.zeros(12, np.int64), groups=np.repeat([7, 8], 6))
    np.savez(tmp_path / "n.npz", x=x, y=np.zeros(12, np.int64))
    np.savez(tmp_path / "bad.npz", x=x, y=np.zeros(12, np.int64), groups=np.zeros(5))
    groups, unit = test_groups(str(tmp_path / "g.npz"), 12)
    assert groups.tolist() == [7] * 6 + [8] * 6 and unit == "recordings"
    groups, unit = test_groups(str(tmp_path / "n.npz"), 12)
    assert groups.tolist() == (np.arange(12) // TEST_BLOCK_WINDOWS).tolist()
    assert unit == f"blocks of {TEST_BLOCK_WINDOWS} windows"
    with pytest.raises(DataError, match="groups.* has dtype float64, expected integers"):
        test_groups(str(tmp_path / "bad.npz"), 12)
    np.savez(tmp_path / "short.npz", x=x, y=np.zeros(12, np.int64), groups=np.zeros(5, int))
    with pytest.raises(DataError, match="one integer recording id per test window"):
        test_groups(str(tmp_path / "short.npz"), 12)
