"""Bring your own model: a matrix of small wearable models (tests/wearable_models.py, one per
layer family) x the promises edgetrain makes for any model: it exports through the Python API,
one ORT step equals torch's, the peak is measured exactly and repeatably, the prediction is
within 5% or says it cannot predict, `sqrt` never raises the activations, density 0.1 masks
every eligible weight, personalisation fits a budget equal to the measured peak and fails
cleanly 64 KiB below it, and the inference model agrees with the runtime's eval."""
from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from conftest import cli, device_gradients
from edgetrain.manifest import Plan
from exporters.export import export_artifact
from exporters.models.norms import freeze_batchnorm_layers
from exporters.export.operators import UnsupportedOperatorError
from exporters.plans.sparse import maskable
from wearable_models import CASES, CLASSES

BATCH = 4
VARIANTS = {"none": {}, "sqrt": {"recompute": "sqrt"},
            "sparse": {"density": 0.1, "mask_allocation": "uniform"}}


def measure(art) -> dict:
    p = cli("measure", art, "--batch", BATCH, "--steps", "1", "--json")
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


# The default tier runs the matrix on one model of each kind (1-D and 2-D convolutions,
# residual, MLP, recurrent, attention); these run in the end-to-end tier (CI runs both), to
# keep `make test` under 10 minutes on 2 cores.
SLOW_CASES = {"moe_transformer", "mha_embedding", "transformer_encoder", "cnn1d_activations",
              "norms_activations", "lstm", "tcn_same_padding"}


@pytest.fixture(scope="module", params=[
    pytest.param(n, marks=pytest.mark.slow) if n in SLOW_CASES else n for n in sorted(CASES)])
def case(request, tmp_path_factory):
    name, c = request.param, CASES[request.param]
    torch.manual_seed(0)
    model = c.build()
    root = tmp_path_factory.mktemp(name)
    arts, manifests = {}, {}
    for variant, options in VARIANTS.items():
        arts[variant] = root / variant
        manifests[variant] = export_artifact(
            model, torch.zeros(2, *c.sample_shape), arts[variant],
            classes=[str(k) for k in range(CLASSES)], plan=Plan(micro_batch=BATCH), lr=1e-2,
            layout=c.layout, freeze_batchnorm=c.freeze_batchnorm, **options)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((24, *c.sample_shape)).astype(np.float32)
    y = rng.integers(0, CLASSES, 24)
    np.savez(root / "train.npz", x=x, y=y)
    np.savez(root / "test.npz", x=x[:12], y=y[:12])
    return SimpleNamespace(name=name, spec=c, model=model, arts=arts, manifests=manifests,
                           root=root, x=x, y=y, measured=[measure(arts["none"]) for _ in range(2)],
                           sqrt=measure(arts["sqrt"]))


def test_every_variant_manifest_round_trips_in_memory_and_through_json(case):
    from edgetrain.manifest import Manifest, load_manifest

    for variant, art in case.arts.items():
        m = load_manifest(art)
        assert m == case.manifests[variant]
        assert Manifest.from_dict(m.to_dict()) == m, variant
        assert Manifest.from_dict(json.loads(json.dumps(m.to_dict()))) == m, variant


def test_one_ort_step_equals_torch(case):
    """Loss and every gradient of one training step at the plan's batch."""
    x, y = case.x[:BATCH], case.y[:BATCH]
    out = device_gradients(case.arts['none'], x, y)
    model = freeze_batchnorm_layers(case.model) if case.spec.freeze_batchnorm else case.model
    model.train().zero_grad()
    loss = torch.nn.functional.cross_entropy(model(torch.from_numpy(x)), torch.from_numpy(y))
    loss.backward()
    assert out["loss"] == pytest.approx(loss.item(), rel=1e-4, abs=1e-5)
    params = dict(model.named_parameters())
    assert set(out["grads"]) == set(params)
    for name, g in out["grads"].items():
        ref = params[name].grad.numpy()  # a bias before BatchNorm has a zero gradient
        tolerance = 1e-6 + 1e-3 * float(np.abs(ref).max())
        assert float(np.abs(np.array(g) - ref).max()) <= tolerance, name


def test_measured_peak_is_exact_repeatable_and_broken_down(case):
    a, b = case.measured
    assert isinstance(a["peak_bytes"], int) and a["peak_bytes"] == b["peak_bytes"]
    assert sum(a["breakdown"].values()) == a["peak_bytes"]
    assert a["torch_loaded"] is False


def test_prediction_within_5_percent_or_says_it_cannot(case):
    d = case.measured[0]
    if case.spec.predictable:
        assert d["predicted_complete"], d["prediction_caveat"]
        err = (d["predicted_peak_bytes"] - d["peak_bytes"]) / d["peak_bytes"]
        assert abs(err) <= 0.05, err
    else:
        assert not d["predicted_complete"]
        assert d["prediction_caveat"].startswith("cannot predict")


def test_sqrt_never_raises_the_activations(case):
    """Measured. A plan is kept only where the predictor puts it lower than no plan; a model
    left without checkpoints (the predictor makes no claim, or the plan saves too little)
    says why."""
    assert case.sqrt["breakdown"]["activations"] <= case.measured[0]["breakdown"]["activations"]
    plan = case.manifests["sqrt"].plan
    if not case.measured[0]["predicted_complete"] and not plan.checkpoints:
        assert plan.recompute_note.startswith("no checkpoints"), plan.recompute_note


def test_density_masks_every_eligible_weight_and_cuts_trainable_state(case):
    sparse, dense = case.manifests["sparse"], case.manifests["none"]
    assert {m.weight for m in sparse.masks} == set(maskable(case.model))
    assert sparse.trainable_bytes < dense.trainable_bytes
    kept = {m.weight for m in sparse.masks}
    assert set(sparse.dense_weights) == {n for n, _ in case.model.named_parameters()} - kept


