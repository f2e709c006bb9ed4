"""The recipe variants bench/personalise.py copies label-free rows for
(LABEL_FREE_AS_DEFAULT) do nothing to a label-free run: the CLI with each variant's
arguments writes the default's checkpoint byte for byte and the same test result."""
from __future__ import annotations

import json
import sys

import numpy as np
from conftest import ROOT, cli, tiny_data

sys.path.insert(0, str(ROOT / "bench"))
from personalise import (LABEL_FREE_AS_DEFAULT, MODES, RECIPES,  # noqa: E402
                         default_label_free)

SAME = ("accuracy_before", "accuracy_after", "test_correct_before", "test_correct_after",
        "optimizer_steps")


def label_free(art, data, out, recipe):
    p = cli("personalise", art, "--data", data, "--test", data, "--budget", "64MiB",
            "--out", out, "--json", *MODES["label-free"], *RECIPES[recipe])
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    return {k: r.get(k) for k in SAME}, (out / "checkpoint").read_bytes()


def test_each_copied_recipe_runs_label_free_as_the_default(tiny_artifact, tmp_path):
    x, y = tiny_data(24, seed=4)
    np.savez(tmp_path / "d.npz", x=x, y=y)
    default = label_free(tiny_artifact, tmp_path / "d.npz", tmp_path / "default", "default")
    assert default[0]["accuracy_before"] is not None
    for recipe in LABEL_FREE_AS_DEFAULT:
        assert label_free(tiny_artifact, tmp_path / "d.npz", tmp_path / recipe, recipe) \
            == default, recipe


def test_copied_rows_are_the_default_rows_of_the_same_commit_marked(tmp_path):
    rows = [{"user": u, "mode": m, "commit": c, "recipe": "default", "accuracy_after": a}
            for u, m, c, a in ((1, "label-free", "abc", 0.5), (2, "label-free", "abc", 0.6),
                               (3, "label-free", "old", 0.7), (1, "all labels", "abc", 0.9))]
    default = tmp_path / "personalise-hapt-later-session-t.jsonl"
    default.write_text("".join(json.dumps(r) + "\n" for r in rows))
    mine = [{"user": 2, "mode": "label-free", "commit": "abc", "recipe": "mix-0.5"}]
    got = default_label_free(default, mine, "mix-0.5", "abc")
    assert got == [{**rows[0], "recipe": "mix-0.5", "label_free_of": "default"}]
    assert default_label_free(tmp_path / "missing.jsonl", [], "mix-0.5", "abc") == []
