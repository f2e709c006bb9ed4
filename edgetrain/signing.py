"""Signed artifacts: an Ed25519 signature over the manifest, and so over every file it hashes.

The manifest lists the sha256 and size of every file ONNX Runtime reads, and the runtime
checks each file against it (edgetrain/manifest.py) and each graph for what it will do
(edgetrain/graphcheck.py). What those checks cannot tell is who wrote the manifest: anyone
who can write the folder can reseal it. A signature closes that: `export --sign KEY` writes
`manifest.sig` (the 64 bytes of an Ed25519 signature of manifest.json's exact bytes) beside
the manifest, and `personalise --trust KEY.pub` refuses an artifact whose manifest is not
signed by that key, before any other part of it is read. Unsigned artifacts keep working
where no key is asked for. Keys are made by `edgetrain keygen` (PEM: PKCS#8 private key,
SubjectPublicKeyInfo public key), with the `cryptography` library, imported only here and
only when a key is used (`pip install 'edgetrain[sign]'`).
"""
from __future__ import annotations

import os
from pathlib import Path

from edgetrain.atomicfile import atomic_write_bytes
from edgetrain.manifest import MAX_MANIFEST_BYTES
from edgetrain.names import MANIFEST_NAME, SIGNATURE_NAME
from edgetrain.specs import ArtifactError

SIGNATURE_BYTES = 64
MAX_KEY_BYTES = 4096  # a PEM Ed25519 key is about 120 bytes


def _crypto():
    try:
        from cryptography.exceptions import InvalidSignature
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ed25519
    except ImportError as e:
        raise ArtifactError("signed artifacts need the `cryptography` package: "
                            "pip install 'edgetrain[sign]'") from e
    return InvalidSignature, serialization, ed25519


def _read_small(path: Path, limit: int, what: str) -> bytes:
    """The bytes of a regular file of at most `limit` bytes (no device, FIFO or link)."""
    if path.is_symlink() or not path.is_file():
        raise ArtifactError(f"{what} {path} is not a regular file; give the file itself")
    size = path.stat().st_size
    if size > limit:
        raise ArtifactError(f"{what} {path} is {size:,} bytes, more than {limit:,}; is it the "
                            "right file?")
    return path.read_bytes()


def generate_keys(prefix: str | os.PathLike) -> tuple[Path, Path]:
    """Write a new Ed25519 key pair: PREFIX.key (private, mode 0600) and PREFIX.pub."""
    _, serialization, ed25519 = _crypto()
    private, public = Path(f"{prefix}.key"), Path(f"{prefix}.pub")
    for p in (private, public):
        if os.path.lexists(p):
            raise ValueError(f"{p} exists; keys are never overwritten (choose another prefix)")
    key = ed25519.Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    fd = os.open(private, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
    public.write_bytes(key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    return private, public


def private_key(path: str | os.PathLike):
    """The Ed25519 private key in a PEM file (ValueError naming what else it is)."""
    _, serialization, ed25519 = _crypto()
    raw = _read_small(Path(path), MAX_KEY_BYTES, "signing key")
    try:
        key = serialization.load_pem_private_key(raw, password=None)
    except (ValueError, TypeError) as e:
        raise ValueError(f"signing key {path} is not an unencrypted PEM private key ({e}); "
                         "make one with `edgetrain keygen`") from e
    if not isinstance(key, ed25519.Ed25519PrivateKey):
        raise ValueError(f"signing key {path} is a {type(key).__name__}, not Ed25519; make "
                         "one with `edgetrain keygen`")
    return key


def sign(folder: str | os.PathLike, key) -> Path:
    """Sign the artifact in `folder` with an Ed25519 private key (private_key); returns the
    signature's path."""
    path = Path(folder) / SIGNATURE_NAME
    atomic_write_bytes(path, key.sign((Path(folder) / MANIFEST_NAME).read_bytes()))
    return path


def verify(folder: str | os.PathLike, public_key: str | os.PathLike) -> None:
    """Refuse (ArtifactError) the artifact in `folder` unless its manifest carries a valid
    signature by the Ed25519 public key in the file `public_key`."""
    invalid, serialization, ed25519 = _crypto()
    raw = _read_small(Path(public_key), MAX_KEY_BYTES, "trusted key")
    try:
        key = serialization.load_pem_public_key(raw)
    except (ValueError, TypeError) as e:
        raise ArtifactError(f"trusted key {public_key} is not a PEM public key ({e}); give "
                            "the .pub file `edgetrain keygen` wrote") from e
    if not isinstance(key, ed25519.Ed25519PublicKey):
        raise ArtifactError(f"trusted key {public_key} is a {type(key).__name__}, not Ed25519")
    folder = Path(folder)
    signature = folder / SIGNATURE_NAME
    if not os.path.lexists(signature):
        raise ArtifactError(f"artifact {folder} is not signed ({SIGNATURE_NAME} is missing) and "
                            f"--trust {public_key} asks for a signature; export it with "
                            "--sign, or run without --trust")
    sig = _read_small(signature, SIGNATURE_BYTES, "signature")
    manifest = _read_small(folder / MANIFEST_NAME, MAX_MANIFEST_BYTES, "manifest")
    try:
        key.verify(sig, manifest)
    except invalid:
        raise ArtifactError(f"artifact {folder}: its manifest's signature does not verify "
                            f"with {public_key}: the artifact was changed after it was signed, "
                            "or another key signed it. The artifact is refused") from None
