"""export_artifact refuses bad arguments before any work, saying what was given and what to
pass; nothing is written."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from edgetrain.manifest import Plan
from exporters.export import export_artifact


def model() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Conv1d(6, 4, 3), torch.nn.Flatten(),
                               torch.nn.Linear(4 * 14, 3))


@pytest.mark.parametrize("change, words", [
    ({"example_input": np.zeros((2, 6, 16), np.float32)}, "pass a torch tensor"),
    ({"example_input": torch.zeros(2, 6, 16, dtype=torch.float64)}, "pass float32"),
    ({"classes": "abc"}, "pass a list of class names"),
    ({"classes": ["a", "a", "b"]}, "given more than once"),
    ({"lr": -1.0}, "lr is -1.0"),
    ({"lr": float("nan")}, "lr is nan"),
    ({"layout": "ZT"}, "letters C, H, W, T, F"),
    ({"layout": "CHW"}, "names 3 axes"),
])
def test_bad_arguments_are_refused_before_any_work(tmp_path, change, words):
    args = {"example_input": torch.zeros(2, 6, 16), "classes": ["a", "b", "c"], "lr": 1e-3,
            "layout": "CT"}
    args.update(change)
    with pytest.raises((TypeError, ValueError), match=words):
        export_artifact(model(), args.pop("example_input"), tmp_path / "art", **args)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("field", ["micro_batch", "accumulation_steps", "threads"])
def test_a_plan_needs_whole_positive_counts(field):
    with pytest.raises(ValueError, match=f"plan.{field} is 0"):
        Plan(**{field: 0})


def test_an_out_path_that_is_a_file_is_refused_and_kept(tmp_path):
    out = tmp_path / "file"
    out.write_text("mine")
    with pytest.raises(ValueError, match="exists and is a file"):
        export_artifact(model(), torch.zeros(2, 6, 16), out, classes=["a", "b", "c"])
    assert out.read_text() == "mine" and sorted(tmp_path.iterdir()) == [out]


def snapshot(folder) -> dict:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_an_export_replaces_only_a_folder_it_wrote(tmp_path):
    """--out that holds an unrelated manifest.json, or an artifact plus a file of the user's,
    is refused with nothing deleted; an artifact folder as exported is replaced."""
    args = dict(classes=["a", "b", "c"], lr=1e-3, layout="CT", plan=Plan(micro_batch=2))
    app = tmp_path / "app"
    app.mkdir()
    (app / "manifest.json").write_text('{"name": "app"}')
    (app / "notes.txt").write_text("mine")
    before = snapshot(app)
    with pytest.raises(ValueError, match="is not an edgetrain artifact"):
        export_artifact(model(), torch.zeros(2, 6, 16), app, **args)
    assert snapshot(app) == before
    art = tmp_path / "art"
    export_artifact(model(), torch.zeros(2, 6, 16), art, **args)
    (art / "thesis.tex").write_text("mine")
    before = snapshot(art)
    with pytest.raises(ValueError, match="thesis.tex"):
        export_artifact(model(), torch.zeros(2, 6, 16), art, **args)
    assert snapshot(art) == before
    (art / "thesis.tex").unlink()
    export_artifact(model(), torch.zeros(2, 6, 16), art, **args)  # ours: replaced
    assert sorted(p.name for p in tmp_path.iterdir()) == ["app", "art"]


def test_an_export_sweeps_what_a_killed_export_left_and_spares_a_live_ones(tmp_path):
    """A killed export leaves its work folder (`.<out>.tmp-<pid>-…`) or the artifact it was
    replacing (`.<out>.old-<pid>`); the next export to the same --out removes those whose
    process is gone, and never a running export's."""
    import os

    from exporters.export.arguments import sweep_exports, work_folder

    out = tmp_path / "art"
    dead = [tmp_path / ".art.tmp-999999999-x1", tmp_path / ".art.old-999999999"]
    live = tmp_path / f".art.tmp-{os.getpid()}-y2"
    other = tmp_path / ".other.tmp-999999999-z3"
    for d in (*dead, live, other):
        d.mkdir()
        (d / "training_model.onnx").write_bytes(b"x")
    work = work_folder(out)
    assert work.name.startswith(f".art.tmp-{os.getpid()}-") and work.is_dir()
    assert not any(d.exists() for d in dead)
    assert live.exists() and other.exists()
    assert sweep_exports(out) == []
