"""Sparse masks that shrink what the device holds (configuration C2 of the seed stack).

A masked weight keeps only its kept values: `<weight>_values` [nnz] (e.g. `conv.weight_values`,
`attn.in_proj_weight_values`) is the trainable tensor, so its gradient and both AdamW moments
are nnz-sized too, and `<weight>_positions` [nnz] (int32, frozen) says where they sit in the
flattened dense weight. Before the model's forward runs, a hook scatters the values into
zeros and sets the dense weight back on its module as a plain tensor, so every reader sees it:
the module's own forward, or a parent that reads `.weight` (nn.MultiheadAttention reads
`out_proj.weight`). ONNX Runtime builds each dense weight just before its use; it exists only
while the step runs. Weights off the mask are exactly zero by construction.

Maskable (MASKABLE): the weights of Conv1d, Conv2d, Linear (attention's projections
included) and MultiheadAttention's input projections. Everything else stays dense, and
`dense_reasons` says why. Per-layer densities come from an allocation in ALLOCATIONS (uniform,
global magnitude, or ERK: Evci et al. 2020) and the first mask from an initialiser in INITS
(random, or the largest magnitudes of the pretrained weights). Each entry is a small
function; see their docstrings.
"""
from __future__ import annotations

import copy
import math
from typing import Callable

import torch
from torch import nn

from edgetrain import names
from edgetrain.manifest import MaskSpec

MASKABLE: dict[type, tuple[str, ...]] = {
    nn.Conv1d: ("weight",), nn.Conv2d: ("weight",), nn.Linear: ("weight",),
    nn.MultiheadAttention: ("in_proj_weight", "q_proj_weight", "k_proj_weight", "v_proj_weight"),
}
SPARSE_ATTRS = "edgetrain_sparse"  # on a masked module: {attribute: dense shape}


def dense_weight(values: torch.Tensor, positions: torch.Tensor, shape: tuple[int, ...]
                 ) -> torch.Tensor:
    """The dense weight: values scattered into zeros at positions."""
    # The zeros are computed from a graph input, not stored: a constant [numel] would be an
    # initializer, held by every session for the whole run (dense bytes, per session).
    zero = positions[:1].to(values.dtype) * 0
    flat = zero.expand(math.prod(shape)).scatter(0, positions.long(), values)
    return flat.view(shape)


def rebuild_dense_weights(root: nn.Module, args) -> None:
    """Forward pre-hook of a sparsified model: set every masked module's dense weights."""
    for m in root.modules():
        for attr, shape in getattr(m, SPARSE_ATTRS, {}).items():
            values = getattr(m, attr + names.MASK_VALUES_SUFFIX)
            positions = getattr(m, attr + names.MASK_POSITIONS_SUFFIX)
            setattr(m, attr, dense_weight(values, positions, shape))


def drop_dense_weights(root: nn.Module, args, output) -> None:
    """Forward hook: the dense weights exist only while the forward runs (a model holding
    them between calls could not be copied, and would hold dense bytes)."""
    for m in root.modules():
        for attr in getattr(m, SPARSE_ATTRS, {}):
            m.__dict__.pop(attr, None)


def mask_weight(module: nn.Module, attr: str, positions: torch.Tensor) -> None:
    """Replace module.<attr> (a Parameter) by its kept values and their positions."""
    weight = getattr(module, attr)
    shape = tuple(weight.shape)
    positions = positions.sort().values
    values = nn.Parameter(weight.detach().reshape(-1)[positions].clone())
    del module._parameters[attr]
    module.register_parameter(attr + names.MASK_VALUES_SUFFIX, values)
    module.register_buffer(attr + names.MASK_POSITIONS_SUFFIX, positions.to(torch.int32))
    setattr(module, SPARSE_ATTRS, {**getattr(module, SPARSE_ATTRS, {}), attr: shape})


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


def maskable(model: nn.Module) -> dict[str, tuple[nn.Module, str]]:
    """Weights a mask may cover, by PyTorch name ("blocks.0.conv.weight"): (module, attribute)."""
    out = {}
    for name, m in model.named_modules():
        for cls, attrs in MASKABLE.items():
            if isinstance(m, cls):
                for a in attrs:
                    if isinstance(getattr(m, a, None), nn.Parameter):
                        out[f"{name}.{a}" if name else a] = (m, a)
    return out


def dense_reasons(model: nn.Module, masked: set[str]) -> dict[str, str]:
    """Every parameter that keeps all its values, and why (for the exporter's report)."""
    eligible = maskable(model)
    why = {}
    for name, p in model.named_parameters():
        if name in masked or name.endswith(names.MASK_VALUES_SUFFIX):
            continue
        if name in eligible:
            why[name] = "its allocation keeps every weight (a small layer under ERK)"
        elif p.dim() < 2:
            why[name] = "a bias, norm scale or other vector: too small to pay for positions"
        else:
            owner = model.get_submodule(name.rpartition(".")[0]) if "." in name else model
            why[name] = (f"read by {type(owner).__name__} in a way a mask cannot reach "
                         "(a lookup table, a fused kernel or a free parameter)")
    return why


def layer_nnz(model: nn.Module, density: float, allocation: str = "erk") -> dict[str, int]:
    """Kept weights per maskable weight (name -> nnz; nnz == numel means it stays dense).
    The exporter and host-side sparse training (exporters/models/dst.py) both count with this."""
    if allocation not in ALLOCATIONS:
        raise ValueError(f"unknown mask allocation {allocation!r}; choose one of "
                         f"{sorted(ALLOCATIONS)}")
    weights = {n: getattr(m, a) for n, (m, a) in maskable(model).items()}
    densities = ALLOCATIONS[allocation](weights, density)
    return {n: max(1, min(w.numel(), round(densities[n] * w.numel())))
            for n, w in weights.items()}


def sparsify(model: nn.Module, density: float, allocation: str = "erk",
             init: str = "magnitude", seed: int = 0) -> tuple[nn.Module, tuple[MaskSpec, ...]]:
    """A copy of `model` whose maskable weights are masked to `density` overall."""
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
    for name, (module, attr) in layers.items():
        weight = getattr(module, attr)
        shape, nnz = tuple(weight.shape), counts[name]
        if nnz == math.prod(shape):
            continue  # stays dense
        mask_weight(module, attr, INITS[init](weight, nnz, generator))
        specs.append(MaskSpec(*_spec_names(name, shape, nnz)))
    if specs:
        model.register_forward_pre_hook(rebuild_dense_weights)
        model.register_forward_hook(drop_dense_weights)
    return model, tuple(specs)


def _spec_names(name: str, shape: tuple[int, ...], nnz: int) -> tuple:
    weight, values, positions = names.mask_tensor_names(name)
    return weight, shape, nnz, values, positions
