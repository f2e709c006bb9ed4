"""Issue 18: on-device selection (validation slice, early stopping, keep-best), the
do-no-harm guard, label-free adaptation and few labels, inside the memory cap."""
from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import checkpoint_weights, cli, tiny_data
from edgetrain import data
from edgetrain.selection import Score, check_settings, decide, record_epoch, stopped
from edgetrain.datasets import time_cut as time_split
from edgetrain.userdata import first_per_class


def test_early_stopping_and_keep_best_pick_the_known_best_epoch():
    """Validation losses with their minimum at epoch 2: the best is epoch 2, the candidate
    stops after `patience` epochs without a better one, and later ties do not displace it."""
    sel = {"best": Score(5, 10, 0.9).to_dict(), "since_best": 0, "history": []}
    losses = [0.6, 0.4, 0.5, 0.4, 0.3]
    seen = []
    for epoch, loss in enumerate(losses, 1):
        if stopped(sel, patience=2):
            break
        seen.append(epoch)
        record_epoch(sel, Score(8, 10, loss), 1e-3, epoch)
    assert seen == [1, 2, 3, 4]  # epoch 5 never ran: 3 and 4 did not beat epoch 2
    assert (sel["best_epoch"], sel["best"]["loss"]) == (2, 0.4)


def test_the_guard_needs_a_margin_over_the_population_model():
    pop = Score(18, 23, 0.50)
    assert decide(pop, Score(18, 23, 0.30), 1e-3, 2, 1).kept_population  # a lower loss alone
    assert decide(pop, Score(19, 23, 0.60), 1e-3, 2, 1).kept_population is False
    assert decide(pop, Score(20, 23, 0.30), 1e-3, 3, 3).kept_population  # margin 3 windows
    d = decide(pop, Score(17, 23, 0.2), None, 0, 1)
    assert d.kept_population and "kept the population model" in d.message


def test_the_adapted_start_is_kept_when_training_does_not_pass_the_guard():
    pop = Score(18, 23, 0.50)
    # a trained candidate that ties the population model fails the margin; the adapted start,
    # which loses no window, is kept instead of the population model
    d = decide(pop, Score(18, 23, 0.30), 1e-3, 2, 1, adapted=Score(18, 23, 0.45))
    assert not d.kept_population and d.statistics_only and d.best_epoch == 0
    assert "no weight trained" in d.message
    # the adapted start that loses a window is refused: the population model stays
    assert decide(pop, Score(18, 23, 0.3), 1e-3, 2, 1, adapted=Score(17, 23, 0.4)).kept_population
    # the adapted start that raises the validation loss is refused too, windows tied
    d = decide(pop, Score(18, 23, 0.3), 1e-3, 2, 1, adapted=Score(18, 23, 0.55))
    assert d.kept_population and "raise the loss" in d.message
    # ... unless the rule asks only for the windows (--adapt-guard windows)
    d = decide(pop, Score(18, 23, 0.3), 1e-3, 2, 1, Score(18, 23, 0.55), "windows")
    assert d.statistics_only and not d.kept_population
    d = decide(pop, Score(18, 23, 0.3), 1e-3, 2, 1, Score(17, 23, 0.2), "windows")
    assert d.kept_population and d.message.endswith("which may not lose a window)")
    with pytest.raises(ValueError, match="adapted start"):
        check_settings(None, 2, 1, "sometimes")
    # a trained candidate that passes wins over the adapted start
    d = decide(pop, Score(20, 23, 0.30), 1e-3, 2, 1, adapted=Score(19, 23, 0.4))
    assert not d.kept_population and not d.statistics_only and d.best_epoch == 2


def test_a_time_split_validation_slice_never_overlaps_training_windows():
    y = np.array([0] * 8 + [1] * 12 + [2] * 2 + [0] * 4)  # windows in time order
    fit, val = time_split(y, 0.25)
    assert not set(fit) & set(val)
    for c in np.unique(y):
        idx = np.flatnonzero(y == c)
        v = [i for i in idx if i in set(val)]
        f = [i for i in idx if i in set(fit)]
        if v:  # each class's slice is its last windows; the one before them is dropped
            assert max(f, default=-1) < min(v) and list(idx).index(min(v)) - len(f) == 1
    assert set(np.flatnonzero(y == 2)) <= set(fit)  # too few windows of class 2 to validate


def test_the_built_in_validation_slice_shares_no_sample_with_training():
    recs = data.load_recordings()
    for user in (3, 10):
        (xt, _), (xv, _) = data.validation_split(recs, user, 0.25)
        train_rows = {r.tobytes() for w in xt for r in w}
        assert not any(r.tobytes() in train_rows for w in xv for r in w)


def test_first_per_class_takes_each_class_earliest_windows():
    y = np.array([2, 0, 0, 1, 2, 0, 1])
    assert list(first_per_class(y, 2)) == [0, 1, 2, 3, 4, 6]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("sel")
    x, y = tiny_data(64, seed=1)
    order = np.argsort(np.random.default_rng(0).random(64))
    np.savez(d / "train.npz", x=x, y=y)
    np.savez(d / "shuffled.npz", x=x, y=y[order])  # labels that teach the wrong thing
    xv, yv = tiny_data(30, seed=4)
    np.savez(d / "val.npz", x=xv, y=yv)
    xt, yt = tiny_data(60, seed=2)
    np.savez(d / "test.npz", x=xt, y=yt)
    return d


