"""Dynamic sparse training in torch, for population training on the host (seed stack C2).

The device (edgetrain/masks.py) trains a sparse artifact that holds only its kept weights.
The population model it starts from should already be sparse-trained, or pruning it at
export costs most of its accuracy (docs/sparse.md, RESET table). Here a dense torch model
trains under masks: every maskable layer keeps exactly the nnz that the exporter will keep
(exporters.plans.sparse.layer_nnz, the same allocation), weights and AdamW moments off the mask are
held at zero, and every `every_steps` optimizer steps the masks move by
edgetrain.masks.mask_update, the very step the device runs (the same drop count, the same
drop/grow rule; RigL grows where this step's dense gradient is largest). Export the result with mask init `magnitude`: the kept
weights are exactly the nonzero ones.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from edgetrain.masks import UPDATERS, MaskedLayer, MaskSchedule, mask_update
from exporters.plans.sparse import layer_nnz, maskable


@dataclass(frozen=True)
class DstConfig:
    density: float = 0.1
    allocation: str = "erk"
    epochs: int = 2  # sparse epochs after the dense ones (pruning at their start)
    lr: float = 1e-3
    method: str = "rigl"
    every_steps: int = 20
    drop_fraction: float = 0.3
    end_ratio: float = 0.75

    def schedule(self) -> MaskSchedule:
        return MaskSchedule(self.method, self.every_steps, self.drop_fraction, self.end_ratio)


class TorchMasks:
    """Boolean masks over a model's maskable weights, started at the largest magnitudes."""

    def __init__(self, model: nn.Module, density: float, allocation: str = "erk"):
        counts = layer_nnz(model, density, allocation)
        # masked weight's PyTorch name -> its (module, attribute), and -> the Parameter
        self.owners = {n: (m, a) for n, (m, a) in maskable(model).items()
                       if counts[n] < getattr(m, a).numel()}
        self.layers = {n: getattr(m, a) for n, (m, a) in self.owners.items()}
        self.masks: dict[str, torch.Tensor] = {}
        for name, layer in self.layers.items():
            w = layer.detach().reshape(-1)
            mask = torch.zeros(w.numel(), dtype=torch.bool)
            mask[w.abs().topk(counts[name]).indices] = True
            self.masks[name] = mask

    @torch.no_grad()
    def apply(self, optimizer: torch.optim.Optimizer | None = None) -> None:
        """Zero every weight off its mask, and its AdamW moments (regrown weights restart)."""
        for name, layer in self.layers.items():
            keep = self.masks[name].view_as(layer)
            layer.mul_(keep)
            state = optimizer.state.get(layer, {}) if optimizer is not None else {}
            for key in ("exp_avg", "exp_avg_sq"):
                if key in state:
                    state[key].mul_(keep)

    @torch.no_grad()
    def update(self, method: str, fraction: float, rng: np.random.Generator,
               optimizer: torch.optim.Optimizer | None = None) -> int:
        """Drop `fraction` of each layer's kept weights and regrow as many; uses the dense
        gradients left in `.grad` by the last backward pass. Returns the regrown count."""
        if method not in UPDATERS:
            raise ValueError(f"unknown mask updater {method!r}; choose one of {sorted(UPDATERS)}")
        needs_grad = UPDATERS[method].needs_dense_grad
        layers = {}
        for name, layer in self.layers.items():
            positions = self.masks[name].nonzero().squeeze(1).numpy()
            grad = layer.grad
            if needs_grad and grad is None:
                raise ValueError(f"mask update {method!r} needs the dense gradient of {name}; "
                                 "call it after backward()")
            layers[name] = MaskedLayer(
                layer.detach().reshape(-1).numpy()[positions], positions,
                layer.numel(), grad.reshape(-1).numpy() if grad is not None else None)

        def restart(regrown: dict[str, np.ndarray]) -> None:
            """New masks; regrown weights and their AdamW moments restart at 0."""
            for name, slots in regrown.items():
                weight, positions = self.layers[name], layers[name].positions
                new = torch.zeros_like(self.masks[name])
                new[torch.from_numpy(positions.astype(np.int64))] = True
                self.masks[name] = new
                grown = torch.from_numpy(positions[slots].astype(np.int64))
                weight.view(-1)[grown] = 0
                state = optimizer.state.get(weight, {}) if optimizer is not None else {}
                for key in ("exp_avg", "exp_avg_sq"):
                    if key in state:
                        state[key].view(-1)[grown] = 0

        regrown = mask_update(layers, method, fraction, rng, restart)
        self.apply(optimizer)  # dropped weights leave the model now, not after the next step
        return regrown

    def density(self) -> float:
        kept = sum(int(m.sum()) for m in self.masks.values())
        return kept / max(1, sum(m.numel() for m in self.masks.values()))

    def nnz(self) -> dict[str, int]:
        return {n: int(m.sum()) for n, m in self.masks.items()}
