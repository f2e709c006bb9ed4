"""Sparse masks that shrink what the device holds (configuration C2 of the seed stack).

A masked layer keeps only its kept weights: `<layer>.weight_values` [nnz] is the trainable
tensor (so its gradient and both AdamW moments are nnz-sized too) and
`<layer>.weight_positions` [nnz] (int32, frozen) says where they sit in the flattened dense
weight. Forward scatters the values into zeros to build the dense weight, which exists only
while the step runs. Weights off the mask are exactly zero by construction.

Per-layer densities come from an allocation in ALLOCATIONS (uniform, global magnitude, or
ERK: Evci et al. 2020) and the first mask from an initialiser in INITS (random, or the largest magnitudes of
the pretrained weights). Each entry is a small function; see their docstrings.
"""
from __future__ import annotations

import copy
import math
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from edgetrain import names
from edgetrain.manifest import MaskSpec

# SparseWeight's attribute names are the contract's suffixes (edgetrain/names.py).
assert (names.VALUES_SUFFIX, names.POSITIONS_SUFFIX) == ("weight_values", "weight_positions")


class SparseWeight(nn.Module):
    """Holds a masked weight as kept values and their positions; `dense()` rebuilds it."""

    def __init__(self, weight: torch.Tensor, positions: torch.Tensor):
        super().__init__()
        self.shape = tuple(weight.shape)
        positions = positions.sort().values
        flat = weight.detach().reshape(-1)
        self.weight_values = nn.Parameter(flat[positions].clone())
        self.register_buffer(names.POSITIONS_SUFFIX, positions.to(torch.int32))

    def dense(self) -> torch.Tensor:
        numel = math.prod(self.shape)
        # The zeros are computed from a graph input, not stored: a constant [numel] would be an
        # initializer, held by every session for the whole run (dense bytes, per session).
        zero = self.weight_positions[:1].to(self.weight_values.dtype) * 0
        flat = zero.expand(numel).scatter(0, self.weight_positions.long(), self.weight_values)
        return flat.view(self.shape)


class SparseConv2d(SparseWeight):
    def __init__(self, conv: nn.Conv2d, positions: torch.Tensor):
        super().__init__(conv.weight, positions)
        self.bias = None if conv.bias is None else nn.Parameter(conv.bias.detach().clone())
        self.stride, self.padding = conv.stride, conv.padding
        self.dilation, self.groups = conv.dilation, conv.groups

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [B, Cin, H, W]
        return F.conv2d(x, self.dense(), self.bias, self.stride, self.padding, self.dilation,
                        self.groups)


class SparseLinear(SparseWeight):
    def __init__(self, linear: nn.Linear, positions: torch.Tensor):
        super().__init__(linear.weight, positions)
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach().clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [B, in] -> [B, out]
        return F.linear(x, self.dense(), self.bias)


# ---- per-layer densities -------------------------------------------------------------------
def allocate_uniform(weights: dict[str, torch.Tensor], density: float) -> dict[str, float]:
    """Every layer at the target density (with magnitude init: layerwise magnitude pruning)."""
    return {n: density for n in weights}


def allocate_global(weights: dict[str, torch.Tensor], density: float) -> dict[str, float]:
    """One magnitude threshold over all layers (with magnitude init: global magnitude
    pruning, seed 003): a layer keeps the fraction of its weights above the threshold."""
    flat = torch.cat([w.detach().abs().reshape(-1) for w in weights.values()])
    k = max(1, round(density * flat.numel()))
    threshold = flat.topk(k).values[-1]
    return {n: float((w.detach().abs() >= threshold).sum()) / w.numel()
            for n, w in weights.items()}