def test_personalise_fits_the_measured_peak_and_fails_cleanly_below(case):
    peak = case.measured[0]["peak_bytes"]
    run = ["personalise", case.arts["none"], "--data", case.root / "train.npz",
           "--test", case.root / "test.npz", "--epochs", "1", "--json"]
    ok = cli(*run, "--budget", peak, "--out", case.root / "ok")
    assert ok.returncode == 0, ok.stderr
    r = json.loads(ok.stdout)
    assert r["inference_agreement"] == 1.0 and r["torch_loaded"] is False
    below = max(1, peak - 64 * 1024)  # a budget of 0 or less is a usage error (exit 2)
    bad = cli(*run, "--budget", below, "--out", case.root / "bad")
    assert bad.returncode == 3, bad.stderr
    assert "Traceback" not in bad.stderr and "budget" in bad.stderr
    assert not (case.root / "bad" / "checkpoint").exists()


class InstanceNormNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.norm = torch.nn.Conv1d(6, 8, 3), torch.nn.InstanceNorm1d(8, affine=True)
        self.head = torch.nn.Linear(8, CLASSES)

    def forward(self, x):
        return self.head(self.norm(self.conv(x)).mean(-1))


class FunctionalHardswish(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.head = torch.nn.Linear(6, CLASSES)

    def forward(self, x):
        return self.head(torch.nn.functional.hardswish(x).mean(-1))


class PaddedAvgPool(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.pool, self.head = torch.nn.AvgPool1d(3, stride=1, padding=1), torch.nn.Linear(6, CLASSES)

    def forward(self, x):
        return self.head(self.pool(x).mean(-1))


class Head(torch.nn.Module):
    """A trained 1x1 convolution, then `body` over [B, 6, 16] (so that its gradient is
    needed), then a linear head over the mean of its [B, 6, T] output."""

    def __init__(self, body, time_major=False):
        super().__init__()
        self.conv, self.body, self.time_major = torch.nn.Conv1d(6, 6, 1), body, time_major
        self.head = torch.nn.Linear(6, CLASSES)

    def forward(self, x):
        x = self.conv(x)
        if self.time_major:  # a recurrent cell: [B, T, 6] in, its outputs' first 6 features
            return self.head(self.body(x.transpose(1, 2))[0][..., :6].mean(1))
        return self.head(self.body(x).mean(-1))


class FunctionalElu(Head):
    def __init__(self):
        super().__init__(torch.nn.Identity())

    def forward(self, x):
        return self.head(torch.nn.functional.elu(self.conv(x)).mean(-1))


@pytest.mark.parametrize("model, module, operator", [
    (InstanceNormNet, "norm", "InstanceNormalization"),
    (FunctionalHardswish, "(top level)", "HardSwish"),
    (PaddedAvgPool, "pool", "AveragePool"),
    (FunctionalElu, "(top level)", "the nn.ELU module"),  # the advice for the functional form
    # these two ORT builds, but cannot load: no ResizeGrad kernel; LSTMTraining forward only
    (lambda: Head(torch.nn.Upsample(scale_factor=2)), "body", "ResizeGrad"),
    (lambda: Head(torch.nn.LSTM(6, 8, batch_first=True, bidirectional=True), True), "body",
     "bidirectional LSTM"),
])
def test_unsupported_layers_are_refused_before_any_file(tmp_path, model, module, operator):
    out = tmp_path / "refused"
    with pytest.raises(UnsupportedOperatorError) as e:
        export_artifact(model(), torch.zeros(2, 6, 16), out, classes=["a", "b", "c"])
    assert f"module {module!r}" in str(e.value) and operator in str(e.value)
    assert "Nothing was written" in str(e.value)
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_a_model_with_nothing_to_train_is_refused(tmp_path):
    with pytest.raises(ValueError, match="nothing to train"):
        export_artifact(torch.nn.AdaptiveAvgPool1d(3), torch.zeros(2, 6, 16), tmp_path / "o",
                        classes=["a", "b", "c"])
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
@pytest.mark.parametrize("case", ["cnn1d_bn", "moe_transformer", "transformer_encoder"],
                         indirect=True)
def test_a_run_that_exits_0_never_peaks_above_its_budget(case):
    """measure --budget B for B just under, at and just over the measured peak: the peak
    itself fits; below it a run either fails cleanly (exit 3) or trains within B. (Below the
    memory-pattern block ORT falls back to allocating tensor by tensor, which on graphs with
    run-time shapes can need less than the block: measured, a 3-layer encoder trains in
    313,088 bytes under a cap, 347,904 uncapped.)"""
    peak = case.measured[0]["peak_bytes"]
    for budget in (peak - 1, peak - 4096, peak, peak + 4096):
        p = cli("measure", case.arts["none"], "--batch", BATCH, "--steps", "1",
                "--budget", budget, "--json")
        assert "Traceback" not in p.stderr, p.stderr
        if budget >= peak:
            assert p.returncode == 0, p.stderr
        assert p.returncode in (0, 3), p.stderr
        if p.returncode == 0:
            assert json.loads(p.stdout)["peak_bytes"] <= budget


@pytest.mark.slow
@pytest.mark.parametrize("case", ["transformer_encoder"], indirect=True)
def test_fit_without_a_prediction_ends_in_at_most_16_capped_runs(case):
    """On a model the predictor cannot size."""
    budget = 6 * case.measured[0]["peak_bytes"]
    p = cli("fit", case.arts["none"], "--budget", budget, "--json")
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    assert r["max_batch"] > BATCH and r["peak_bytes"] <= budget and r["runs"] <= 16
