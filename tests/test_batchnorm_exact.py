"""BatchNorm statistics re-estimated on device, exactly (Plan.batchnorm_adapt "exact"): one
forward pass per layer, earlier layers first, each layer's mean and variance over every sample,
so the result does not depend on the micro-batch (RESET's batch statistics do)."""
from __future__ import annotations

import numpy as np
import pytest

from conftest import device_python

CLASSES = ["a", "b", "c"]
SHAPE = (2, 16)  # [channels, time]


def two_norm_model(seed: int = 0):
    """Two BatchNorms in a chain, declared in the opposite order to the one they run in (the
    side graph must name its outputs by the order they run), running statistics far off."""
    import torch
    from torch import nn

    torch.manual_seed(seed)

    class TwoNorm(nn.Module):
        def __init__(self):
            super().__init__()
            self.bn_late = nn.BatchNorm1d(5)
            self.conv2 = nn.Conv1d(5, 5, 3, padding=1)
            self.bn_early = nn.BatchNorm1d(5)
            self.conv1 = nn.Conv1d(2, 5, 3, padding=1)
            self.head = nn.Linear(5, len(CLASSES))

        def forward(self, x):
            h = torch.relu(self.bn_early(self.conv1(x)))
            h = torch.relu(self.bn_late(self.conv2(h)))
            return self.head(h.mean(dim=2))

    model = TwoNorm()
    for bn in (model.bn_early, model.bn_late):
        bn.running_mean.fill_(3.0)
        bn.running_var.fill_(0.1)
    return model


def export(out, adapt: str, micro_batch: int = 2):
    import torch

    from edgetrain.manifest import Plan
    from exporters.export import export_artifact

    model = two_norm_model()
    m = export_artifact(model, torch.zeros(2, *SHAPE), out, classes=CLASSES,
                        plan=Plan(micro_batch=micro_batch, batchnorm_adapt=adapt),
                        model_name="two-norm")
    return model, m


def samples(n: int = 12) -> np.ndarray:
    rng = np.random.default_rng(5)
    return (rng.normal(1.5, 2.0, (n, *SHAPE))).astype(np.float32)


def device_statistics(artifact, x_path, batch: int) -> dict:
    return device_python(f"""
import json, numpy as np
from edgetrain.runtime import DeviceRuntime
rt = DeviceRuntime({str(artifact)!r}, budget_bytes=8 << 20)
rt.set_micro_batch({batch})
rt.preflight(batchnorm_stats=True)
x = np.load({str(x_path)!r})
n = rt.reset_batchnorm(lambda: (x[i:i + {batch}] for i in range(0, len(x), {batch})))
p = rt.state.parameters
print(json.dumps(dict(n=n, **{{k: p[k].data.tolist() for k in (
    'bn_early.running_mean', 'bn_early.running_var', 'bn_late.running_mean',
    'bn_late.running_var')}})))
""")


def torch_exact(model, x: np.ndarray) -> dict:
    """Each layer in the order it runs: the mean and (population) variance of its input over
    all of x, the layers before it already set, every layer in eval mode."""
    import torch

    model = model.eval()
    out = {}
    for name in ("bn_early", "bn_late"):
        bn = getattr(model, name)
        seen = []
        hook = bn.register_forward_pre_hook(lambda m, a: seen.append(a[0]))
        with torch.no_grad():
            model(torch.from_numpy(x))
        hook.remove()
        h = seen[0]
        bn.running_mean.copy_(h.mean(dim=(0, 2)))
        bn.running_var.copy_(h.var(dim=(0, 2), unbiased=False))
        out[f"{name}.running_mean"] = bn.running_mean.numpy().copy()
        out[f"{name}.running_var"] = bn.running_var.numpy().copy()
    return out


