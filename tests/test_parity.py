"""One ONNX Runtime training step equals one torch step on a tiny net.

Gradients are compared with torch autograd. The update is compared with AdamW as the
exported optimizer graph defines it (read from the manifest: ORT's adam_mode 1, the
Hugging Face form, bias correction folded into the step size), applied to torch's gradients.
"""
from __future__ import annotations

import json

import numpy as np
import torch

from conftest import device_python, export_tiny, tiny_data


def test_one_ort_step_equals_one_torch_step(tmp_path):
    model, manifest = export_tiny(tmp_path / "art", micro_batch=6, lr=1e-2)
    x, y = tiny_data(6, seed=1)
    np.savez(tmp_path / "batch.npz", x=x, y=y)

    # torch: loss, gradients, BN running mean after one training-mode forward/backward
    model.train()
    logits = model(torch.from_numpy(x))
    loss = torch.nn.functional.cross_entropy(logits, torch.from_numpy(y))
    loss.backward()
    grads = {n: p.grad.numpy().copy() for n, p in model.named_parameters()}
    params = {n: p.detach().numpy().copy() for n, p in model.named_parameters()}

    out = device_python(f"""
import json, numpy as np, sys
from edgetrain.runtime import DeviceRuntime
rt = DeviceRuntime({str(tmp_path / 'art')!r})
z = np.load({str(tmp_path / 'batch.npz')!r})
loss = rt.train_micro_batch(z['x'], z['y'])
P = rt.state.parameters
names = [t.name for t in rt.manifest.trainable]
grads = {{n: P[n].grad.tolist() for n in names}}
rt.optimizer_step()
print(json.dumps({{'loss': loss, 'grads': grads,
                  'params': {{n: P[n].data.tolist() for n in names}},
                  'running_mean': P['bn.running_mean'].data.tolist(),
                  'torch': sys.modules.get('torch') is not None}}))
""")
    assert out["torch"] is False
    # the ReLU's gradient ran as the rewrite (exporters/passes/relugrad.py), and still matches torch
    passes = manifest.provenance["passes"]
    assert (passes["relu_grads"], passes["depthwise_conv_grads"]) == (1, 0)
    assert abs(out["loss"] - loss.item()) < 1e-5
    for n, g in grads.items():
        np.testing.assert_allclose(np.array(out["grads"][n]), g, rtol=1e-4, atol=1e-6, err_msg=n)
    np.testing.assert_allclose(out["running_mean"], model.bn.running_mean.numpy(), atol=1e-6)

    opt = manifest.optimizer
    lr, b1, b2, eps = opt["lr"], opt["beta1"], opt["beta2"], opt["eps"]
    for n, g in grads.items():
        m, v = (1 - b1) * g, (1 - b2) * g * g
        step = lr * np.sqrt(1 - b2) / (1 - b1)
        expected = params[n] - step * m / (np.sqrt(v) + eps)
        np.testing.assert_allclose(np.array(out["params"][n]), expected, rtol=1e-5, atol=1e-7,
                                   err_msg=n)
    # and the step really moved the weights (the comparison above is not vacuous)
    assert max(np.abs(np.array(out["params"][n]) - params[n]).max() for n in grads) > 1e-3


def test_manifest_records_optimizer_from_graph(tiny_artifact):
    d = json.loads((tiny_artifact / "manifest.json").read_text())
    assert d["optimizer"]["type"] == "AdamW"
    assert d["optimizer"]["weight_decay"] == 0.0
