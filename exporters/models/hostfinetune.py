"""Personalisation replayed on the host, in torch: what the device's recipe does to a user.

Used where the host must judge a recipe before any artifact exists: the update-plan search
(exporters/plans/updatesearch.py scores how much updating each part of a network helps held-out
population users) and the recipe study (bench/personalise_recipes.py). It follows the device:
BatchNorm as a fixed affine map (the module stays in eval mode), AdamW, the best epoch by
validation loss, and a window's prediction the mean of its items' logits (a patch network's
49 patches). It is a replay, not the device: the numbers it gives are labelled host-side.
"""
from __future__ import annotations

import copy

import numpy as np
import torch

from edgetrain import data


class Inputs:
    """A network's items per window [N, items, ...]: the standardised window (one item, laid
    out as the network reads it), or its GASF patches."""

    def __init__(self, spec, mean, scale):
        self.spec, self.mean, self.scale = spec, mean, scale

    def __call__(self, x: np.ndarray) -> torch.Tensor:
        if self.spec.input != "imu_window":
            images = data.gasf_images(x, self.mean, self.scale, self.spec.image_size)
            if self.spec.patch_size:
                return torch.from_numpy(data.to_patches(images, self.spec.patch_size))
            return torch.from_numpy(images)[:, None]
        w = data.standardised_windows(x, self.mean, self.scale)
        if self.spec.layout == "CT":
            w = w.transpose(0, 2, 1)
        return torch.from_numpy(np.ascontiguousarray(w))[:, None]


def evaluate(m: torch.nn.Module, X: torch.Tensor, y: torch.Tensor
             ) -> tuple[float, int, np.ndarray]:
    """Loss, windows right, and which (a window's logits: the mean over its items)."""
    m.eval()
    with torch.no_grad():
        logits = torch.stack([m(X[i]).mean(0) for i in range(len(X))])
    right = (logits.argmax(1) == y).numpy()
    return torch.nn.functional.cross_entropy(logits, y).item(), int(right.sum()), right


def finetune(pop: torch.nn.Module, X, y, Xv, yv, lr: float, trained: set[str],
             epochs: int = 5, micro_batch: int | None = None, replay=None, seed: int = 0
             ) -> tuple[torch.nn.Module, int]:
    """A copy of `pop` with the parameters named in `trained` fine-tuned on (X, y); the best
    epoch by loss on (Xv, yv) (0: the population model itself). Returns (model, epoch).

    micro_batch: items per step (default 8 whole windows, or 32 patches: 49 patches a window
    make 8-patch steps slow on the host). replay: (X, y) of population windows; each step is
    joined by as many items drawn from them."""
    micro_batch = micro_batch or (32 if X.shape[1] > 1 else 8)
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    m = copy.deepcopy(pop)
    for n, p in m.named_parameters():
        p.requires_grad_(n in trained)
    opt = torch.optim.AdamW([p for p in m.parameters() if p.requires_grad], lr=lr,
                            weight_decay=1e-2)
    best_loss, best_state, best_epoch = evaluate(m, Xv, yv)[0], copy.deepcopy(m.state_dict()), 0
    items = np.array([(w, i) for w in range(len(y)) for i in range(X.shape[1])])
    for epoch in range(1, epochs + 1):
        m.eval()  # BatchNorm as a fixed affine map, as the device trains it
        for b in np.split(rng.permutation(len(items)), range(micro_batch, len(items), micro_batch)):
            w, i = items[b].T
            xb, yb = X[w, i], y[w]
            if replay is not None:
                rw = rng.integers(0, len(replay[1]), len(b))
                xb = torch.cat([xb, replay[0][rw, rng.integers(0, X.shape[1], len(b))]])
                yb = torch.cat([yb, replay[1][rw]])
            loss = torch.nn.functional.cross_entropy(m(xb), yb)
            opt.zero_grad()
            loss.backward()
            opt.step()
        val_loss = evaluate(m, Xv, yv)[0]
        if val_loss < best_loss:
            best_loss, best_state, best_epoch = val_loss, copy.deepcopy(m.state_dict()), epoch
    m.load_state_dict(best_state)
    return m, best_epoch
