"""Probe networks for the recompute guards (bench/recompute.py): wearable models that are not
built in, exported through the Python API as a user's own model would be. Made-up weights:
recompute's bytes and FLOPs do not depend on them.

  tcn_probe      a temporal convolutional network on raw IMU windows: a pointwise stem, six
                 residual blocks of two dilated 1-D convolutions (dilation 1..32) with
                 BatchNorm and ReLU, global average pooling; [6, 256] samples
  encoder_probe  a transformer encoder on raw IMU windows: a linear embedding to 64, four
                 encoder layers (4 heads, feed-forward 128), mean over time; [128, 6] samples
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

CLASSES = 6


class TemporalBlock(nn.Module):
    def __init__(self, c: int, dilation: int):
        super().__init__()
        self.c1 = nn.Conv1d(c, c, 3, padding=dilation, dilation=dilation)
        self.c2 = nn.Conv1d(c, c, 3, padding=dilation, dilation=dilation)
        self.b1, self.b2 = nn.BatchNorm1d(c), nn.BatchNorm1d(c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x + self.b2(self.c2(torch.relu(self.b1(self.c1(x))))))


class TimeMean(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.mean(1)


def tcn() -> nn.Module:
    return nn.Sequential(nn.Conv1d(6, 64, 1), *[TemporalBlock(64, 2 ** k) for k in range(6)],
                         nn.AdaptiveAvgPool1d(1), nn.Flatten(), nn.Linear(64, CLASSES))


def encoder() -> nn.Module:
    layer = nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, batch_first=True)
    return nn.Sequential(nn.Linear(6, 64), nn.TransformerEncoder(
        layer, 4, enable_nested_tensor=False), TimeMean(), nn.Linear(64, CLASSES))


@dataclass(frozen=True)
class Probe:
    build: Callable[[], nn.Module]
    sample_shape: tuple[int, ...]
    layout: str
    freeze_batchnorm: bool


PROBES = {"tcn_probe": Probe(tcn, (6, 256), "CT", True),
          "encoder_probe": Probe(encoder, (128, 6), "TF", False)}


def export_probe(name: str, out, planner: str, micro_batch: int) -> dict:
    """Export probe `name` with recompute `planner`; returns its manifest as a dict."""
    from edgetrain.manifest import Plan
    from exporters.export import export_artifact

    probe = PROBES[name]
    torch.manual_seed(0)
    m = export_artifact(probe.build(), torch.zeros(2, *probe.sample_shape), out,
                        classes=[str(k) for k in range(CLASSES)],
                        plan=Plan(micro_batch=micro_batch), recompute=planner,
                        layout=probe.layout, freeze_batchnorm=probe.freeze_batchnorm)
    return m.to_dict()
