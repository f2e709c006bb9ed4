"""Kept-weights gradients of masked pointwise layers: torch's gradients, less memory."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from torch import nn

from conftest import cli, device_gradients
from edgetrain.manifest import Plan
from exporters.export import export_artifact
from exporters.plans.sparse import sparsify
from exporters.passes.sparsegrad import MAX_PIECES, PIECE_SHARE, pieces_for

WIDE = 256  # a pointwise layer of WIDE x WIDE weights over 2 x 2 pixels


def net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, WIDE, 3, stride=4, padding=1), nn.ReLU(),
                         nn.Conv2d(WIDE, WIDE, 1), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(WIDE, 4))


def export(folder, weight_grad: str, micro_batch: int = 2):
    return export_artifact(net(), torch.zeros(micro_batch, 3, 8, 8), folder,
                           classes=list("abcd"),
                           plan=Plan(micro_batch=micro_batch, weight_grad=weight_grad),
                           density=0.1, mask_allocation="uniform")


def test_pieces_keep_each_gather_within_its_share():
    # 2 gathers x 1 item x 16 pixels x 50,000 kept, against a 1024 x 1024 dense dW
    pieces = pieces_for(1, 16, 50_000, 1024, 1024)
    assert pieces == -(-2 * 16 * 50_000 * PIECE_SHARE // (1024 * 1024)) == 7
    assert 2 * 16 * -(-50_000 // pieces) * PIECE_SHARE <= 1024 * 1024 * 1.01
    assert pieces_for(1, 1, 100, 1024, 1024) == 1
    assert pieces_for(64, 49, 50_000, 1024, 1024) is None  # past MAX_PIECES: left dense
    assert pieces_for(1, 1, 3, 4, 4) <= 3  # never more pieces than kept weights
    assert MAX_PIECES >= 1


def test_kept_gradients_equal_torch_and_the_3x3_layer_stays(tmp_path):
    m = export(tmp_path / "a", "kept")
    # the 1x1 layer is rewritten; the strided 3x3 one and the Linear are left to ORT
    assert m.provenance["passes"]["masked_pointwise_grads"] == 1
    assert m.plan.weight_grad == "kept" and m.predicted["complete"]
    model, _ = sparsify(net(), 0.1, "uniform")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 8, 8)).astype(np.float32)
    y = np.array([0, 3])
    nn.functional.cross_entropy(model(torch.from_numpy(x)), torch.from_numpy(y)).backward()
    out = device_gradients(tmp_path / "a", x, y)["grads"]
    for name, p in model.named_parameters():
        np.testing.assert_allclose(out[name], p.grad.numpy(), rtol=1e-4, atol=1e-7,
                                   err_msg=name)


def test_neither_variant_holds_the_dense_w_and_dw_at_once(tmp_path):
    """Measured by ORT's allocator, as predicted: the kept gradient (sparsegrad) never makes
    the dense 256 x 256 dW, and the dense variant makes it only once the rebuilt W is gone
    (exporters/passes/pointwisegrad.py), so neither holds W and dW at once: 2 x 256 x 256 x 4 bytes
    (shapes x itemsize); ORT's ConvGrad did, and needed more. (The run's end-of-cycle
    inference check, which rebuilds dense weights in space training freed, is not what this
    compares.)"""
    for kind in ("dense", "kept"):
        m = export(tmp_path / kind, kind)
        p = cli("measure", tmp_path / kind, "--batch", "2", "--json")
        assert p.returncode == 0, p.stderr
        acts = json.loads(p.stdout)["breakdown"]["activations"]
        assert acts == pytest.approx(m.predicted["breakdown"]["activations"], rel=0.02)
        assert acts < 2 * WIDE * WIDE * 4, kind


def test_unknown_weight_grad_is_refused(tmp_path):
    with pytest.raises(ValueError, match="weight gradient 'sparse' is not one of"):
        export(tmp_path / "x", "sparse")
    assert not (tmp_path / "x").exists()
