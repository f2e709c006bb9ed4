"""Frozen GRU/LSTM layers above trained ones: ORT 1.19.2's GRUGrad/LSTMGrad crashed the
process (SIGSEGV) when their weight gradients were not wanted; exporters/passes/recurrentgrads.py
names those outputs. One step's loss and gradients equal torch's for partly frozen cells."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch

from conftest import device_gradients
from edgetrain.manifest import Plan
from exporters.export import export_artifact
from exporters.passes.recurrentgrads import RECURRENT_GRADS


class TwoLayers(torch.nn.Module):
    def __init__(self, cell):
        super().__init__()
        self.rnn = cell(6, 8, num_layers=2, batch_first=True)
        self.head = torch.nn.Linear(8, 3)

    def forward(self, x):  # [B, T, 6]
        return self.head(self.rnn(x)[0][:, -1])


@pytest.mark.parametrize("cell", [torch.nn.GRU, torch.nn.LSTM])
@pytest.mark.parametrize("trained", [
    ["rnn.weight_ih_l0", "rnn.weight_hh_l0"],  # the upper layer frozen above a trained one
    ["rnn.weight_hh_l1", "rnn.bias_ih_l0"],    # parts of both layers
])
def test_partly_frozen_recurrent_cells_train_as_torch(tmp_path, cell, trained):
    torch.manual_seed(0)
    model = TwoLayers(cell)
    trainable = trained + ["head.weight", "head.bias"]
    art = tmp_path / "art"
    export_artifact(model, torch.zeros(2, 10, 6), art, classes=["a", "b", "c"],
                    plan=Plan(micro_batch=4), trainable=trainable, layout="TF")
    grads = [n for n in onnx.load(str(art / "training_model.onnx")).graph.node
             if n.op_type in RECURRENT_GRADS]
    assert grads and all(n.output[1] and n.output[2] for n in grads)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 10, 6)).astype(np.float32)
    y = rng.integers(0, 3, 4)
    out = device_gradients(art, x, y)
    for name, p in model.named_parameters():
        p.requires_grad_(name in trainable)
    loss = torch.nn.functional.cross_entropy(model(torch.from_numpy(x)), torch.from_numpy(y))
    loss.backward()
    assert out["loss"] == pytest.approx(loss.item(), rel=1e-4, abs=1e-5)
    params = dict(model.named_parameters())
    assert set(out["grads"]) == set(trainable)
    for name, g in out["grads"].items():
        ref = params[name].grad.numpy()
        assert float(np.abs(np.array(g) - ref).max()) <= 1e-6 + 1e-3 * float(np.abs(ref).max())


def test_the_export_dry_run_turns_a_native_crash_into_an_error(tmp_path, monkeypatch):
    """Without the fix the step kills ORT's process (SIGSEGV): the export's dry run, in a
    child process, fails the export with the signal named, and nothing is written."""
    import exporters.export.build
    from exporters.export.dryrun import DryRunError
    from exporters.passes import recurrentgrads

    without = tuple(p for p in exporters.export.build.ARTIFACT_PASSES
                    if p is not recurrentgrads.PASS)
    monkeypatch.setattr(exporters.export.build, "ARTIFACT_PASSES", without)
    torch.manual_seed(0)
    with pytest.raises(DryRunError, match="SIGSEGV.*Nothing was written"):
        export_artifact(TwoLayers(torch.nn.GRU), torch.zeros(2, 10, 6), tmp_path / "art",
                        classes=["a", "b", "c"], plan=Plan(micro_batch=4), layout="TF",
                        trainable=["rnn.weight_ih_l0", "rnn.weight_hh_l0", "head.weight"])
    assert list(tmp_path.iterdir()) == []
