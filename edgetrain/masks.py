"""Dynamic sparse training on device: drop the weakest kept weights, regrow as many elsewhere.

Each masked layer holds `values` [nnz] and `positions` [nnz] into its flattened dense weight
(exporters/plans/sparse.py). A mask update drops the `n` kept weights with the lowest keep score and
puts `n` new positions into the freed slots, the ones with the highest grow score among the
positions not kept. nnz never changes, so density stays at its target and every tensor keeps
its shape. Regrown weights start at zero (the runtime also zeroes their optimizer moments).

Updaters (UPDATERS) differ only in their scores, as in RigL (Evci et al. 2020):
  set:  keep |w|, grow at random (Mocanu et al. 2018)
  rigl: keep |w|, grow where the dense gradient is largest (needs the mask-gradient graph)

`mask_update` is the one step both sides run: the device on its checkpoint state
(edgetrain/maskupdate.py) and host-side sparse pretraining on torch tensors
(exporters/models/dst.py). The number of weights a layer drops comes from `drop_count` alone.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Mapping

import numpy as np


def keep_magnitude(values: np.ndarray) -> np.ndarray:
    return np.abs(values)


def grow_random(dense_grad: np.ndarray | None, numel: int, rng: np.random.Generator) -> np.ndarray:
    return rng.random(numel)


def grow_gradient(dense_grad: np.ndarray | None, numel: int,
                  rng: np.random.Generator) -> np.ndarray:
    assert dense_grad is not None and dense_grad.shape == (numel,)
    return np.abs(dense_grad)


@dataclass(frozen=True)
class Updater:
    keep_score: Callable[[np.ndarray], np.ndarray]  # [nnz] values -> [nnz], low is dropped
    grow_score: Callable[[np.ndarray | None, int, np.random.Generator], np.ndarray]  # -> [numel]
    needs_dense_grad: bool


UPDATERS: dict[str, Updater] = {
    "set": Updater(keep_magnitude, grow_random, needs_dense_grad=False),
    "rigl": Updater(keep_magnitude, grow_gradient, needs_dense_grad=True),
}


@dataclass(frozen=True)
class MaskSchedule:
    """When and how much to update: every `every_steps` optimizer steps, until `end_ratio` of
    all steps, dropping `drop_fraction` of each layer's kept weights, decayed by a cosine
    (RigL's schedule; its defaults are 0.3 and 0.75)."""

    method: str
    every_steps: int = 10
    drop_fraction: float = 0.3
    end_ratio: float = 0.75

    def __post_init__(self):
        if self.method not in UPDATERS:
            raise ValueError(f"unknown mask updater {self.method!r}; choose one of "
                             f"{sorted(UPDATERS)}")
        if self.every_steps <= 0:
            raise ValueError(f"mask updates need every_steps >= 1, got {self.every_steps}")
        if not 0 < self.drop_fraction < 1:
            raise ValueError(f"drop fraction must be in (0, 1), got {self.drop_fraction}")
        if not 0 < self.end_ratio <= 1:
            raise ValueError(f"end ratio must be in (0, 1], got {self.end_ratio}")

    def fraction_at(self, step: int, total_steps: int) -> float:
        """Drop fraction after optimizer step `step` (1-based); 0 when no update is due."""
        end = self.end_ratio * total_steps
        if step % self.every_steps or step >= end:
            return 0.0
        return self.drop_fraction / 2 * (1 + math.cos(math.pi * step / end))


def update_layer(values: np.ndarray, positions: np.ndarray, numel: int, n: int,
                 keep_score: np.ndarray, grow_score: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Drop the n slots of lowest keep_score, regrow at the n best positions not kept.

    values, positions, keep_score: [nnz]; grow_score: [numel]. Returns new (values,
    positions) and the slots (indices into [nnz]) that hold a regrown weight (value 0)."""
    nnz = len(values)
    assert positions.shape == values.shape == keep_score.shape == (nnz,)
    assert grow_score.shape == (numel,) and 0 <= n <= nnz
    if n == 0:
        return values.copy(), positions.copy(), np.zeros(0, np.int64)
    slots = np.argsort(keep_score, kind="stable")[:n]
    kept = np.zeros(numel, bool)
    kept[positions] = True
    kept[positions[slots]] = False  # dropped positions may be regrown (then they restart at 0)
    score = np.where(kept, -np.inf, grow_score.astype(np.float64))
    grown = np.argsort(-score, kind="stable")[:n]
    values, positions = values.copy(), positions.copy()
    positions[slots] = grown.astype(positions.dtype)
    values[slots] = 0
    return values, positions, np.sort(slots)


def drop_count(fraction: float, nnz: int) -> int:
    """How many of a layer's nnz kept weights one update replaces: the nearest whole number
    to fraction x nnz. Host and device both count with this, so they drop the same number."""
    if not 0 <= fraction <= 1:
        raise ValueError(f"drop fraction must be in [0, 1], got {fraction}")
    return int(round(fraction * nnz))


@dataclass
class MaskedLayer:
    """One masked layer as mask_update sees it. values and positions are updated in place."""

    values: np.ndarray  # [nnz] kept weights
    positions: np.ndarray  # [nnz] their indices into the flattened dense weight
    numel: int  # the dense weight's size
    dense_grad: np.ndarray | None = None  # [numel], for updaters that grow by the gradient


def mask_update(layers: Mapping[str, MaskedLayer], method: str, fraction: float,
                rng: np.random.Generator,
                reset_moments: Callable[[dict[str, np.ndarray]], None]) -> int:
    """Drop drop_count(fraction, nnz) weights of every layer and regrow as many (update_layer).

    Each layer's values and positions change in place (regrown values are 0). Then
    reset_moments({layer: regrown slots}) is called once, for the caller to zero those slots'
    optimizer moments (so a regrown weight restarts from its own gradient). Layers that drop
    nothing are left alone and draw nothing from rng. Returns the number of regrown weights."""
    if method not in UPDATERS:
        raise ValueError(f"unknown mask updater {method!r}; choose one of {sorted(UPDATERS)}")
    updater = UPDATERS[method]
    regrown: dict[str, np.ndarray] = {}
    for key, layer in layers.items():
        n = drop_count(fraction, len(layer.values))
        if n == 0:
            continue
        if updater.needs_dense_grad and layer.dense_grad is None:
            raise ValueError(f"mask update {method!r} needs the dense gradient of {key}")
        values, positions, slots = update_layer(
            layer.values, layer.positions.astype(np.int64), layer.numel, n,
            updater.keep_score(layer.values),
            updater.grow_score(layer.dense_grad, layer.numel, rng))
        layer.values[...] = values
        layer.positions[...] = positions.astype(layer.positions.dtype)
        regrown[key] = slots
    if regrown:
        reset_moments(regrown)
    return sum(len(s) for s in regrown.values())
