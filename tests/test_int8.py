"""Frozen weights in 8 bits (exporters/plans/quantize.py): a quarter of the bytes, the same graph."""
from __future__ import annotations

import json

import numpy as np
import torch

from conftest import cli, device_python
from exporters.plans.quantize import quantize_per_channel
from test_update_plans import SAMPLE, data, small_cnn


def test_per_channel_rounding_is_within_half_a_step():
    rng = np.random.default_rng(0)
    w = rng.normal(0, 1, (5, 3, 4)).astype(np.float32)
    w[2] = 0  # an all-zero channel keeps scale 1 and stays zero
    q, scale = quantize_per_channel(w)
    assert q.dtype == np.int8 and scale.shape == (5,) and scale[2] == 1.0
    back = q.astype(np.float32) * scale[:, None, None]
    assert np.all(np.abs(back - w) <= scale[:, None, None] / 2 + 1e-7)
    assert np.abs(q).max() == 127 and not back[2].any()


def export(tmp_path, int8: bool):
    from edgetrain.manifest import Plan
    from exporters.export import export_artifact

    model = small_cnn()
    out = tmp_path / ("int8" if int8 else "fp32")
    m = export_artifact(model, torch.zeros(2, *SAMPLE), out, classes=["a", "b", "c"],
                        plan=Plan(micro_batch=4), lr=1e-2, freeze_batchnorm=True,
                        update="head", layout="CT", int8_frozen=int8)
    return model, m, out


def test_int8_artifact_holds_a_quarter_of_the_frozen_weights_and_computes_the_same(tmp_path):
    model, m, out = export(tmp_path, True)
    _, m32, _ = export(tmp_path, False)
    assert m.plan.frozen_int8 == ("block1.0.weight", "block2.0.weight")
    dtypes = {t.name: t.dtype for t in m.frozen}
    assert dtypes["block1.0.weight_int8"] == "int8" and dtypes["block1.0.weight_scale"] == "float32"
    assert "block1.0.weight" not in dtypes and [t.dtype for t in m.trainable] == ["float32"] * 2
    # parameters in the breakdown: every checkpoint tensor, shapes x itemsize, 256-byte chunks
    chunk = lambda n: -(-n // 256) * 256  # noqa: E731
    assert m.predicted["breakdown"]["parameters"] == sum(chunk(t.nbytes)
                                                         for t in m.trainable + m.frozen)
    w1 = 8 * 6 * 5  # block1.0.weight: 240 values, 960 bytes as float32, 240 as int8
    assert {t.name: t.nbytes for t in m.frozen}["block1.0.weight_int8"] == w1
    assert {t.name: t.nbytes for t in m32.frozen}["block1.0.weight"] == 4 * w1
    # the device's eval equals torch with the weights rounded as stored
    x, _ = data(4, seed=3)
    np.save(tmp_path / "x.npy", x)
    out_logits = device_python(f"""
import json, numpy as np
from edgetrain.runtime import DeviceRuntime
rt = DeviceRuntime({str(out)!r})
print(json.dumps(rt.eval_logits(np.load({str(tmp_path / 'x.npy')!r})).tolist()))
""")
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name in m.plan.frozen_int8:
            q, scale = quantize_per_channel(params[name].numpy())
            params[name].copy_(torch.from_numpy(q.astype(np.float32) * scale[:, None, None]))
        expected = model.eval()(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(np.array(out_logits), expected, rtol=1e-4, atol=1e-5)


def test_int8_weights_leave_personalisation_bit_for_bit(tmp_path):
    _, m, out = export(tmp_path, True)
    x, y = data(24)
    np.savez(tmp_path / "train.npz", x=x, y=y)
    p = cli("personalise", out, "--data", tmp_path / "train.npz", "--budget", "8MiB",
            "--no-select", "--epochs", "2", "--out", tmp_path / "run", "--json")
    assert p.returncode == 0, p.stderr
    got = device_python(f"""
import json
from onnxruntime.training.api import CheckpointState
a = CheckpointState.load_checkpoint({str(out / m.files['checkpoint'].path)!r})
b = CheckpointState.load_checkpoint({str(tmp_path / 'run' / 'checkpoint')!r})
print(json.dumps({{n: a.parameters[n].data.tobytes() == b.parameters[n].data.tobytes()
                  for n in {[t.name for t in m.trainable + m.frozen]!r}}}))
""")
    assert all(got[t.name] for t in m.frozen)
    assert not any(got[t.name] for t in m.trainable)


def test_each_8bit_weight_is_rebuilt_when_its_layer_runs_and_the_cycle_is_predicted(tmp_path):
    """The eval graph (the inference model is written from it) rebuilds each 8-bit weight from
    scales tied to its layer's input, so ORT cannot rebuild them all before the first layer
    and hold them at once (exporters/passes/evalfixes.py). The predictor replays the cycle's
    eval pass and the inference check through the arena: within 1% of the allocator."""
    import onnx

    _, m, out = export(tmp_path, True)
    g = onnx.load(str(out / m.files["eval_model"].path)).graph
    producer = {o: n for n in g.node for o in n.output}
    readers = {x: n for n in g.node for x in n.input}
    rebuilt = [n for n in g.node if n.op_type == "DequantizeLinear"]
    assert sorted(n.input[0] for n in rebuilt) == sorted(f"{w}_int8" for w in m.plan.frozen_int8)
    for dq in rebuilt:
        layer = readers[dq.output[0]]
        tie = producer[dq.input[1]]  # scale + Cast(Shape(X)[0:1]) * 0
        shape = producer[producer[producer[tie.input[1]].input[0]].input[0]]
        assert tie.op_type == "Add" and shape.op_type == "Shape"
        assert shape.input[0] == layer.input[0]  # X, the layer's input
    r = cli("measure", out, "--batch", "4", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["predicted_complete"]
    assert abs(d["predicted_peak_bytes"] - d["peak_bytes"]) <= 0.01 * d["peak_bytes"]
