"""Layers rewritten before export into operators whose gradients onnxruntime-training 1.19.2
has. Each rewrite keeps the layer's parameter names and computes the same values.

  nn.GroupNorm -> reductions and elementwise ops (exported as InstanceNormalization otherwise)
  nn.Hardswish, nn.Hardsigmoid -> Clip and elementwise ops (HardSwish/HardSigmoid: no gradient)
  nn.AvgPool1d/2d with kernel == stride and no padding -> reshape and mean (ORT's
    AveragePoolGrad dies with a floating-point exception, SIGFPE, in 1.19.2)
  nn.ELU, nn.CELU, nn.SELU -> ReLU and Exp (Elu/Celu/Selu: no gradient)
  nn.PReLU -> ReLU, its `weight` kept (PRelu: no gradient)
  nn.Softplus, nn.Mish -> ReLU, Exp, Log (and Tanh) (Softplus: no gradient)
  nn.AdaptiveMaxPool1d/2d to size 1 -> one MaxPool over the whole sample (GlobalMaxPool: no
    gradient)
"""
from __future__ import annotations

import copy

import torch
from torch import nn

from exporters.models.norms import DecomposedGroupNorm


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


class ReluElu(nn.Module):
    """ELU, CELU and SELU from ReLU and Exp (ORT 1.19.2 has no gradient for Elu, Celu, Selu):
    scale * (relu(x) + alpha * (exp(-relu(-x) / width) - 1))."""

    def __init__(self, alpha: float, width: float = 1.0, scale: float = 1.0):
        super().__init__()
        self.alpha, self.width, self.scale = alpha, width, scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        negative = torch.exp(-torch.relu(-x) / self.width) - 1.0
        return self.scale * (torch.relu(x) + self.alpha * negative)


class ReluPRelu(nn.Module):
    """PReLU from ReLU (ORT 1.19.2 has no gradient for PRelu), keeping its `weight`: one
    slope, or one per channel (axis 1)."""

    def __init__(self, m: nn.PReLU):
        super().__init__()
        self.weight = m.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight
        if w.numel() > 1 and x.dim() > 2:  # per channel: [C] -> [C, 1, ...]
            w = w.reshape([-1] + [1] * (x.dim() - 2))
        return torch.relu(x) - w * torch.relu(-x)


class StableSoftplus(nn.Module):
    """Softplus (and Mish, x * tanh(softplus(x))) from ReLU, Exp and Log (ORT 1.19.2 has no
    gradient for Softplus): relu(bx)/b + log(1 + exp(-|bx|))/b, where torch switches to x
    above the threshold (the two differ there by under exp(-threshold))."""

    def __init__(self, beta: float = 1.0, mish: bool = False):
        super().__init__()
        self.beta, self.mish = beta, mish

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bx = self.beta * x
        magnitude = torch.relu(bx) + torch.relu(-bx)
        soft = (torch.relu(bx) + torch.log(1.0 + torch.exp(-magnitude))) / self.beta
        return x * torch.tanh(soft) if self.mish else soft


SELU_ALPHA, SELU_SCALE = 1.6732632423543772, 1.0507009873554805  # torch.nn.SELU's constants


class WholeMaxPool(nn.Module):
    """Adaptive max pooling to size 1 as one MaxPool over the whole (fixed) sample extent:
    ORT 1.19.2 has no gradient for GlobalMaxPool, and MaxPool's it has."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [B, C, *spatial]
        spatial = [int(n) for n in x.shape[2:]]  # fixed at export
        pool = nn.functional.max_pool1d if len(spatial) == 1 else nn.functional.max_pool2d
        return pool(x, kernel_size=spatial)


def _whole_max_pool(m: nn.Module) -> nn.Module:
    size = m.output_size if isinstance(m.output_size, (tuple, list)) else (m.output_size,)
    return WholeMaxPool() if all(s == 1 for s in size) and not m.return_indices else m


def _mean_pool(m: nn.Module) -> nn.Module:
    dims = 1 if isinstance(m, nn.AvgPool1d) else 2
    as_tuple = (lambda v: tuple(v) if isinstance(v, (tuple, list)) else (v,) * dims)
    kernel, stride, pad = as_tuple(m.kernel_size), as_tuple(m.stride), as_tuple(m.padding)
    if kernel != stride or any(pad) or m.ceil_mode:
        return m  # left as it is: the exporter refuses its AveragePool with the reason
    return MeanPool(kernel)


REWRITES = {nn.GroupNorm: DecomposedGroupNorm, nn.Hardswish: lambda m: ClipHardswish(),
            nn.Hardsigmoid: lambda m: ClipHardsigmoid(), nn.AvgPool1d: _mean_pool,
            nn.AvgPool2d: _mean_pool, nn.ELU: lambda m: ReluElu(m.alpha),
            nn.CELU: lambda m: ReluElu(m.alpha, width=m.alpha),
            nn.SELU: lambda m: ReluElu(SELU_ALPHA, scale=SELU_SCALE), nn.PReLU: ReluPRelu,
            nn.Softplus: lambda m: StableSoftplus(m.beta), nn.Mish: lambda m: StableSoftplus(mish=True),
            nn.AdaptiveMaxPool1d: _whole_max_pool, nn.AdaptiveMaxPool2d: _whole_max_pool}


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
