"""Which NCHWc block this process's ONNX Runtime uses, and whether an artifact's training graph
was built for it (exporters/passes/nchwc.py writes depthwise filters in that block's order).

MLAS chooses the block when ORT starts: 16 channels on CPUs with AVX-512, 8 with AVX2, none
elsewhere. No API reports it, so a 4-channel tensor is reordered and the padded channel count
read back. The device side has no onnx package: the probe graph (one ReorderInput of a
[1, 4, 1, 1] float input `x` to `y`, opset 17 and com.microsoft.nchwc 1, IR 8) is kept as its
136 serialized bytes; tests/test_nchwc.py builds it with onnx and compares. The probe's
session is a plain one with its own arena (not the capped env arena), opened and freed before
the runtime installs its cap; the allocator log leaves it out (check_block).
"""
from __future__ import annotations

import numpy as np

from edgetrain.arenalog import PROBE_PHASE
from edgetrain.manifest import ArtifactError

PROBE_MODEL = bytes.fromhex(
    "0808120965646765747261696e3a5a0a290a0178120179220c52656f72646572496e7075743a13636f6d2e"
    "6d6963726f736f66742e6e63687763120570726f62655a1b0a017812160a14080112100a0208010a020804"
    "0a0208010a02080162090a017912040a02080142040a00101142170a13636f6d2e6d6963726f736f66742e"
    "6e636877631001")


def nchwc_block(ort) -> int:
    """The NCHWc block of the `ort` module's CPU provider; 0 when it has no NCHWc kernels."""
    so = ort.SessionOptions()
    so.log_severity_level = 4
    # ORT's arena stays on: without one, MLAS's ReorderInput corrupted the heap (glibc
    # aborted a later allocation; reproduced 2026-11-25 with 4 to 16 channels, 1x1 and 8x8)
    try:
        s = ort.InferenceSession(PROBE_MODEL, so, providers=["CPUExecutionProvider"])
        return int(s.run(None, {"x": np.zeros((1, 4, 1, 1), np.float32)})[0].shape[1])
    except Exception:  # noqa: BLE001 - no NCHWc kernels in this build or on this CPU
        return 0


def check_block(artifact_block: int, ort, phase=lambda name: None) -> None:
    """Raise ArtifactError unless this process can run a training graph built for
    `artifact_block` (0: the graph has no NCHWc nodes, nothing to check). The probe runs in
    phase PROBE_PHASE of the allocator log, which does not count it (edgetrain/arenalog.py):
    its session's own arena region is freed with it, before the runtime caps its arena."""
    if not artifact_block:
        return
    phase(PROBE_PHASE)
    here = nchwc_block(ort)
    if here != artifact_block:
        raise ArtifactError(
            f"the artifact's depthwise convolutions were written for ONNX Runtime's NCHWc "
            f"kernels with {artifact_block}-channel blocks, and this device's runtime uses "
            f"{here or 'no'} NCHWc blocks; export it again on a machine like this one, or "
            "with --no-nchwc")
