"""Issue 38: `export --density` says what masking costs and what BatchNorm RESET recovers
(exporters/models/maskfidelity.py)."""
from __future__ import annotations

import numpy as np
import torch

from exporters.models.maskfidelity import reset_running_statistics, masking_fidelity
from exporters.models.networks import build_network


def test_reset_sets_running_statistics_to_the_average_of_the_batch_statistics():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv1d(2, 3, 1), torch.nn.BatchNorm1d(3))
    X = torch.randn(64, 1, 2, 5) * 3 + 1  # [windows, items, channels, time]
    reset = reset_running_statistics(model, X)
    bn = reset[1]
    with torch.no_grad():
        acts = model[0](X.reshape(-1, 2, 5))  # 64 items: two batches of 32
        means = [acts[i:i + 32].mean(dim=(0, 2)) for i in (0, 32)]
    assert torch.allclose(bn.running_mean, sum(means) / 2, atol=1e-5)
    assert not bn.training and model[1].running_mean.abs().sum() == 0  # the original untouched


def test_masking_fidelity_reports_dense_masked_and_reset_accuracy():
    model, spec = build_network("imu_cnn", 7, 0.25)
    rng = np.random.default_rng(0)
    test = (rng.normal(size=(20, 200, 6)).astype(np.float32), rng.integers(0, 7, 20))
    population = (rng.normal(size=(40, 200, 6)).astype(np.float32), rng.integers(0, 7, 40))
    found = masking_fidelity(model, spec, [0.0] * 6, [1.0] * 6, test, population, (10,),
                             {"density": 0.1, "mask_allocation": "erk"})
    assert found["users"] == [10] and found["windows"] == 20 and found["reset_windows"] == 40
    for key in ("accuracy_dense", "accuracy_masked", "accuracy_masked_reset"):
        assert 0.0 <= found[key] <= 1.0


def test_the_export_skips_the_masking_check_when_asked_and_the_artifact_is_the_same(tmp_path):
    """ExportOptions(masking_check=False) (`export --no-masking-check`) writes no `masking`
    record and the same files ORT reads; the default measures it on the held-out users."""
    from edgetrain.manifest import Plan
    from exporters.export import ExportOptions
    from exporters.models.pretrain import PretrainConfig, export_named

    cfg = PretrainConfig(model="imu_cnn", width=0.25, epochs=1, dataset="watch")
    options = ExportOptions(plan=Plan(micro_batch=4), density=0.5)
    checked, skipped = (export_named(cfg, tmp_path / name, options.replace(masking_check=check),
                                     cache_dir=tmp_path / "c", show_progress=False)
                        for name, check in (("checked", True), ("skipped", False)))
    assert checked.provenance["masking"]["density"] == 0.5
    assert checked.provenance["masking"]["users"] == [cfg.holdout_user]
    assert "masking" not in skipped.provenance
    assert {r: f.sha256 for r, f in checked.files.items()} == {
        r: f.sha256 for r, f in skipped.files.items()}
