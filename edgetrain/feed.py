"""Turn a user's samples into model inputs, one micro-batch at a time.

An *item* is what one forward call sees per row: a whole sample, or one patch of one image
for a patch model. Inputs are made on demand from the user's arrays (a 32x32 GASF patch is
computed from just the 64 time points it spans; a raw IMU window is standardised when its
micro-batch is built), so the device never holds the whole data set a second time. x and y
may be arrays or SampleArrays on disk (edgetrain/samples.py): a micro-batch reads its rows.

Samples may have any fixed shape: images [C, H, W], time series [C, T] or [T, F], feature
vectors; patching applies to [C, H, W] images only.
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
        if self.patch:
            if len(inp.image_shape) != 3:
                raise data.DataError(f"patching needs [C, H, W] images; this artifact's "
                                     f"samples are {list(inp.image_shape)}: re-export it "
                                     "without a patch size")
            _, h, w = inp.image_shape
            self.grid = (h // self.patch, w // self.patch)
        else:
            self.grid = (1, 1)
        self.per_sample = self.grid[0] * self.grid[1]
        self._x = x
        self._gasf = inp.preprocess == "imu_gasf"
        self._signals = (-1, None)  # (sample, its standardised signals): the last one made
        if inp.preprocess == "imu_window":
            a = inp.preprocess_args
            self._mean = np.asarray(a["mean"], np.float32)
            self._scale = np.asarray(a["scale"], np.float32)
            self._channels_first = inp.layout == "CT"

    def __len__(self) -> int:
        return len(self.y) * self.per_sample

    @property
    def num_samples(self) -> int:
        return len(self.y)

    def labels(self, items: np.ndarray) -> np.ndarray:
        return np.asarray(self.y[np.asarray(items) // self.per_sample], np.int64)

    def signals(self, s: int) -> np.ndarray:
        """Sample s's resampled, standardised signals [image_size, 6] (for GASF patches)."""
        if self._signals[0] != s:
            inp = self.manifest.input
            a = inp.preprocess_args
            self._signals = (s, data.standardised_signals(
                np.asarray(self._x[s])[None], a["mean"], a["scale"], inp.image_shape[1])[0])
        return self._signals[1]

    def inputs(self, items: np.ndarray) -> np.ndarray:
        """Model inputs for item indices: [B, *sample_shape] float32."""
        inp = self.manifest.input
        out = np.empty((len(items), *inp.sample_shape), np.float32)
        for k, item in enumerate(items):
            s, p = divmod(int(item), self.per_sample)
            if inp.preprocess == "imu_window":
                w = (self._x[s] - self._mean) / self._scale  # [T, 6]
                out[k] = w.T if self._channels_first else w
                continue
            if self.patch:
                r, c = divmod(p, self.grid[1])
                region = (slice(r * self.patch, (r + 1) * self.patch),
                          slice(c * self.patch, (c + 1) * self.patch))
            else:
                region = (slice(None), slice(None))
            if self._gasf:
                out[k] = data.gasf_region(self.signals(s), *region)
            elif self.patch:
                out[k] = self._x[s][:, region[0], region[1]]
            else:
                out[k] = self._x[s]
        return out

    def sample_logits(self, logits_fn, batch: int) -> np.ndarray:
        """Per-sample logits [N, K]: each sample's items' logits averaged (a patch model's
        patches), items made and run `batch` at a time."""
        sums = None
        for lo in range(0, len(self), batch):
            items = np.arange(lo, min(lo + batch, len(self)))
            logits = logits_fn(self.inputs(items))
            if sums is None:
                sums = np.zeros((self.num_samples, logits.shape[-1]), np.float64)
            np.add.at(sums, items // self.per_sample, logits)
        return (sums / self.per_sample).astype(np.float32)
