"""Normalisation layers as the exporter rewrites them.

BatchNorm of any rank (1-D over [B, C] or [B, C, T], 2-D over [B, C, H, W]): frozen into a
fixed affine map for fine-tuning, or normalising by its batch's statistics and recording them
for RESET, or by its running statistics recording its input's moments for the exact layer-by-
layer estimate (exporters/passes/batchnormstats.py). GroupNorm: the legacy exporter writes it as
InstanceNormalization, for which onnxruntime-training 1.19.2 has no gradient, so it is
rewritten into reductions and elementwise ops (same parameters, same values).
"""
from __future__ import annotations

import copy

import torch
from torch import nn

BATCHNORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)


def channel_view(t: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """A per-channel vector [C] shaped to broadcast over x [B, C, ...]."""
    return t.view(1, -1, *([1] * (x.dim() - 2)))


class FrozenBatchNorm(nn.Module):
    """BatchNorm with fixed statistics: y = x * w / sqrt(var + eps) + (b - mean * scale).
    Same tensor names as the BatchNorm it replaces (weight, bias, running_mean, running_var)."""

    def __init__(self, bn: nn.Module):
        super().__init__()
        affine = bn.weight is not None
        self.weight = nn.Parameter(bn.weight.detach().clone()) if affine else None
        self.bias = nn.Parameter(bn.bias.detach().clone()) if affine else None
        self.register_buffer("running_mean", bn.running_mean.detach().clone())
        self.register_buffer("running_var", bn.running_var.detach().clone())
        self.eps = bn.eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [B, C, ...]
        scale = 1.0 / torch.sqrt(self.running_var + self.eps)
        if self.weight is not None:
            scale = self.weight * scale
        shift = -self.running_mean * scale
        if self.bias is not None:
            shift = self.bias + shift
        return x * channel_view(scale, x) + channel_view(shift, x)


def has_running_stats(m: nn.Module) -> bool:
    return isinstance(m, BATCHNORMS) and m.running_mean is not None


def freeze_batchnorm_layers(model: nn.Module) -> nn.Module:
    """A copy of `model` with every BatchNorm that keeps running statistics replaced by
    FrozenBatchNorm (same names)."""
    model = copy.deepcopy(model)
    for name, module in list(model.named_modules()):
        if has_running_stats(module):
            parent_name, _, child = name.rpartition(".")
            parent = model.get_submodule(parent_name) if parent_name else model
            setattr(parent, child, FrozenBatchNorm(module))
    return model


def batchnorm_layers(model: nn.Module) -> list[str]:
    """Names of the layers RESET re-estimates: BatchNorms (frozen or not) with running stats."""
    return [n for n, m in model.named_modules()
            if has_running_stats(m) or isinstance(m, FrozenBatchNorm)]


class BatchStatsNorm(nn.Module):
    """BatchNorm that normalises by its batch's statistics and records them (no running ones).

    Same parameter names as the BatchNorm it replaces (weight, bias), so the exported graph
    reads the artifact's tensors. Statistics are over every axis but the channels (axis 1)."""

    def __init__(self, bn: nn.Module, name: str, record: list):
        super().__init__()
        self.weight, self.bias, self.eps = bn.weight, bn.bias, bn.eps
        self.name, self.record = name, record

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [B, C, ...]
        dims = (0, *range(2, x.dim()))
        mean = x.mean(dim=dims)
        var = x.var(dim=dims, unbiased=False)
        n = x.numel() // x.shape[1]
        self.record.append((self.name, mean, var * n / max(n - 1, 1)))
        y = (x - channel_view(mean, x)) / torch.sqrt(channel_view(var, x) + self.eps)
        if self.weight is not None:
            y = y * channel_view(self.weight, x) + channel_view(self.bias, x)
        return y


class MomentsNorm(nn.Module):
    """BatchNorm normalising by its running statistics (as in eval mode) that records, per
    channel, the mean and the mean square of its input minus the running mean; `elements`
    is how many elements per channel one sample gives them (set by a forward pass).

    Same tensor names as the layer it replaces (weight, bias, running_mean, running_var), so
    the exported graph reads the artifact's tensors, and the runtime, having set the layers
    before it, gets this layer's exact statistics over any number of batches (the shift keeps
    the variance's precision in float32)."""

    def __init__(self, bn: nn.Module, name: str, record: list):
        super().__init__()
        self.weight, self.bias, self.eps = bn.weight, bn.bias, bn.eps
        self.register_buffer("running_mean", bn.running_mean)
        self.register_buffer("running_var", bn.running_var)
        self.name, self.record = name, record

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [B, C, ...]
        dims = (0, *range(2, x.dim()))
        d = x - channel_view(self.running_mean, x)
        if not torch.jit.is_tracing():  # per channel of one sample: its positions
            self.elements = int(x[0, 0].numel())
        self.record.append((self.name, d.mean(dim=dims), (d * d).mean(dim=dims)))
        y = d / torch.sqrt(channel_view(self.running_var, x) + self.eps)
        if self.weight is not None:
            y = y * channel_view(self.weight, x) + channel_view(self.bias, x)
        return y


class DecomposedGroupNorm(nn.Module):
    """nn.GroupNorm from reductions and elementwise ops (same weight and bias names)."""

    def __init__(self, gn: nn.GroupNorm):
        super().__init__()
        self.num_groups, self.eps = gn.num_groups, gn.eps
        self.weight, self.bias = gn.weight, gn.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [B, C, ...]
        g = x.reshape(x.shape[0], self.num_groups, -1)
        mean = g.mean(dim=2, keepdim=True)
        var = ((g - mean) ** 2).mean(dim=2, keepdim=True)
        y = ((g - mean) / torch.sqrt(var + self.eps)).reshape(x.shape)
        if self.weight is not None:
            y = y * channel_view(self.weight, x) + channel_view(self.bias, x)
        return y
