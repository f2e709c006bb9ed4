"""Shared fixtures: a tiny network that is none of the named ones, exported through the
Python API, and tiny data made here. Device-side code runs in child processes without torch,
as on a watch; this test process has torch loaded for exporting."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
TINY_SHAPE = (3, 8, 8)
TINY_CLASSES = ["a", "b", "c"]


def tiny_model(seed: int = 0):
    import torch
    from torch import nn

    torch.manual_seed(seed)

    class Tiny(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3, padding=1, bias=False)
            self.bn = nn.BatchNorm2d(4)
            self.head = nn.Linear(4, len(TINY_CLASSES))

        def forward(self, x):  # [B, 3, 8, 8] -> [B, 3]
            return self.head(torch.relu(self.bn(self.conv(x))).mean(dim=(2, 3)))

    return Tiny()


def export_tiny(out: Path, micro_batch: int = 4, lr: float = 1e-2, seed: int = 0):
    import torch

    from edgetrain.manifest import Plan
    from exporters.export import export_artifact

    model = tiny_model(seed)
    m = export_artifact(model, torch.zeros(2, *TINY_SHAPE), out, classes=TINY_CLASSES,
                        plan=Plan(micro_batch=micro_batch), lr=lr, model_name="tiny")
    return model, m


def tiny_data(n: int = 24, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Learnable toy data: the class sets which channel is bright."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, len(TINY_CLASSES), n)
    x = rng.normal(0, 0.3, (n, *TINY_SHAPE)).astype(np.float32)
    x[np.arange(n), y] += 1.0
    return x, y.astype(np.int64)


@pytest.fixture(scope="session")
def tiny_artifact(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("art") / "tiny"
    export_tiny(out)
    return out


def cli(*args: str, cwd: Path | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    """Run the `edgetrain` CLI in a child process, as a user would."""
    return subprocess.run([sys.executable, "-m", "edgetrain.cli", *map(str, args)],
                          capture_output=True, text=True, cwd=cwd or ROOT, timeout=timeout,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})


def device_python(code: str, timeout: float = 300) -> dict:
    """Run device-side code in a torch-free child; it prints one JSON object last."""
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=timeout, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def checkpoint_weights(path, trainable_only: bool = False) -> dict:
    """Every parameter of an ORT checkpoint (or its trainable ones), flattened to lists, read
    in a torch-free child."""
    return device_python(f"""
import json
from edgetrain.ort_device import training_api
s = training_api().CheckpointState.load_checkpoint({str(path)!r})
print(json.dumps({{k: p.data.ravel().tolist() for k, p in s.parameters
                  if p.requires_grad or not {trainable_only!r}}}))
""")


def assert_device_step_equals_torch(artifact: Path, model, x: np.ndarray, y: np.ndarray,
                                    atol: float) -> None:
    """One micro-batch of (x, y): the runtime's loss and every gradient equal torch's on
    `model` (the same network the artifact was exported from)."""
    import torch

    loss = torch.nn.functional.cross_entropy(model(torch.from_numpy(x)), torch.from_numpy(y))
    loss.backward()
    got = device_gradients(artifact, x, y)
    assert abs(got["loss"] - loss.item()) < 1e-5
    for name, p in model.named_parameters():
        np.testing.assert_allclose(got["grads"][name], p.grad.numpy(), rtol=1e-4, atol=atol,
                                   err_msg=name)


def device_gradients(artifact: Path, x: np.ndarray, y: np.ndarray) -> dict:
    """One training micro-batch of (x, y) on the artifact in a torch-free child: {"loss": the
    runtime's loss, "grads": trainable name -> its gradient as nested lists}."""
    batch = Path(artifact).parent / f"{Path(artifact).name}-batch.npz"
    np.savez(batch, x=x, y=y)
    return device_python(f"""
import json, numpy as np
from edgetrain.runtime import DeviceRuntime
rt = DeviceRuntime({str(artifact)!r})
z = np.load({str(batch)!r})
loss = rt.train_micro_batch(z['x'], z['y'])
print(json.dumps({{'loss': loss, 'grads': {{t.name: rt.state.parameters[t.name].grad.tolist()
                                           for t in rt.manifest.trainable}}}}))
""")
