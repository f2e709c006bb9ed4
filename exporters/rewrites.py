"""Layers rewritten before export into operators whose gradients onnxruntime-training 1.19.2
has. Each rewrite keeps the layer's parameter names and computes the same values.

  nn.GroupNorm -> reductions and elementwise ops (exported as InstanceNormalization otherwise)
  nn.Hardswish, nn.Hardsigmoid -> Clip and elementwise ops (HardSwish/HardSigmoid: no gradient)
  nn.AvgPool1d/2d with kernel == stride and no padding -> reshape and mean (ORT's
    AveragePoolGrad dies with a floating-point exception, SIGFPE, in 1.19.2)
"""
from __future__ import annotations

import copy

import torch
from torch import nn

from exporters.norms import DecomposedGroupNorm


class ClipHardswish(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.clamp(x + 3.0, 0.0, 6.0) / 6.0


class ClipHardsigmoid(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.clamp(x + 3.0, 0.0, 6.0) / 6.0


class MeanPool(nn.Module):
    """Average pooling with kernel == stride and no padding, as a reshape and a mean over the
    last `dims` axes (a trailing remainder is dropped, as the pooling layer drops it)."""

    def __init__(self, kernel: tuple[int, ...]):
        super().__init__()
        self.kernel = kernel

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [B, C, *spatial]
        spatial = x.shape[2:]
        outs = [n // k for n, k in zip(spatial, self.kernel)]
        if any(n % k for n, k in zip(spatial, self.kernel)):  # sample sizes are fixed
            x = x[(...,) + tuple(slice(0, o * k) for o, k in zip(outs, self.kernel))]
        shape = [x.shape[0], x.shape[1]]
        for o, k in zip(outs, self.kernel):
            shape += [o, k]
        axes = tuple(range(3, 3 + 2 * len(outs), 2))
        return x.reshape(shape).mean(dim=axes)


def _mean_pool(m: nn.Module) -> nn.Module:
    dims = 1 if isinstance(m, nn.AvgPool1d) else 2
    as_tuple = (lambda v: tuple(v) if isinstance(v, (tuple, list)) else (v,) * dims)
    kernel, stride, pad = as_tuple(m.kernel_size), as_tuple(m.stride), as_tuple(m.padding)
    if kernel != stride or any(pad) or m.ceil_mode:
        return m  # left as it is: the exporter refuses its AveragePool with the reason
    return MeanPool(kernel)


REWRITES = {nn.GroupNorm: DecomposedGroupNorm, nn.Hardswish: lambda m: ClipHardswish(),
            nn.Hardsigmoid: lambda m: ClipHardsigmoid(), nn.AvgPool1d: _mean_pool,
            nn.AvgPool2d: _mean_pool}


def rewrite_for_training(model: nn.Module) -> nn.Module:
    """A copy of `model` with every layer in REWRITES replaced (or `model` itself if none)."""
    if not any(type(m) in REWRITES for m in model.modules()):
        return model
    model = copy.deepcopy(model)
    for name, module in list(model.named_modules()):
        if type(module) in REWRITES:
            parent_name, _, child = name.rpartition(".")
            parent = model.get_submodule(parent_name) if parent_name else model
            setattr(parent, child, REWRITES[type(module)](module))
    return model
