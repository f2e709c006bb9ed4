"""Issue 37, part 7: memory outside the cap stays within the documented bound over long runs
(docs/concepts.md, "What lives outside the cap"): more than 100 mask updates with on-device
selection, and a graph that computes a huge tensor from constants."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import ROOT, tiny_data
from test_bad_input import art, saved  # noqa: F401
from test_hostile import (OUTSIDE_BOUND_BYTES, RSS_CODE, SELECT_BYTES_PER_WINDOW,  # noqa: F401
                          sparse_artifact)
from test_hostile_graphs import constants_multiplied, edit

BUDGET = 4 << 20


def above_loaded(artifact, data, out, *extra) -> tuple[int, subprocess.CompletedProcess]:
    """Peak RSS of a `personalise` run above the process once ORT is loaded, and the run."""
    p = subprocess.run([sys.executable, "-c", RSS_CODE, "personalise", str(artifact), "--data",
                        str(data), "--budget", str(BUDGET), "--out", str(out), "--json",
                        *map(str, extra)], capture_output=True, text=True, cwd=ROOT,
                       timeout=900, env={**os.environ, "PYTHONPATH": str(ROOT)})
    rss = json.loads(p.stdout.strip().splitlines()[-1])
    return rss["peak"] - rss["base"], p


@pytest.mark.slow
def test_a_hundred_mask_updates_with_selection_stay_within_the_bound(sparse_artifact,  # noqa: F811
                                                                    tmp_path):
    windows = 400
    x, y = tiny_data(windows, seed=2)
    np.savez(tmp_path / "d.npz", x=x, y=y)
    extra, p = above_loaded(sparse_artifact, tmp_path / "d.npz", tmp_path / "run", "--epochs",
                            "2", "--mask-update", "rigl", "--mask-every", "1", "--mask-end",
                            "1.0", "--select")
    assert p.returncode == 0, p.stderr[-2000:]
    result = json.loads(p.stdout[:p.stdout.rindex("\n{")])
    assert result["mask_updates"] >= 100, result["mask_updates"]
    bound = BUDGET + OUTSIDE_BOUND_BYTES + SELECT_BYTES_PER_WINDOW * windows
    assert extra <= bound, (extra, bound)


def test_a_constant_computation_stays_within_the_bound(art, saved, tmp_path):  # noqa: F811
    edit(art, constants_multiplied)
    extra, p = above_loaded(art, saved["data"], tmp_path / "run", "--epochs", "1")
    assert "needs more memory than the budget" in p.stderr, p.stderr  # exit 3 (in-process)
    assert not (tmp_path / "run" / "checkpoint").exists()
    assert extra <= BUDGET + OUTSIDE_BOUND_BYTES, extra
