"""A step's update does not depend on how its windows are split into micro-batches while
BatchNorm is frozen (the device's default, --adapt none): the gradients of the same windows
are summed and scaled by 1/accumulation. The stack bench relies on it to run its accuracy
runs at 8 windows a micro-batch (bench/stack_config.merged_micro_batches)."""
from __future__ import annotations

import sys

import numpy as np

from conftest import (ROOT, TINY_CLASSES, TINY_SHAPE, checkpoint_weights, cli, tiny_data,
                      tiny_model)

sys.path.insert(0, str(ROOT / "bench"))


def test_one_step_split_three_ways_gives_the_same_weights(tmp_path):
    import torch

    from exporters.export import export_artifact

    art = tmp_path / "frozen"  # BatchNorm a fixed affine map, as the stack's artifacts have it
    export_artifact(tiny_model(), torch.zeros(2, *TINY_SHAPE), art, classes=TINY_CLASSES,
                    freeze_batchnorm=True, model_name="tiny")
    x, y = tiny_data(16, seed=5)
    np.savez(tmp_path / "d.npz", x=x, y=y)
    weights = {}
    for micro_batch, accumulate in ((8, 1), (1, 8), (4, 2)):
        out = tmp_path / f"run-{micro_batch}x{accumulate}"
        p = cli("personalise", art, "--data", tmp_path / "d.npz", "--budget", "64MiB",
                "--no-select", "--epochs", "1", "--lr", "0.05", "--micro-batch", micro_batch,
                "--accumulate", accumulate, "--out", out, "--json")
        assert p.returncode == 0, p.stderr
        weights[micro_batch] = checkpoint_weights(out / "checkpoint", trainable_only=True)
    start = checkpoint_weights(art / "checkpoint", trainable_only=True)
    for name, w in weights[8].items():
        assert not np.allclose(w, start[name], atol=1e-4), f"{name} did not train"
        for micro_batch in (1, 4):
            np.testing.assert_allclose(weights[micro_batch][name], w, atol=1e-5,
                                       err_msg=f"{name} at micro-batch {micro_batch}")


def test_the_stack_merges_only_micro_batches_under_eight_windows():
    from stack_config import STACK, merged_micro_batches

    merged = {c.name: merged_micro_batches(c) for c in STACK}
    assert merged == {"C1": None, "C2": None, "C3": None, "C4": (8, 4), "C5": (8, 4),
                      "C6": (8 * 49, 4), "C7": (8 * 49, 4), "C8": None}
    for c in STACK:  # every accuracy run still takes steps of the same 32 windows
        items, accumulation = merged_micro_batches(c) or (c.micro_batch, c.accumulation)
        assert items * accumulation == 32 * c.items_per_window


def test_the_accuracy_table_says_how_the_runs_split_their_steps():
    from stack_accuracy import split

    assert split([{"micro_batch": 8, "accumulation_steps": 4}] * 3) == "8 × 4"
    assert split([{"micro_batch": 1, "accumulation_steps": 32},
                  {"micro_batch": 8, "accumulation_steps": 4}]) == "1 × 32, 8 × 4"
    assert split([{"accuracy_after": 0.5}]) == "–"  # a run from before runs said
