"""Weight interpolation on the device (--mix, edgetrain/interpolation.py): the weights the run
keeps are the stated mix of the start and the best trained weights, read from their files."""
from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import checkpoint_weights, cli, tiny_data


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("mixdata")
    x, y = tiny_data(96, seed=1)
    np.savez(d / "train.npz", x=x, y=y)
    xt, yt = tiny_data(60, seed=2)
    np.savez(d / "test.npz", x=xt, y=yt)
    return d


def trained_weights(path) -> dict:
    return checkpoint_weights(path, trainable_only=True)


def test_a_fixed_mix_keeps_the_weights_halfway_from_the_start_to_the_best(tiny_artifact, files,
                                                                           tmp_path):
    run = tmp_path / "run"
    p = cli("personalise", tiny_artifact, "--data", files / "train.npz", "--test",
            files / "test.npz", "--budget", "4MiB", "--epochs", "3", "--lr-grid", "0.05",
            "--mix", "0.5", "--out", run, "--json")
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    assert r["guard"]["kept_population"] is False and r["guard"]["best_mix"] == 0.5
    assert "mixed 0.5 of the way from the start" in r["guard"]["message"]
    assert [t["mix"] for t in r["mixes"]] == [0.5]
    assert r["guard"]["best"]["loss"] == r["mixes"][0]["loss"]  # the guard judged the mix
    start, kept = trained_weights(run / "select" / "start"), trained_weights(run / "checkpoint")
    matches = []
    for path in sorted((run / "select").glob("best-*")):  # bests the resume points still name
        best = trained_weights(path)
        assert start.keys() == kept.keys() == best.keys() and start != best
        matches.append(all(np.allclose(kept[k], np.float32(0.5) * np.float32(best[k])
                                       + np.float32(0.5) * np.float32(start[k]), rtol=0,
                                       atol=1e-6) for k in kept))
    assert matches.count(True) == 1  # halfway between the start and the best it trained


def test_several_mixes_are_scored_on_validation_and_the_best_is_kept(tiny_artifact, files,
                                                                     tmp_path):
    p = cli("personalise", tiny_artifact, "--data", files / "train.npz", "--budget", "4MiB",
            "--epochs", "3", "--lr-grid", "0.05", "--mix", "default", "--out", tmp_path / "r",
            "--json")
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    tried = r["mixes"]
    assert [t["mix"] for t in tried] == [0.25, 0.5, 0.75, 1.0]
    lowest = min(tried, key=lambda t: (t["loss"], -t["correct"]))
    assert r["guard"]["best"]["loss"] == lowest["loss"]
    assert r["guard"]["best_mix"] == (None if lowest["mix"] == 1.0 else lowest["mix"])


@pytest.mark.parametrize("value", ["1.5", "0", "abc", "nan"])
def test_a_mix_outside_0_to_1_is_refused_before_anything_runs(tiny_artifact, files, tmp_path,
                                                              value):
    p = cli("personalise", tiny_artifact, "--data", files / "train.npz", "--budget", "4MiB",
            "--mix", value, "--out", tmp_path / "r")
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert "--mix" in p.stderr and "0.25,0.5,0.75" in p.stderr
    assert not (tmp_path / "r").exists()
