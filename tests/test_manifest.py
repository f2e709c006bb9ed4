"""The artifact contract: round trip, verification, refusal of tampered or foreign artifacts."""
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


def test_missing_manifest(art):
    (art / "manifest.json").unlink()
    with pytest.raises(ArtifactError, match="not an edgetrain artifact"):
        load_manifest(art)


def test_malformed_manifest(art):
    (art / "manifest.json").write_text("{not json")
    with pytest.raises(ArtifactError, match="not valid JSON"):
        load_manifest(art)


def test_other_schema_version(art):
    d = json.loads((art / "manifest.json").read_text())
    d["schema_version"] = SCHEMA_VERSION + 1
    (art / "manifest.json").write_text(json.dumps(d))
    with pytest.raises(ArtifactError, match="re-export"):
        load_manifest(art)


def test_truncated_file(art):
    p = art / "checkpoint"
    p.write_bytes(p.read_bytes()[:-10])
    with pytest.raises(ArtifactError, match="truncated or replaced"):
        load_manifest(art)


def test_tampered_file_same_size(art):
    p = art / "training_model.onnx"
    b = bytearray(p.read_bytes())
    b[len(b) // 2] ^= 0xFF
    p.write_bytes(bytes(b))
    with pytest.raises(ArtifactError, match="was modified"):
        load_manifest(art)


def test_file_outside_folder_refused(art):
    d = json.loads((art / "manifest.json").read_text())
    d["files"]["checkpoint"]["path"] = "../checkpoint"
    (art / "manifest.json").write_text(json.dumps(d))
    with pytest.raises(ArtifactError, match="not a plain file name"):
        load_manifest(art)
