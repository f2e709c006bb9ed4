"""Host-side dynamic sparse training (exporters/models/dst.py) and the held-out population split."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from edgetrain import data, datasets
from edgetrain.masks import UPDATERS
from exporters.models.dst import DstConfig, TorchMasks
from exporters.plans.sparse import dense_weight, layer_nnz, sparsify


def net(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(),
                         nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 5))


def train_steps(model: nn.Module, masks: TorchMasks, steps: int, method: str | None,
                fraction: float = 0.3) -> torch.optim.Optimizer:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    rng = np.random.default_rng(0)
    g = torch.Generator().manual_seed(0)
    for _ in range(steps):
        x, y = torch.randn(8, 3, 8, 8, generator=g), torch.randint(0, 5, (8,), generator=g)
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        masks.apply(opt)
        if method:
            masks.update(method, fraction, rng, opt)
    return opt


def test_masks_keep_the_exporters_counts_and_start_at_the_largest_weights():
    model = net()
    masks = TorchMasks(model, 0.2, "erk")
    counts = layer_nnz(model, 0.2, "erk")
    assert masks.nnz() == {n: c for n, c in counts.items() if n in masks.layers}
    for name, layer in masks.layers.items():
        w = layer.detach().abs().reshape(-1)
        kept = masks.masks[name]
        assert w[kept].min() >= w[~kept].max()


@pytest.mark.parametrize("method", sorted(UPDATERS))
def test_weights_and_moments_stay_zero_off_the_mask_through_updates(method):
    model = net()
    masks = TorchMasks(model, 0.2, "erk")
    before = {n: m.clone() for n, m in masks.masks.items()}
    opt = train_steps(model, masks, 5, method)
    assert masks.nnz() == {n: int(m.sum()) for n, m in before.items()}  # density constant
    assert any(not torch.equal(before[n], masks.masks[n]) for n in before)  # masks moved
    for name, layer in masks.layers.items():
        off = ~masks.masks[name].view_as(layer)
        assert torch.all(layer[off] == 0)
        for key in ("exp_avg", "exp_avg_sq"):
            assert torch.all(opt.state[layer][key][off] == 0)


def test_regrown_weights_start_at_zero_and_rigl_grows_at_the_largest_gradient():
    model = net()
    masks = TorchMasks(model, 0.2, "erk")
    x, y = torch.randn(8, 3, 8, 8), torch.randint(0, 5, (8,))
    nn.functional.cross_entropy(model(x), y).backward()
    name = next(iter(masks.layers))
    layer = masks.layers[name]
    old = masks.masks[name].clone()
    grad = layer.grad.reshape(-1).abs().clone()
    masks.update("rigl", 0.5, np.random.default_rng(0))
    grown = masks.masks[name] & ~old
    assert grown.sum() > 0
    assert torch.all(layer.reshape(-1)[grown] == 0)
    not_kept = ~masks.masks[name] & ~old
    assert grad[grown].min() >= grad[not_kept].max()


def test_update_before_backward_is_refused_for_rigl():
    masks = TorchMasks(net(), 0.2, "erk")
    with pytest.raises(ValueError, match="dense gradient"):
        masks.update("rigl", 0.3, np.random.default_rng(0))


def test_export_keeps_exactly_the_trained_weights():
    """Magnitude init at export keeps every nonzero weight: the exported sparse layers compute
    exactly what the masked model trained to (a kept weight that is exactly zero, e.g. after a
    dead input channel, may trade places with another zero)."""
    model = net()
    masks = TorchMasks(model, 0.2, "erk")
    train_steps(model, masks, 3, "set")
    train_steps(model, masks, 1, None)
    sparse, specs = sparsify(model, 0.2, "erk", "magnitude")
    assert {s.weight for s in specs} == set(masks.layers)
    state = {**dict(sparse.named_parameters()), **dict(sparse.named_buffers())}
    for s in specs:
        assert s.nnz == int(masks.masks[s.weight].sum())
        dense = dense_weight(state[s.values], state[s.positions], s.shape)
        assert torch.equal(dense, masks.layers[s.weight])
    x = torch.randn(4, 3, 8, 8)
    assert torch.equal(sparse(x), model(x))


def test_dst_config_schedule_checks_its_method():
    assert DstConfig().schedule().method == "rigl"
    with pytest.raises(ValueError, match="unknown mask updater"):
        DstConfig(method="magic").schedule()


def test_population_leaves_out_every_held_out_subject():
    rng = np.random.default_rng(0)
    recs = data.Recordings(x=[rng.standard_normal((400, 6)) for _ in range(6)],
                           y=np.array([0, 1, 0, 1, 0, 1]), subject=np.array([1, 1, 2, 2, 3, 3]),
                           side=np.array([0, 1, 0, 1, 0, 1]), classes=("a", "b"))
    x, y = data.population_windows(recs, (2, 3))
    assert len(x) == 2 * 3  # subject 1's two recordings, 3 windows each
    with pytest.raises(data.DataError, match="user 7"):
        data.population_windows(recs, (7,))


def test_pretrain_cache_key_of_the_default_config_is_unchanged():
    """New config fields are left out of the key when unused: caches stay valid."""
    import dataclasses
    import hashlib
    import json

    from exporters.models.pretrain import CACHE_VERSION, PretrainConfig, cache_key

    cfg = PretrainConfig()
    old = {k: v for k, v in dataclasses.asdict(cfg).items()
           if k not in ("also_held_out", "dst", "dataset")}
    blob = json.dumps({"v": CACHE_VERSION, **old}, sort_keys=True).encode()
    assert cache_key(cfg) == hashlib.sha256(blob).hexdigest()[:16]
    assert cache_key(dataclasses.replace(cfg, dst=DstConfig())) != cache_key(cfg)
    assert cache_key(dataclasses.replace(cfg, also_held_out=(8,))) != cache_key(cfg)
    assert cache_key(dataclasses.replace(cfg, dataset="hapt")) != cache_key(cfg)


def test_pretraining_stopped_mid_epoch_resumes_from_its_last_epoch(tmp_path, monkeypatch):
    """A long population run (ResNet-50: ~13 min an epoch here) leaves a resume point after
    every epoch; stopped mid-epoch, the next run continues from it and ends with the weights,
    masks and step count of a run that was never stopped."""
    from types import SimpleNamespace

    import torch

    from conftest import tiny_model
    from exporters.models import popfit, pretrain

    rng = np.random.default_rng(0)
    x = rng.standard_normal((12, data.WINDOW_SAMPLES, 6))
    mean, scale = data.channel_stats(x)
    spec = SimpleNamespace(patch_size=8, image_size=16, input="gasf")  # 2 x 2 patches of 8 x 8
    signals = data.standardised_signals(x, mean, scale, spec.image_size)
    y = rng.integers(0, 3, 12)
    dst = DstConfig(density=0.5, epochs=3, every_steps=2, method="set")
    cfg = pretrain.PretrainConfig(model="tiny", batch=4, patches_per_window=2, dst=dst)

    def fit(partial=None, stop=None):
        model = tiny_model()
        masks = TorchMasks(model, dst.density, dst.allocation)
        out = popfit.fit_population(model, cfg, spec, signals, y, dst.epochs, 1e-2, masks,
                                    False, partial, stop)
        return model, masks, out

    whole, whole_masks, whole_out = fit()

    class StopAfter:  # the progress bar the run reports to; it "loses power" at update 8
        def __init__(self, *a, **k):
            self.n = 0

        def update(self, k):
            self.n += k
            if self.n == 8:  # 6 steps an epoch: in the middle of epoch 2
                raise KeyboardInterrupt

        def set_postfix(self, **k):
            pass

        def close(self):
            pass

    partial = tmp_path / "tiny.partial.pt"
    monkeypatch.setattr(popfit, "tqdm", StopAfter)
    with pytest.raises(KeyboardInterrupt):
        fit(partial)
    assert torch.load(partial, weights_only=False)["epochs"] == 1
    monkeypatch.undo()
    resumed, resumed_masks, out = fit(partial)
    assert out["steps"] == whole_out["steps"] == 18
    assert out["regrown_weights"] == whole_out["regrown_weights"] > 0
    for name, mask in whole_masks.masks.items():
        assert torch.equal(resumed_masks.masks[name], mask), name
    for name, value in whole.state_dict().items():
        torch.testing.assert_close(resumed.state_dict()[name], value, rtol=0, atol=1e-6,
                                   msg=name)

    # Ctrl-C (a signal noted by the caller): the run stops at the end of step 7, mid-epoch,
    # saves where it is, and the next run continues from step 8 to the same weights
    from edgetrain.trainloop import Interrupted

    steps_seen = []

    def stop_at_7():
        steps_seen.append(1)
        return 2 if len(steps_seen) == 7 else None  # SIGINT

    stopped = tmp_path / "stopped.partial.pt"
    with pytest.raises(Interrupted, match="after step 7 of 18") as e:
        fit(stopped, stop_at_7)
    assert e.value.signum == 2
    blob = torch.load(stopped, weights_only=False)
    assert (blob["step"], blob["epochs"], blob["offset"]) == (7, 1, 4)  # 6 steps an epoch
    resumed, resumed_masks, out = fit(stopped)
    assert out["steps"] == 18 and out["regrown_weights"] == whole_out["regrown_weights"]
    for name, mask in whole_masks.masks.items():
        assert torch.equal(resumed_masks.masks[name], mask), name
    for name, value in whole.state_dict().items():
        torch.testing.assert_close(resumed.state_dict()[name], value, rtol=0, atol=1e-6,
                                   msg=name)


@pytest.mark.slow  # pretrains twice (about 20 s): the end-to-end tier
def test_pretraining_cache_round_trip_leaves_no_temporaries(tmp_path, monkeypatch):
    import torch

    from exporters.models.pretrain import PretrainConfig, pretrain

    rng = np.random.default_rng(0)
    recs = data.Recordings(x=[rng.standard_normal((400, 6)) for _ in range(4)],
                           y=np.array([0, 1, 0, 1]), subject=np.array([1, 1, 10, 10]),
                           side=np.array([0, 1, 0, 1]), classes=("a", "b"))
    # the tiny recordings above stand in for the data set (datasets.recordings caches the
    # real ones per process, so patching the loader beneath it would pretrain on those)
    monkeypatch.setattr(datasets, "recordings", lambda name: recs)
    cfg = PretrainConfig(model="patch_mobilenet", width=0.25, epochs=1, batch=4)
    first, s1 = pretrain(cfg, tmp_path, show_progress=False)
    second, s2 = pretrain(cfg, tmp_path, show_progress=False)
    assert s1["cache"] == s2["cache"] and [p.name for p in tmp_path.iterdir()] == \
        [Path(s1["cache"]).name]  # the cache alone: no temporary, no resume point
    for name, value in first.state_dict().items():
        assert torch.equal(second.state_dict()[name], value), name


# ---- one drop count for host and device ----------------------------------------------------
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@settings(max_examples=40, deadline=None)
@given(widths=st.lists(st.integers(2, 40), min_size=1, max_size=3),
       density=st.floats(0.05, 0.9), fraction=st.floats(0.0, 1.0))
def test_host_drops_round_fraction_times_nnz_per_layer(widths, density, fraction):
    """Random layer sizes and fractions: each layer replaces round(fraction x nnz) weights, the
    rule the device applies (edgetrain.masks.drop_count)."""
    torch.manual_seed(0)
    layers = [nn.Linear(a, b) for a, b in zip([7] + widths, widths + [3])]
    model = nn.Sequential(*layers)
    masks = TorchMasks(model, density, "uniform")
    x = torch.randn(4, 7)
    model(x).sum().backward()
    nnz = masks.nnz()
    regrown = masks.update("set", fraction, np.random.default_rng(0))
    assert regrown == sum(round(fraction * n) for n in nnz.values())
    assert masks.nnz() == nnz  # density unchanged


def test_host_and_device_drop_the_same_number_for_the_same_fraction(tmp_path):
    """The same layer (the tiny model's conv at density 0.5), the same fractions: the device's
    mask update (through the runtime) and host sparse training regrow the same counts."""
    from conftest import TINY_CLASSES, TINY_SHAPE, device_python, tiny_model
    from edgetrain.manifest import Plan
    from exporters.export import export_artifact

    art = tmp_path / "sparse"
    export_artifact(tiny_model(), torch.zeros(2, *TINY_SHAPE), art, classes=TINY_CLASSES,
                    plan=Plan(micro_batch=4), model_name="tiny", density=0.5)
    rng = np.random.default_rng(7)
    fractions = [float(f) for f in rng.uniform(0, 1, 10)] + [0.0, 1 / 54, 1.5 / 54, 2.5 / 54]
    device = device_python(f"""
import json, numpy as np
from edgetrain.runtime import DeviceRuntime
rt = DeviceRuntime({str(art)!r})
rng = np.random.default_rng(0)
print(json.dumps([rt.update_masks('set', f, [], rng) for f in {fractions!r}]))
""")
    model = tiny_model()
    masks = TorchMasks(model, 0.5, "erk")
    assert list(masks.nnz()) == ["conv.weight"]
    host = [masks.update("set", f, np.random.default_rng(0)) for f in fractions]
    assert host == device
    assert host[-1] == round(2.5 / 54 * masks.nnz()["conv.weight"])  # a half rounds the same way
