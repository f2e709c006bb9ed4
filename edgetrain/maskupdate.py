"""A mask update on the device: edgetrain.masks.mask_update over the runtime's live state.

The kept values and positions change in place in the checkpoint state (zero-copy views). The
regrown weights' AdamW moments must restart at zero, and ORT exposes no optimizer state to
Python, so the runtime rewrites its state through a checkpoint (edgetrain/ortcheckpoint.py).
"""
from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path
from typing import Callable

import numpy as np

from edgetrain.atomicfile import WriteError
from edgetrain.faultpoints import fault_point
from edgetrain.masks import UPDATERS, MaskedLayer, mask_update
from edgetrain.ort_device import training_api
from edgetrain.ortcheckpoint import zero_moments


def update_masks(rt, method: str, fraction: float, batches: list,
                 rng: np.random.Generator) -> int:
    """One mask update of every masked layer of runtime `rt`; returns the regrown count.

    batches: (x, y) micro-batches whose dense gradient RigL grows by (unused by `set`).
    Regrown weights are zero and their AdamW moments are zeroed; the rest of the state, the
    step count and the learning rate carry on. Call between optimizer steps."""
    if method not in UPDATERS:
        raise ValueError(f"unknown mask updater {method!r}; choose one of {sorted(UPDATERS)}")
    masks = rt.manifest.trained_masks
    if not masks:
        raise ValueError("the artifact has no sparse layer that trains; export it with "
                         "--density < 1 and an update plan that trains a masked layer")
    grads = rt.dense_gradients(batches) if UPDATERS[method].needs_dense_grad else {}
    params = rt.state.parameters
    layers = {m.values: MaskedLayer(params[m.values].data, params[m.positions].data, m.numel,
                                    grads.get(m.weight)) for m in masks}
    return mask_update(layers, method, fraction, rng,
                       lambda slots: rewrite_state(rt, lambda buf: zero_moments(buf, slots)))


def rewrite_state(rt, edit: Callable[[bytearray], None]) -> None:
    """Save runtime rt's whole state (optimizer moments included) to a temporary checkpoint,
    let edit(buffer) change its bytes in place, and load it back: the only way to reach the
    optimizer state, as ORT exposes none to Python. Step count and learning rate carry on.

    The temporary is an anonymous file (O_TMPFILE) in rt.scratch_dir (the run folder during a
    personalisation; else the system temporary folder), reached by ORT through /proc/self/fd:
    it has no name, so a kill at any moment leaves nothing behind. A full or read-only folder
    raises WriteError (the CLI's exit 4); the runtime's state is then as it was."""
    folder = rt.scratch_dir or tempfile.gettempdir()
    try:
        fd = os.open(folder, os.O_TMPFILE | os.O_RDWR, 0o600)
        path, named = f"/proc/self/fd/{fd}", None
    except (OSError, AttributeError):  # no O_TMPFILE here: a named file, removed below
        try:
            fd, path = tempfile.mkstemp(prefix=".edgetrain-state-", dir=folder)
        except OSError as e:
            raise WriteError(Path(folder) / "(temporary checkpoint)", e, _FIX) from e
        named = path
    try:
        try:
            training_api().CheckpointState.save_checkpoint(rt.state, path,
                                                        include_optimizer_state=True)
            size = os.fstat(fd).st_size
            if size < rt.min_checkpoint_bytes:  # ORT does not always report a full disk
                raise OSError(errno.ENOSPC, f"only {size} of at least "
                              f"{rt.min_checkpoint_bytes} bytes reached the disk")
            fault_point("state-rewritten")
            buf = bytearray(os.pread(fd, size, 0))
            edit(buf)
            if os.pwrite(fd, bytes(buf), 0) != len(buf):
                raise OSError(errno.EIO, "the edited checkpoint was not written whole")
        except (OSError, RuntimeError) as e:
            raise WriteError(Path(folder) / "(temporary checkpoint)", e, _FIX) from e
        rt.load_checkpoint(path)
    finally:
        os.close(fd)
        if named:
            os.unlink(named)


_FIX = ("A mask update rewrites the training state through a temporary file there: free "
        "space (or point TMPDIR at a writable disk), then run again with --resume.")
