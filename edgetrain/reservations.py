"""The bytes ONNX Runtime reserves past the arena's limit, measured once per artifact.

Every session ORT opens copies its graph's initializers (graph constants, an inference model's
weights) into one buffer it takes with BFCArena::Reserve. Reserve does not check the arena's
`max_mem`; it only adds to the bytes the arena counts, so a reservation made before the
arena grows is seen by every later limit check, and one made after is not (measured on a
small MLP: a budget equal to the measured peak failed until only the later reservations were
taken from it). The runtime opens the training Module's sessions (training and eval graphs,
optimizer) and its side graphs (mask update, BatchNorm reset) first and keeps them open, so
their reservations live inside the limit. The inference model is opened at the end, after
training: it reserves past the limit, so a hard cap takes its bytes from the budget up front
(edgetrain/budget.py).

Those bytes cannot be read off the graph files exactly: ORT folds, shares and drops
constants while it optimises a graph (a small MLP's eval graph stores 3 constants, which
ORT's GELU fusion removes). They are exact and repeatable for a given graph and onnxruntime
version, so the exporter measures them here, in a child process that opens every session the
runtime opens with ORT's allocator log on, and records them in the manifest
(`session_reserve_bytes`). The manifest's file hashes pin the graphs they were measured on.
Without a measured value the runtime uses reserve_bound_bytes, an upper estimate.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from edgetrain import names
from edgetrain.budget import arena_rounded
from edgetrain.onnxscan import stored_tensor_bytes

RESERVE_LINE = re.compile(r"Reserving memory in BFCArena for \w+ size: (\d+)")
_LATE = "EDGETRAIN-RESERVATIONS-LATE"  # every session but the inference model's is open
_DONE = "EDGETRAIN-RESERVATIONS-DONE"


def reserve_bound_bytes(folder: Path, manifest) -> int:
    """An upper estimate of the inference session's reservation when none was measured: its
    weights (every checkpoint tensor) and the eval graph's stored tensors, each rounded to
    its 256-byte chunk."""
    data = (Path(folder) / manifest.files[names.EVAL_MODEL].path).read_bytes()
    return (sum(arena_rounded(t.nbytes) for t in manifest.trainable + manifest.frozen)
            + sum(arena_rounded(n) for n in stored_tensor_bytes(data) if n))


def measure_reservations(folder: str | os.PathLike, timeout_s: float = 600) -> int:
    """Bytes ORT reserves past the arena's limit for the inference session the runtime opens
    after training, measured with every other session of the runtime open."""
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "ort.log"
        with open(log, "wb") as f:
            proc = subprocess.run([sys.executable, "-m", "edgetrain.reservations", str(folder),
                                   tmp], stdout=subprocess.PIPE, stderr=f, timeout=timeout_s)
        text = log.read_text(errors="replace")
        if proc.returncode != 0 or _DONE not in text:
            tail = "\n".join(text.splitlines()[-5:])
            raise RuntimeError(f"measuring the sessions' reservations failed "
                               f"(exit {proc.returncode}):\n{tail}")
    late = text.split(_LATE, 1)[1].split(_DONE, 1)[0]
    return sum(int(m.group(1)) for m in RESERVE_LINE.finditer(late))


def _open_every_session(folder: str, tmp: str) -> None:
    from edgetrain.ort_device import onnxruntime
    from edgetrain.runtime import DeviceRuntime

    onnxruntime().set_default_logger_severity(1)  # INFO: the arena's Reserve lines
    rt = DeviceRuntime(folder)  # the Module's sessions and the side graphs'
    sys.stderr.write(f"\n{_LATE}\n")
    sys.stderr.flush()
    rt.open_inference(rt.export_inference(Path(tmp) / names.RUN_INFERENCE_MODEL))
    sys.stderr.write(f"\n{_DONE}\n")
    sys.stderr.flush()
    json.dump({"ok": True}, sys.stdout)


if __name__ == "__main__":
    _open_every_session(sys.argv[1], sys.argv[2])
