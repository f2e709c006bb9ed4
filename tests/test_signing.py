"""Issue 37, part 2: signed artifacts. `export --sign KEY` writes an Ed25519 signature of the
manifest (which hashes every file); `personalise --trust KEY.pub` refuses an artifact that key
did not sign, before anything else of it is read; unsigned artifacts keep working without."""
from __future__ import annotations

import json
import shutil
import stat

import pytest

from conftest import cli
from edgetrain import signing
from edgetrain.names import MANIFEST_NAME, SIGNATURE_NAME
from test_bad_input import art, refused, reseal, resume, rewrite_manifest, saved  # noqa: F401


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    d = tmp_path_factory.mktemp("keys")
    p = cli("keygen", d / "vendor")
    assert p.returncode == 0, p.stderr
    other = signing.generate_keys(d / "other")
    return {"private": d / "vendor.key", "public": d / "vendor.pub", "other": other}


@pytest.fixture
def signed(art, keys):  # noqa: F811
    signing.sign(art, signing.private_key(keys["private"]))
    return art


def test_keygen_writes_a_private_key_only_its_owner_reads_and_never_overwrites(keys):
    assert stat.S_IMODE(keys["private"].stat().st_mode) == 0o600
    assert b"BEGIN PUBLIC KEY" in keys["public"].read_bytes()
    p = cli("keygen", keys["private"].with_suffix(""))
    assert p.returncode == 2 and "exists; keys are never overwritten" in p.stderr


def test_a_signed_artifact_trains_with_its_key_and_without_one(signed, keys, saved):  # noqa: F811
    assert len((signed / SIGNATURE_NAME).read_bytes()) == signing.SIGNATURE_BYTES
    signing.verify(signed, keys["public"])
    for extra in (("--trust", keys["public"]), ()):
        out = saved["run"].parent / f"run-signed{len(extra)}"
        p = cli("personalise", signed, "--data", saved["data"], "--budget", "4MiB",
                "--epochs", "1", "--out", out, *extra)
        assert p.returncode == 0, p.stderr


def test_another_key_or_no_signature_is_refused(signed, keys, saved):  # noqa: F811
    refused(resume(signed, saved, "--trust", keys["other"][1]), saved,
            "signature does not verify")
    (signed / SIGNATURE_NAME).unlink()
    refused(resume(signed, saved, "--trust", keys["public"]), saved, "is not signed")


@pytest.mark.parametrize("tamper", ["classes", "file"])
def test_a_resealed_or_edited_signed_artifact_is_refused(signed, keys, saved, tamper):  # noqa: F811
    """What hashes alone cannot catch: the unhashed manifest edited (more classes), or a file
    replaced with the manifest resealed to match it."""
    if tamper == "classes":
        d = json.loads((signed / MANIFEST_NAME).read_text())
        rewrite_manifest(signed, classes=d["classes"] + ["extra"])
    else:
        ckpt = signed / "checkpoint"
        ckpt.write_bytes(ckpt.read_bytes()[:-4] + b"\0\0\0\0")
        reseal(signed, "checkpoint")
    refused(resume(signed, saved, "--trust", keys["public"]), saved,
            "signature does not verify")


def test_a_trusted_key_that_is_no_key_is_refused(signed, keys, saved, tmp_path):  # noqa: F811
    (tmp_path / "junk.pub").write_text("not a key")
    refused(resume(signed, saved, "--trust", tmp_path / "junk.pub"), saved,
            "is not a PEM public key")
    refused(resume(signed, saved, "--trust", keys["private"]), saved,
            "is not a PEM public key")
    refused(resume(signed, saved, "--trust", "/dev/zero"), saved, "is not a regular file")


def test_an_export_over_a_signed_artifact_replaces_it(signed, tmp_path):
    """A signed artifact's folder holds the manifest's files and the signature: an export may
    replace it (exporters/arguments.check_replaceable)."""
    from exporters.export.arguments import check_replaceable

    check_replaceable(signed)
    (signed / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="notes.txt"):
        check_replaceable(signed)


def test_sign_refuses_a_key_that_is_not_ed25519(tmp_path, keys):
    (tmp_path / "k.key").write_bytes(keys["public"].read_bytes())
    with pytest.raises(ValueError, match="not an unencrypted PEM private key"):
        signing.private_key(tmp_path / "k.key")
    shutil.copy(keys["private"], tmp_path / "ok.key")
    signing.private_key(tmp_path / "ok.key")


def test_export_artifact_signs_before_the_folder_appears_and_refuses_a_bad_key_first(
        tmp_path, keys):
    import torch

    from conftest import TINY_CLASSES, TINY_SHAPE, tiny_model
    from edgetrain.manifest import Plan
    from exporters.export import export_artifact

    args = (tiny_model(0), torch.zeros(2, *TINY_SHAPE))
    export_artifact(*args, tmp_path / "a", classes=TINY_CLASSES, plan=Plan(micro_batch=4),
                    sign_key=keys["private"])
    signing.verify(tmp_path / "a", keys["public"])
    with pytest.raises(ValueError, match="not an unencrypted PEM private key"):
        export_artifact(*args, tmp_path / "b", classes=TINY_CLASSES, sign_key=keys["public"])
    assert not (tmp_path / "b").exists()
