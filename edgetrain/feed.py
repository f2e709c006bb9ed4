"""Turn a user's samples into model inputs, one micro-batch at a time.

An *item* is what one forward call sees per row: a whole image, or one patch of one image
for a patch model. Images are made on demand (a 32x32 GASF patch is computed from just the
64 time points it spans), so the device never holds the whole data set as images.
"""
from __future__ import annotations

import numpy as np

from edgetrain import data
from edgetrain.manifest import Manifest


class Feed:
    def __init__(self, x: np.ndarray, y: np.ndarray, manifest: Manifest):
        self.manifest = manifest
        inp = manifest.input
        self.y = y
        self.patch = manifest.plan.patch_size
        c, h, w = inp.image_shape
        self.grid = (h // self.patch, w // self.patch) if self.patch else (1, 1)
        self.per_sample = self.grid[0] * self.grid[1]
        if inp.preprocess == "imu_gasf":
            a = inp.preprocess_args
            self._signals = data.standardised_signals(x, a["mean"], a["scale"], h)
            self._images = None
        else:
            self._signals = None
            self._images = x

    def __len__(self) -> int:
        return len(self.y) * self.per_sample

    @property
    def num_samples(self) -> int:
        return len(self.y)

    def labels(self, items: np.ndarray) -> np.ndarray:
        return self.y[items // self.per_sample]

    def inputs(self, items: np.ndarray) -> np.ndarray:
        """Model inputs for item indices: [B, *sample_shape] float32."""
        out = np.empty((len(items), *self.manifest.input.sample_shape), np.float32)
        for k, item in enumerate(items):
            s, p = divmod(int(item), self.per_sample)
            if self.patch:
                r, c = divmod(p, self.grid[1])
                rows = slice(r * self.patch, (r + 1) * self.patch)
                cols = slice(c * self.patch, (c + 1) * self.patch)
            else:
                rows = cols = slice(None)
            if self._signals is not None:
                out[k] = data.gasf_region(self._signals[s], rows, cols)
            else:
                out[k] = self._images[s][:, rows, cols]
        return out

    def sample_logits(self, item_logits: np.ndarray) -> np.ndarray:
        """Aggregate per-item logits to per-sample logits (mean over a sample's patches)."""
        k = item_logits.shape[-1]
        return item_logits.reshape(self.num_samples, self.per_sample, k).mean(axis=1)
