"""Dynamic sparse training (SET/RigL) and BatchNorm RESET on device, checked against torch."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import TINY_CLASSES, TINY_SHAPE, cli, device_python, tiny_data, tiny_model
from edgetrain.manifest import Plan, load_manifest
from edgetrain.masks import UPDATERS, MaskSchedule, update_layer
from exporters.export import export_artifact
from exporters.plans.sparse import sparsify

DENSITY = 0.5


@pytest.fixture(scope="module")
def sparse_artifact(tmp_path_factory):
    out = tmp_path_factory.mktemp("sparse") / "tiny"
    m = export_artifact(tiny_model(), torch.zeros(2, *TINY_SHAPE), out, classes=TINY_CLASSES,
                        plan=Plan(micro_batch=4), lr=1e-2, model_name="tiny", density=DENSITY,
                        freeze_batchnorm=True)
    assert [k.weight for k in m.masks] == ["conv.weight"]
    assert {"mask_grad_model", "batchnorm_stats_model"} <= set(m.files)
    return out


def reference_model(values=None, positions=None, params=None) -> torch.nn.Module:
    """The tiny model in torch with the conv weight rebuilt densely from (values, positions):
    zero everywhere off the mask."""
    model = tiny_model().eval()
    if values is not None:
        w = torch.zeros(model.conv.weight.numel())
        w[torch.as_tensor(positions, dtype=torch.long)] = torch.as_tensor(values)
        named = {**dict(model.named_parameters()), **dict(model.named_buffers())}
        with torch.no_grad():
            model.conv.weight.copy_(w.view_as(model.conv.weight))
            for name, t in (params or {}).items():
                named[name].copy_(torch.as_tensor(np.array(t, np.float32)))
    return model


# ---- the update rule -----------------------------------------------------------------------
@pytest.mark.parametrize("method", sorted(UPDATERS))
@settings(max_examples=60, deadline=None)
@given(numel=st.integers(2, 300), density=st.floats(0.05, 0.95), frac=st.floats(0.0, 1.0),
       seed=st.integers(0, 2**16))
def test_every_updater_keeps_density_and_zeroes_regrown(method, numel, density, frac, seed):
    rng = np.random.default_rng(seed)
    nnz = max(1, min(numel - 1, round(density * numel)))
    positions = rng.permutation(numel)[:nnz]
    values = rng.standard_normal(nnz).astype(np.float32)
    n = int(frac * nnz)
    u = UPDATERS[method]
    v, p, slots = update_layer(values, positions, numel, n, u.keep_score(values),
                               u.grow_score(rng.standard_normal(numel), numel, rng))
    assert len(p) == nnz and len(set(p.tolist())) == nnz and p.min() >= 0 and p.max() < numel
    assert len(slots) == n and np.all(v[slots] == 0)
    untouched = np.setdiff1d(np.arange(nnz), slots)
    assert np.array_equal(v[untouched], values[untouched])
    assert np.array_equal(p[untouched], positions[untouched])
    if n:  # the dropped slots held the smallest magnitudes
        assert np.abs(values[slots]).max() <= np.abs(values[untouched]).min(initial=np.inf)


def test_rigl_grows_where_the_dense_gradient_is_largest():
    values = np.array([0.1, -2.0, 3.0], np.float32)
    positions = np.array([0, 1, 2])
    grad = np.array([0.2, 9.0, 9.0, 0.5, -4.0, 1.0])  # kept positions (1, 2) do not count
    u = UPDATERS["rigl"]
    v, p, slots = update_layer(values, positions, 6, 1, u.keep_score(values),
                               u.grow_score(grad, 6, np.random.default_rng(0)))
    assert slots.tolist() == [0] and p.tolist() == [4, 1, 2] and v.tolist() == [0, -2, 3]


def test_unknown_updater_and_bad_schedule_are_refused():
    with pytest.raises(ValueError, match="unknown mask updater 'magic'.*'rigl', 'set'"):
        MaskSchedule("magic")
    with pytest.raises(ValueError, match="drop fraction"):
        MaskSchedule("set", drop_fraction=1.5)
    with pytest.raises(ValueError, match="every_steps"):
        MaskSchedule("set", every_steps=0)


def test_schedule_decays_and_stops():
    s = MaskSchedule("set", every_steps=10, drop_fraction=0.3, end_ratio=0.75)
    assert s.fraction_at(5, 100) == 0  # not an update step
    assert s.fraction_at(10, 100) == pytest.approx(0.15 * (1 + np.cos(np.pi * 10 / 75)))
    assert s.fraction_at(70, 100) < s.fraction_at(10, 100)
    assert s.fraction_at(80, 100) == 0  # after 75% of the steps


# ---- on device -----------------------------------------------------------------------------
def test_dense_gradients_equal_torch(tmp_path, sparse_artifact):
    x, y = tiny_data(4, seed=3)
    np.savez(tmp_path / "b.npz", x=x, y=y)
    out = device_python(f"""
