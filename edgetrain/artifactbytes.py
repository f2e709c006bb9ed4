"""Bytes an artifact will take, known from its manifest and graph files before anything loads
(what the runtime's budget split needs, edgetrain/budget.py)."""
from __future__ import annotations

from pathlib import Path

from edgetrain import names
from edgetrain.budget import arena_rounded, state_bytes
from edgetrain.manifest import Manifest
from edgetrain.onnxscan import constant_bytes, stored_tensor_bytes


def state_bytes_of(manifest: Manifest) -> int:
    """Bytes the checkpoint tensors occupy once loaded: one arena chunk per tensor."""
    return state_bytes(manifest.trainable + manifest.frozen)


def inference_bytes_of(folder: Path, manifest: Manifest) -> int:
    """Bytes the exported inference model stores: every checkpoint tensor (now an
    initializer) and the eval graph's constants (a model holding more is not this artifact's)."""
    eval_graph = (folder / manifest.files[names.EVAL_MODEL].path).read_bytes()
    return (sum(t.nbytes for t in manifest.trainable + manifest.frozen)
            + constant_bytes(eval_graph))


def module_constants_bytes(folder: Path, manifest: Manifest) -> int:
    """An upper estimate of what the training Module reserves for its graphs' constants
    (each stored tensor of the training, eval and optimizer graphs in its own 256-byte
    chunk; ORT folds and shares some away). The cap must hold them (budget.py)."""
    return sum(arena_rounded(n) for role in names.MODULE_ROLES
               for n in stored_tensor_bytes((folder / manifest.files[role].path).read_bytes())
               if n)