def allocate_erk(weights: dict[str, torch.Tensor], density: float) -> dict[str, float]:
    """Erdős–Rényi-Kernel (RigL): density of a layer proportional to sum(shape) / prod(shape),
    scaled so the kept total is `density` of all weights; layers that would exceed 1 stay
    dense and the rest are rescaled."""
    shapes = {n: tuple(w.shape) for n, w in weights.items()}
    total = sum(math.prod(s) for s in shapes.values())
    dense: set[str] = set()
    while True:
        budget = density * total - sum(math.prod(shapes[n]) for n in dense)
        raw = {n: sum(s) / math.prod(s) for n, s in shapes.items() if n not in dense}
        scale = budget / sum(raw[n] * math.prod(shapes[n]) for n in raw)
        over = [n for n in raw if raw[n] * scale > 1]
        if not over:
            return {n: 1.0 if n in dense else raw[n] * scale for n in shapes}
        dense.update(over)


ALLOCATIONS: dict[str, Callable[[dict, float], dict[str, float]]] = {
    "uniform": allocate_uniform,
    "global": allocate_global,
    "erk": allocate_erk,
}


# ---- first masks ---------------------------------------------------------------------------
def init_random(weight: torch.Tensor, nnz: int, generator: torch.Generator) -> torch.Tensor:
    return torch.randperm(weight.numel(), generator=generator)[:nnz]


def init_magnitude(weight: torch.Tensor, nnz: int, generator: torch.Generator) -> torch.Tensor:
    return weight.detach().abs().reshape(-1).topk(nnz).indices


INITS: dict[str, Callable[[torch.Tensor, int, torch.Generator], torch.Tensor]] = {
    "random": init_random,
    "magnitude": init_magnitude,
}


def maskable(model: nn.Module) -> dict[str, nn.Module]:
    """Conv2d and Linear layers by name: the layers a mask may cover."""
    return {n: m for n, m in model.named_modules() if isinstance(m, (nn.Conv2d, nn.Linear))}


def layer_nnz(model: nn.Module, density: float, allocation: str = "erk") -> dict[str, int]:
    """Kept weights per maskable layer (name -> nnz; nnz == numel means the layer stays dense).
    The exporter and host-side sparse training (exporters/dst.py) both count with this."""
    if allocation not in ALLOCATIONS:
        raise ValueError(f"unknown mask allocation {allocation!r}; choose one of "
                         f"{sorted(ALLOCATIONS)}")
    layers = maskable(model)
    densities = ALLOCATIONS[allocation]({n: m.weight for n, m in layers.items()}, density)
    return {n: max(1, min(m.weight.numel(), round(densities[n] * m.weight.numel())))
            for n, m in layers.items()}


def sparsify(model: nn.Module, density: float, allocation: str = "erk",
             init: str = "magnitude", seed: int = 0) -> tuple[nn.Module, tuple[MaskSpec, ...]]:
    """A copy of `model` whose Conv2d and Linear weights are masked to `density` overall."""
    if not 0 < density <= 1:
        raise ValueError(f"density must be in (0, 1], got {density}; 1.0 means dense")
    if allocation not in ALLOCATIONS:
        raise ValueError(f"unknown mask allocation {allocation!r}; choose one of "
                         f"{sorted(ALLOCATIONS)}")
    if init not in INITS:
        raise ValueError(f"unknown mask initialisation {init!r}; choose one of {sorted(INITS)}")
    model = copy.deepcopy(model)
    layers = maskable(model)
    if density == 1 or not layers:
        return model, ()
    counts = layer_nnz(model, density, allocation)
    generator = torch.Generator().manual_seed(seed)
    specs = []
    for name, layer in layers.items():
        shape = tuple(layer.weight.shape)
        nnz = counts[name]
        if nnz == math.prod(shape):
            continue  # stays dense
        positions = INITS[init](layer.weight, nnz, generator)
        cls = SparseConv2d if isinstance(layer, nn.Conv2d) else SparseLinear
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, cls(layer, positions))
        weight, values, positions = names.mask_tensor_names(name)
        specs.append(MaskSpec(weight, shape, nnz, values, positions))
    return model, tuple(specs)
