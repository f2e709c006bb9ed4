"""The built-in networks, with a width multiplier: the seed deck's image CNNs
(shared/seeds/002_*.txt, its layer tables) on GASF images of IMU windows, and two raw-IMU
networks (a 1-D CNN and a small transformer encoder) on the 6-channel windows themselves.

Each entry of NETWORKS builds a torch module and says what one input looks like. The CLI's
`--model` names are keys of this registry; any other nn.Module goes through
exporters.export.export_artifact directly.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn


def _ch(c: int, width: float) -> int:
    return max(8, int(round(c * width)))


class ConvBNReLU(nn.Sequential):
    def __init__(self, cin: int, cout: int, k: int, stride: int, groups: int = 1):
        super().__init__(nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False),
                         nn.BatchNorm2d(cout), nn.ReLU(inplace=False))


class DepthwiseSeparable(nn.Sequential):
    """3x3 depthwise conv (stride s) then 1x1 pointwise conv, each with BN and ReLU."""

    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.dw = ConvBNReLU(cin, cin, 3, stride, groups=cin)
        self.pw = ConvBNReLU(cin, cout, 1, 1)


class MobileNet(nn.Module):
    """Stem conv, a stack of depthwise-separable blocks, global average pool, classifier."""

    def __init__(self, stem_stride: int, blocks: list[tuple[int, int]], num_classes: int,
                 width: float):
        super().__init__()
        c = _ch(32, width)
        self.stem = ConvBNReLU(3, c, 3, stem_stride)
        layers = []
        for cout, stride in blocks:
            layers.append(DepthwiseSeparable(c, _ch(cout, width), stride))
            c = _ch(cout, width)
        self.blocks = nn.Sequential(*layers)
        self.classifier = nn.Linear(c, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [B, 3, H, W] -> [B, classes]
        x = self.blocks(self.stem(x))
        return self.classifier(x.mean(dim=(2, 3)))


class Bottleneck(nn.Module):
    """1x1 reduce, 3x3 (stride s), 1x1 expand, each with BN; residual add, then ReLU."""

    def __init__(self, cin: int, mid: int, cout: int, stride: int):
        super().__init__()
        self.reduce = ConvBNReLU(cin, mid, 1, 1)
        self.conv = ConvBNReLU(mid, mid, 3, stride)
        self.expand = nn.Sequential(nn.Conv2d(mid, cout, 1, 1, 0, bias=False), nn.BatchNorm2d(cout))
        self.shortcut = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride, 0, bias=False),
                                       nn.BatchNorm2d(cout))
                         if stride != 1 or cin != cout else nn.Identity())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.expand(self.conv(self.reduce(x))) + self.shortcut(x))


class ResNet50(nn.Module):
    """The deck's ResNet-50 (C1): 7x7/2 stem, 3x3/2 max pool, bottleneck stacks 3-4-6-3."""

    def __init__(self, num_classes: int, width: float):
        super().__init__()
        c = _ch(64, width)
        self.stem = ConvBNReLU(3, c, 7, 2)
        self.pool = nn.MaxPool2d(3, 2, 1)
        stages = []
        for mid, blocks, stride in [(64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)]:
            m, out = _ch(mid, width), _ch(4 * mid, width)
            layers = []
            for i in range(blocks):
                layers.append(Bottleneck(c, m, out, stride if i == 0 else 1))
                c = out
            stages.append(nn.Sequential(*layers))
        self.stages = nn.Sequential(*stages)
        self.classifier = nn.Linear(c, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [B, 3, 224, 224] -> [B, classes]
        x = self.stages(self.pool(self.stem(x)))
        return self.classifier(x.mean(dim=(2, 3)))


# (output channels, stride) of each depthwise-separable block, as in the deck's tables.
MOBILENET_V1_BLOCKS = [(64, 1), (128, 2), (128, 1), (256, 2), (256, 1), (512, 2),
                       (512, 1), (512, 1), (512, 1), (512, 1), (512, 1), (1024, 2), (1024, 1)]
PATCH_MOBILENET_BLOCKS = [(64, 1), (128, 2), (128, 1), (256, 2), (256, 1), (512, 2),
                          (1024, 1), (1024, 1)]


class ImuCnn(nn.Module):
    """1-D CNN over raw IMU windows [B, 6, T]: a stem and strided conv blocks (Conv1d, BN,
    ReLU), global average pooling over time, a linear classifier."""

    def __init__(self, num_classes: int, width: float):
        super().__init__()
        chans = [_ch(c, width) for c in (32, 64, 96, 128)]
        layers, cin = [], 6
        for k, (c, stride) in enumerate(zip(chans, (1, 2, 2, 2))):
            layers += [nn.Conv1d(cin, c, 7 if k == 0 else 5, stride, 3 if k == 0 else 2,
                                 bias=False), nn.BatchNorm1d(c), nn.ReLU()]
            cin = c
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Linear(cin, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [B, 6, T] -> [B, classes]
        return self.classifier(self.features(x).mean(dim=2))


class ImuTransformer(nn.Module):
    """Transformer encoder over time on raw IMU windows [B, T, 6]: non-overlapping segments of
    `segment` samples embedded as tokens, learned positions, 2 encoder layers (pre-norm), mean
    over tokens, a linear classifier."""

    def __init__(self, num_classes: int, width: float, window: int = 200, segment: int = 10):
        super().__init__()
        d = _ch(64, width)
        self.segment = segment
        self.embed = nn.Linear(6 * segment, d)
        self.position = nn.Parameter(torch.zeros(1, window // segment, d))
        layer = nn.TransformerEncoderLayer(d, 4 if d % 4 == 0 else 1, 2 * d, dropout=0.1,
                                           batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d)
        self.classifier = nn.Linear(d, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [B, T, 6] -> [B, classes]
        tokens = x.reshape(x.shape[0], -1, 6 * self.segment)  # [B, T / segment, 6 * segment]
        h = self.encoder(self.embed(tokens) + self.position)
        return self.classifier(self.norm(h).mean(dim=1))


@dataclass(frozen=True)
class NetworkSpec:
    build: Callable[[int, float], nn.Module]  # (num_classes, width) -> module
    image_size: int  # GASF inputs: the whole sample is 3 x image_size x image_size
    patch_size: int  # 0: the network sees whole samples
    default_width: float
    summary: str
    input: str = "gasf"  # "gasf": GASF images of IMU windows; "imu_window": the raw windows
    layout: str = "CHW"  # the sample's axes: "CHW" images, "CT" or "TC" raw windows

    def example_input(self, batch: int = 2, window: int = 200) -> torch.Tensor:
        """Zeros shaped like `batch` model inputs (what the exporter traces with)."""
        if self.input == "imu_window":
            return torch.zeros(batch, 6, window) if self.layout == "CT" else \
                torch.zeros(batch, window, 6)
        side = self.patch_size or self.image_size
        return torch.zeros(batch, 3, side, side)


NETWORKS: dict[str, NetworkSpec] = {
    "mobilenet_v1": NetworkSpec(
        build=lambda k, w: MobileNet(2, MOBILENET_V1_BLOCKS, k, w),
        image_size=224, patch_size=0, default_width=0.25,
        summary="MobileNetV1 on 224x224x3 (deck C5), 13 depthwise-separable blocks"),
    "resnet50": NetworkSpec(
        build=lambda k, w: ResNet50(k, w),
        image_size=224, patch_size=0, default_width=1.0,
        summary="ResNet-50 on 224x224x3 (deck C1), bottleneck stacks 3-4-6-3"),
    "patch_mobilenet": NetworkSpec(
        build=lambda k, w: MobileNet(1, PATCH_MOBILENET_BLOCKS, k, w),
        image_size=224, patch_size=32, default_width=0.25,
        summary="MobileNet on 32x32x3 patches of the 224x224 image (deck C6), 8 blocks"),
    "imu_cnn": NetworkSpec(
        build=lambda k, w: ImuCnn(k, w), image_size=0, patch_size=0, default_width=1.0,
        summary="1-D CNN on raw 6 x 200 IMU windows, 4 conv blocks", input="imu_window",
        layout="CT"),
    "imu_transformer": NetworkSpec(
        build=lambda k, w: ImuTransformer(k, w), image_size=0, patch_size=0, default_width=0.5,
        summary="transformer encoder over time on raw 200 x 6 IMU windows, 2 layers",
        input="imu_window", layout="TC"),
}


def build_network(name: str, num_classes: int, width: float | None = None
                  ) -> tuple[nn.Module, NetworkSpec]:
    if name not in NETWORKS:
        raise ValueError(f"unknown network {name!r}; choose one of {sorted(NETWORKS)}")
    spec = NETWORKS[name]
    w = spec.default_width if width is None else width
    if not 0 < w <= 4:
        raise ValueError(f"width multiplier {w} is out of range; use a value in (0, 4]")
    return spec.build(num_classes, w), spec
