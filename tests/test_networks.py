"""The named networks follow the seed deck's layer tables (shared/seeds/002_*.txt)."""
from __future__ import annotations

import pytest
import torch

from exporters.models.networks import NETWORKS, build_network

# (H, W, C) after the stem and after every depthwise-separable block, at width 1.
MOBILENET_V1 = [(112, 112, 32), (112, 112, 64), (56, 56, 128), (56, 56, 128), (28, 28, 256),
                (28, 28, 256), (14, 14, 512)] + [(14, 14, 512)] * 5 + [(7, 7, 1024), (7, 7, 1024)]
PATCH_MOBILENET = [(32, 32, 32), (32, 32, 64), (16, 16, 128), (16, 16, 128), (8, 8, 256),
                   (8, 8, 256), (4, 4, 512), (4, 4, 1024), (4, 4, 1024)]


RESNET50 = [(112, 112, 64), (56, 56, 64), (56, 56, 256), (28, 28, 512), (14, 14, 1024),
            (7, 7, 2048)]


def feature_shapes(name: str) -> list[tuple[int, int, int]]:
    model, spec = build_network(name, num_classes=8, width=1.0)
    size = spec.patch_size or spec.image_size
    shapes = []
    stages = ([model.stem, model.pool, *model.stages] if name == "resnet50"
              else [model.stem, *model.blocks])
    hooks = [m.register_forward_hook(lambda _m, _i, o: shapes.append((o.shape[2], o.shape[3],
                                                                       o.shape[1])))
             for m in stages]
    with torch.no_grad():
        logits = model.eval()(torch.zeros(1, 3, size, size))
    for h in hooks:
        h.remove()
    assert logits.shape == (1, 8)  # the deck's 8 classes
    return shapes


@pytest.mark.parametrize("name, table", [("mobilenet_v1", MOBILENET_V1),
                                         ("patch_mobilenet", PATCH_MOBILENET),
                                         ("resnet50", RESNET50)])
def test_layers_match_the_deck(name, table):
    assert feature_shapes(name) == table


def test_resnet50_has_the_deck_parameter_count():
    model, _ = build_network("resnet50", 1000, width=1.0)
    n = sum(p.numel() for p in model.parameters())
    assert n == 25_557_032  # torchvision's resnet50 with 1000 classes


def test_width_multiplier_scales_channels():
    model, _ = build_network("patch_mobilenet", 7, width=0.25)
    assert model.classifier.in_features == 256 and model.stem[0].out_channels == 8


def test_registry_keys_and_unknown_key():
    for name in NETWORKS:
        build_network(name, 7)
    with pytest.raises(ValueError, match="unknown network 'resnet9000'"):
        build_network("resnet9000", 7)