import json, numpy as np
from edgetrain.runtime import DeviceRuntime
rt = DeviceRuntime({str(sparse_artifact)!r})
z = np.load({str(tmp_path / 'b.npz')!r})
g = rt.dense_gradients([(z['x'], z['y'])])
p = rt.state.parameters
print(json.dumps({{'grad': g['conv.weight'].tolist(), 'values': p['conv.weight_values'].data.tolist(),
                  'positions': p['conv.weight_positions'].data.tolist()}}))
""")
    model = reference_model(out["values"], out["positions"])
    loss = torch.nn.functional.cross_entropy(model(torch.from_numpy(x)), torch.from_numpy(y))
    loss.backward()
    np.testing.assert_allclose(out["grad"], model.conv.weight.grad.reshape(-1).numpy(),
                               rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("method", sorted(UPDATERS))
def test_masked_weights_stay_zero_and_density_constant_through_updates(tmp_path, sparse_artifact,
                                                                       method):
    """Train with a mask update after every step. After each update: nnz unchanged, positions
    distinct, regrown values 0 and their AdamW moments 0, every other moment unchanged, the
    optimizer's step count kept. At the end, the device's eval logits equal torch's with a
    dense weight that is zero off the final mask."""
    x, y = tiny_data(24, seed=4)
    np.savez(tmp_path / "d.npz", x=x, y=y)
    out = device_python(f"""
import json, os, tempfile, numpy as np
from edgetrain.runtime import DeviceRuntime
from edgetrain.ortcheckpoint import optimizer_moments, optimizer_step_count
rt = DeviceRuntime({str(sparse_artifact)!r}, budget_bytes=8 << 20)
rt.preflight(mask_gradients=True)
z = np.load({str(tmp_path / 'd.npz')!r})
x, y = z['x'], z['y']
(nnz,) = [m.nnz for m in rt.manifest.masks]
p = rt.state.parameters
first = p['conv.weight_positions'].data.copy()
path = os.path.join(tempfile.mkdtemp(), 'ck')
def saved():
    rt.save_checkpoint(path)
    buf = open(path, 'rb').read()
    return optimizer_moments(buf), optimizer_step_count(buf)
rng, report = np.random.default_rng(0), []
for step in range(6):
    b = slice(4 * step, 4 * step + 4)
    rt.train_micro_batch(x[b], y[b]); rt.optimizer_step()
    before_pos = p['conv.weight_positions'].data.copy()
    moments, count = saved()
    regrown = rt.update_masks({method!r}, 0.3, [(x[b], y[b])], rng)
    p = rt.state.parameters  # the state was reloaded
    pos, val = p['conv.weight_positions'].data, p['conv.weight_values'].data
    after, count_after = saved()
    changed = np.nonzero(pos != before_pos)[0]
    fresh = np.zeros(nnz, bool)
    for name in moments:
        for m0, m1 in zip(moments[name], after[name]):
            if name == 'conv.weight_values':
                fresh |= (m1 == 0) & (m0 != 0)
            else:
                assert np.array_equal(m0, m1), name
    report.append(dict(regrown=regrown, nnz=len(pos), distinct=len(set(pos.tolist())),
                       changed_values=val[changed].tolist(), count=(count, count_after),
                       moments_zero_at_changed=bool(all(np.all(m[changed] == 0) for m in after['conv.weight_values'])),
                       moments_zeroed=int(fresh.sum()), in_range=bool(pos.min() >= 0 and pos.max() < 108)))
