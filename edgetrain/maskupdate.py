"""A mask update on the device: edgetrain.masks.mask_update over the runtime's live state.

The kept values and positions change in place in the checkpoint state (zero-copy views). The
regrown weights' AdamW moments must restart at zero, and ORT exposes no optimizer state to
Python, so the runtime rewrites its state through a checkpoint (edgetrain/ortcheckpoint.py).
"""
from __future__ import annotations

import numpy as np

from edgetrain.masks import UPDATERS, MaskedLayer, mask_update
from edgetrain.ortcheckpoint import zero_moments


def update_masks(rt, method: str, fraction: float, batches: list,
                 rng: np.random.Generator) -> int:
    """One mask update of every masked layer of runtime `rt`; returns the regrown count.

    batches: (x, y) micro-batches whose dense gradient RigL grows by (unused by `set`).
    Regrown weights are zero and their AdamW moments are zeroed; the rest of the state, the
    step count and the learning rate carry on. Call between optimizer steps."""
    if method not in UPDATERS:
        raise ValueError(f"unknown mask updater {method!r}; choose one of {sorted(UPDATERS)}")
    masks = rt.manifest.masks
    if not masks:
        raise ValueError("the artifact has no sparse masks; export it with --density < 1 "
                         "to train it sparse")
    grads = rt.dense_gradients(batches) if UPDATERS[method].needs_dense_grad else {}
    params = rt.state.parameters
    layers = {m.values: MaskedLayer(params[m.values].data, params[m.positions].data, m.numel,
                                    grads.get(m.weight)) for m in masks}
    return mask_update(layers, method, fraction, rng,
                       lambda slots: rt.rewrite_state(lambda buf: zero_moments(buf, slots)))
