"""The artifact contract: round trip, and a path outside the folder refused. (Missing, malformed,
foreign, truncated and tampered artifacts are refused through the CLI in test_bad_input.py.)"""
from __future__ import annotations

import json
import shutil

import pytest

from edgetrain.manifest import SCHEMA_VERSION, ArtifactError, Manifest, load_manifest


@pytest.fixture
def art(tiny_artifact, tmp_path):
    dst = tmp_path / "a"
    shutil.copytree(tiny_artifact, dst)
    return dst


def test_round_trip_is_exact(art):
    m = load_manifest(art)
    assert Manifest.from_dict(json.loads(json.dumps(m.to_dict()))) == m
    assert m.schema_version == SCHEMA_VERSION
    assert m.input.sample_shape == (3, 8, 8)
    assert {t.name for t in m.trainable} == {"conv.weight", "bn.weight", "bn.bias",
                                             "head.weight", "head.bias"}
    assert {t.name for t in m.frozen} == {"bn.running_mean", "bn.running_var"}
    for entry in m.files.values():
        assert (art / entry.path).stat().st_size == entry.size_bytes


def test_file_outside_folder_refused(art):
    d = json.loads((art / "manifest.json").read_text())
    d["files"]["checkpoint"]["path"] = "../checkpoint"
    (art / "manifest.json").write_text(json.dumps(d))
    with pytest.raises(ArtifactError, match="not a plain file name"):
        load_manifest(art)


def test_plan_threads_default_for_older_artifacts_and_are_checked(art):
    d = json.loads((art / "manifest.json").read_text())
    del d["plan"]["threads"]  # an artifact from before the field: the default thread count
    assert Manifest.from_dict(d).plan.threads == 2
    d["plan"]["threads"] = 0
    with pytest.raises(ArtifactError, match="plan.threads is 0"):
        Manifest.from_dict(d)


def test_a_manifest_round_trips_in_memory_and_through_json(tiny_artifact):
    """Issue 39 (point 5): from_dict(to_dict()) is the manifest, and so is the JSON round
    trip (to_dict gave tuples, which from_dict refused as not lists)."""
    import json

    from edgetrain.manifest import Manifest, load_manifest

    m = load_manifest(tiny_artifact)
    assert Manifest.from_dict(m.to_dict()) == m
    assert Manifest.from_dict(json.loads(json.dumps(m.to_dict()))) == m