logits = rt.eval_logits(x[:8])
params = {{t.name: p[t.name].data.tolist() for t in rt.manifest.trainable + rt.manifest.frozen}}
print(json.dumps(dict(report=report, first=first.tolist(), logits=logits.tolist(), params=params)))
""")
    (mask,) = load_manifest(sparse_artifact).masks
    nnz = mask.nnz
    assert len(out["first"]) == nnz and mask.numel == 108
    for r in out["report"]:
        assert r["regrown"] == round(0.3 * nnz)
        assert r["nnz"] == r["distinct"] == nnz and r["in_range"]
        assert all(v == 0 for v in r["changed_values"])
        assert r["moments_zero_at_changed"]
        assert r["moments_zeroed"] <= r["regrown"]
        assert r["count"][0] == r["count"][1] > 0
    params = out["params"]
    final = params["conv.weight_positions"]
    assert set(final) != set(out["first"])  # the mask really moved
    model = reference_model(params["conv.weight_values"], final,
                            {k: v for k, v in params.items() if not k.startswith("conv.")})
    x, _ = tiny_data(24, seed=4)
    with torch.no_grad():
        want = model(torch.from_numpy(x[:8])).numpy()
    np.testing.assert_allclose(out["logits"], want, rtol=1e-4, atol=1e-5)


def test_reset_batchnorm_equals_torch_reset(tmp_path, sparse_artifact):
    """RESET on device == torch: momentum=None, reset_running_stats, train-mode forwards."""
    batches = [tiny_data(4, seed=10 + i)[0] * (1 + i) for i in range(3)]
    np.save(tmp_path / "x.npy", np.stack(batches))
    out = device_python(f"""
import json, numpy as np
from edgetrain.runtime import DeviceRuntime
rt = DeviceRuntime({str(sparse_artifact)!r}, budget_bytes=8 << 20)
rt.preflight(batchnorm_stats=True)
n = rt.reset_batchnorm(lambda: iter(np.load({str(tmp_path / 'x.npy')!r})))
p = rt.state.parameters
print(json.dumps(dict(n=n, mean=p['bn.running_mean'].data.tolist(), var=p['bn.running_var'].data.tolist())))
""")
    model, _ = sparsify(tiny_model(), DENSITY)
    model.bn.momentum = None
    model.bn.reset_running_stats()
    model.train()
    with torch.no_grad():
        for xb in batches:
            model(torch.from_numpy(xb))
    assert out["n"] == 3
    np.testing.assert_allclose(out["mean"], model.bn.running_mean.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out["var"], model.bn.running_var.numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.slow
# ---- through the CLI -----------------------------------------------------------------------
def test_cli_personalise_with_rigl_and_reset_bn(tmp_path, sparse_artifact, tiny_artifact):
    x, y = tiny_data(48, seed=1)
    np.savez(tmp_path / "train.npz", x=x, y=y)
    xt, yt = tiny_data(30, seed=2)
    np.savez(tmp_path / "test.npz", x=xt, y=yt)
    data = ["--data", tmp_path / "train.npz", "--test", tmp_path / "test.npz", "--budget", "4MiB"]
    r = cli("personalise", sparse_artifact, *data, "--epochs", "4", "--mask-update", "rigl",
            "--mask-every", "2", "--out", tmp_path / "dst", "--json", "--no-select")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["mask_method"] == "rigl" and d["mask_updates"] == 17  # steps 2..34 of 48 (< 75%)
    assert d["regrown_weights"] > 0 and d["inference_agreement"] == 1.0
    r = cli("reset-bn", sparse_artifact, *data, "--samples", "20", "--out", tmp_path / "rs",
            "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert (d["samples"], d["batches"]) == (20, 5) and d["torch_loaded"] is False
    r = cli("personalise", tiny_artifact, *data, "--mask-update", "set", "--out", tmp_path / "x")
    assert r.returncode == 2 and "is dense: export it with --density" in r.stderr
    r = cli("reset-bn", sparse_artifact, *data, "--samples", "0", "--out", tmp_path / "y")
    assert r.returncode == 2 and "at least 1 sample" in r.stderr