def test_exact_statistics_equal_torch_at_any_micro_batch(tmp_path):
    model, m = export(tmp_path / "art", "exact")
    assert m.plan.batchnorm_adapt == "exact"
    assert "batchnorm_moments_model" in m.files and "batchnorm_stats_model" not in m.files
    x = samples()
    np.save(tmp_path / "x.npy", x)
    want = torch_exact(model, x)
    by_batch = {b: device_statistics(tmp_path / "art", tmp_path / "x.npy", b) for b in (2, 6)}
    for b, got in by_batch.items():
        assert got["n"] == 2 * len(x) // b  # one pass per layer
        for name, value in want.items():
            np.testing.assert_allclose(got[name], value, rtol=1e-4, atol=1e-5,
                                       err_msg=f"{name} at micro-batch {b}")


def test_batch_statistics_named_by_the_order_layers_run(tmp_path):
    """RESET (batch statistics) writes each layer's estimate into that layer, whatever order
    the module declares its layers in: equal to torch's RESET (momentum=None)."""
    import torch

    model, m = export(tmp_path / "art", "batch", micro_batch=4)
    assert "batchnorm_stats_model" in m.files
    x = samples()
    np.save(tmp_path / "x.npy", x)
    got = device_statistics(tmp_path / "art", tmp_path / "x.npy", 4)
    for bn in (model.bn_early, model.bn_late):
        bn.momentum = None
        bn.reset_running_stats()
    model.train()
    with torch.no_grad():
        for i in range(0, len(x), 4):
            model(torch.from_numpy(x[i:i + 4]))
    for name in ("bn_early", "bn_late"):
        bn = getattr(model, name)
        np.testing.assert_allclose(got[f"{name}.running_mean"], bn.running_mean.numpy(),
                                   rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(got[f"{name}.running_var"], bn.running_var.numpy(),
                                   rtol=1e-4, atol=1e-5)


def test_a_batchnorm_used_twice_is_refused_at_export(tmp_path):
    import torch
    from torch import nn

    from exporters.export import export_artifact

    class Shared(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1, self.conv2 = nn.Conv1d(2, 4, 3), nn.Conv1d(4, 4, 3)
            self.bn = nn.BatchNorm1d(4)
            self.head = nn.Linear(4, 3)

        def forward(self, x):
            h = self.bn(self.conv2(self.bn(self.conv1(x))))
            return self.head(h.mean(dim=2))

    with pytest.raises(ValueError, match="run more than once"):
        export_artifact(Shared(), torch.zeros(2, *SHAPE), tmp_path / "art", classes=CLASSES,
                        model_name="shared")


def test_plan_refuses_an_unknown_adaptation():
    from edgetrain.manifest import Plan

    with pytest.raises(ValueError, match="batchnorm_adapt"):
        Plan(batchnorm_adapt="sometimes")


def test_a_moments_graph_missing_an_output_is_refused(tmp_path):
    """An artifact resealed after one layer's second moment was cut from the graph: a clear
    ArtifactError before any statistic is written, not a KeyError."""
    import onnx

    from test_bad_input import reseal

    export(tmp_path / "art", "exact")
    path = tmp_path / "art" / "batchnorm_moments_model.onnx"
    m = onnx.load(path)
    cut = [o for o in m.graph.output if o.name == "bn_late.shifted_mean_square"]
    m.graph.output.remove(cut[0])
    onnx.save(m, path)
    reseal(tmp_path / "art", "batchnorm_moments_model")
    out = reset_refused(tmp_path / "art", "rt.reset_batchnorm(lambda: [x[:4]])")
    assert "bn_late" in out["said"] and "re-export" in out["said"] and out["same"]


def reset_refused(artifact, reset: str) -> dict:
    """Run `reset` (code using `rt` and 12 samples `x`) on the artifact in a device child:
    the ArtifactError it raised (said) and whether the first running mean stayed (same)."""
    return device_python(f"""
import json, numpy as np
from edgetrain.manifest import ArtifactError
from edgetrain.runtime import DeviceRuntime
rt = DeviceRuntime({str(artifact)!r}, budget_bytes=8 << 20)
rt.set_micro_batch(2)
before = rt.state.parameters['bn_early.running_mean'].data.copy()
x = np.asarray({samples().tolist()!r}, np.float32)
try:
    {reset}
    said = ''
except ArtifactError as e:
    said = str(e)
same = bool((rt.state.parameters['bn_early.running_mean'].data == before).all())
print(json.dumps(dict(said=said, same=same)))
""")