@pytest.fixture(scope="module")
def trained_artifact(tmp_path_factory):
    """The tiny network trained on its toy task first: a population model worth keeping."""
    import torch

    from conftest import TINY_CLASSES, TINY_SHAPE, tiny_model
    from edgetrain.manifest import Plan
    from exporters.export import export_artifact

    model = tiny_model(0)
    x, y = tiny_data(256, seed=7)
    opt = torch.optim.Adam(model.parameters(), lr=0.05)
    for i in range(150):
        b = slice((i * 32) % 256, (i * 32) % 256 + 32)
        loss = torch.nn.functional.cross_entropy(model(torch.from_numpy(x[b])),
                                                 torch.from_numpy(y[b]))
        opt.zero_grad()
        loss.backward()
        opt.step()
    out = tmp_path_factory.mktemp("trained") / "art"
    export_artifact(model.eval(), torch.zeros(2, *TINY_SHAPE), out, classes=TINY_CLASSES,
                    plan=Plan(micro_batch=4), lr=1e-2, model_name="tiny-trained",
                    freeze_batchnorm=True)
    return out


def test_the_guard_keeps_the_population_model_when_training_hurts(trained_artifact, files,
                                                                  tmp_path):
    tiny_artifact = trained_artifact
    p = cli("personalise", tiny_artifact, "--data", files / "shuffled.npz", "--val",
            files / "val.npz", "--test", files / "test.npz", "--budget", "4MiB", "--epochs",
            "4", "--lr-grid", "0.05,0.2", "--adapt", "none", "--out", tmp_path / "run", "--json")
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    assert r["guard"]["kept_population"] is True
    assert "kept the population model" in r["guard"]["message"]
    assert r["accuracy_after"] == r["accuracy_before"]
    assert r["optimizer_steps"] > 0  # it did train, and threw that away
    mine = checkpoint_weights(tmp_path / "run" / "checkpoint")
    theirs = checkpoint_weights(tiny_artifact / "checkpoint")
    assert mine == theirs  # byte for byte the population model's weights
    saved = json.loads((tmp_path / "run" / "result.json").read_text())
    assert saved["guard"]["population"] == r["guard"]["population"]


def test_selection_personalises_when_it_helps_and_reports_its_time(tiny_artifact, files,
                                                                  tmp_path):
    p = cli("personalise", tiny_artifact, "--data", files / "train.npz", "--test",
            files / "test.npz", "--budget", "4MiB", "--epochs", "4", "--lr", "0.05",
            "--out", tmp_path / "run", "--json")
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    assert r["guard"]["kept_population"] is False and r["accuracy_after"] > r["accuracy_before"]
    assert r["learning_rates"] == [0.0167, 0.05, 0.15] and r["validation_windows"] > 0
    assert r["select_time_s"] >= 0 and len(r["history"]) >= 2
    assert len(r["test_correct_before"]) == len(r["test_correct_after"]) == 60


@pytest.mark.parametrize("mode", [[], ["--adapt", "bn"]], ids=["select", "select+adapt"])
def test_selection_runs_inside_the_cap_and_fails_below_it_before_any_step(tiny_artifact, files,
                                                                          tmp_path, mode):
    m = cli("measure", tiny_artifact, "--batch", "4", "--json", *mode)
    assert m.returncode == 0, m.stderr
    peak = json.loads(m.stdout)["peak_bytes"]
    args = ["personalise", tiny_artifact, "--data", files / "train.npz", "--micro-batch", "4",
            "--epochs", "2", "--json", *mode]
    ok = cli(*args, "--budget", peak, "--out", tmp_path / "ok")
    assert ok.returncode == 0, ok.stderr
    for below in (1, 64 * 1024):
        bad = cli(*args, "--budget", max(1, peak - below), "--out", tmp_path / f"b{below}")
        assert bad.returncode == 3 and "Traceback" not in bad.stderr, bad.stderr
        assert not (tmp_path / f"b{below}").exists()  # nothing written: before any step


def test_label_free_adaptation_and_few_labels(tiny_artifact, files, tmp_path):
    p = cli("personalise", tiny_artifact, "--data", files / "train.npz", "--test",
            files / "test.npz", "--budget", "4MiB", "--labels-per-class", "0", "--adapt", "bn",
            "--out", tmp_path / "free", "--json")
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    assert (r["optimizer_steps"], r["guard"], r["adapt"]) == (0, None, "bn")
    p = cli("personalise", tiny_artifact, "--data", files / "train.npz", "--budget", "4MiB",
            "--labels-per-class", "2", "--micro-batch", "2", "--epochs", "1", "--no-select",
            "--out", tmp_path / "few", "--json")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["train_items"] == 2 * 3  # 2 windows of each of 3 classes
    p = cli("personalise", tiny_artifact, "--data", files / "train.npz", "--budget", "4MiB",
            "--labels-per-class", "0", "--adapt", "auto", "--out", tmp_path / "auto", "--json")
    assert p.returncode == 0, p.stderr  # --adapt auto: this artifact has BatchNorm layers
    assert json.loads(p.stdout)["adapt"] == "bn"
    p = cli("personalise", tiny_artifact, "--data", files / "train.npz", "--budget", "4MiB",
            "--labels-per-class", "0", "--out", tmp_path / "none")
    assert p.returncode == 2 and "--adapt bn" in p.stderr
