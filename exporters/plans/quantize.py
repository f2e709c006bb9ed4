"""Frozen weights in 8 bits: a quarter of their bytes, where the accuracy holds.

A frozen weight never changes on the device, so it can be stored as int8 with one float32
scale per output channel (symmetric, axis 0: scale = max |w| / 127 of that channel) and turned
back into float32 by a DequantizeLinear node in front of the layer that reads it. The
artifact then holds `<w>_int8` (the weight's shape, int8) and `<w>_scale` ([out channels],
float32) instead of `<w>`, both frozen; the node's output keeps the PyTorch name `<w>`, so
the rest of the graph is unchanged. Trainable weights stay float32.

What it costs at run time: the float32 weight is rebuilt in every forward pass, one layer at a
time (an activation-sized temporary, freed once the layer has run unless backward needs it for
the gradient of the layer's input). `export --int8-frozen` measures the population model's
accuracy on its held-out user before and after and records both in the manifest.
"""
from __future__ import annotations

import copy

import numpy as np
import onnx
import torch
from onnx import helper, numpy_helper

INT8_SUFFIX, SCALE_SUFFIX = "_int8", "_scale"


def quantize_per_channel(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(int8 values, float32 scale per output channel): w ~ q * scale[:, None, ...]."""
    flat = np.abs(w.reshape(w.shape[0], -1)).max(axis=1).astype(np.float32)
    scale = np.where(flat > 0, flat / 127.0, 1.0).astype(np.float32)
    q = np.clip(np.round(w / scale.reshape(-1, *([1] * (w.ndim - 1)))), -127, 127)
    return q.astype(np.int8), scale


def quantize_frozen_weights(fwd: onnx.ModelProto, names: list[str],
                            saved: dict[str, torch.Tensor]) -> dict[str, tuple[str, str]]:
    """Store each weight of `names` (float32, two or more dims, an initializer of `fwd`) in
    8 bits. Rewrites `fwd` and `saved` (the tensors the checkpoint will hold) in place.
    Returns {weight: (int8 tensor name, scale tensor name)}."""
    inits = {i.name: i for i in fwd.graph.initializer}
    done: dict[str, tuple[str, str]] = {}
    nodes = []
    for name in names:
        w = saved[name].detach().cpu().numpy()
        if w.ndim < 2 or w.dtype != np.float32 or name not in inits:
            continue
        q, scale = quantize_per_channel(w)
        q_name, s_name = name + INT8_SUFFIX, name + SCALE_SUFFIX
        fwd.graph.initializer.remove(inits[name])
        fwd.graph.initializer.extend([numpy_helper.from_array(q, q_name),
                                      numpy_helper.from_array(scale, s_name)])
        nodes.append(helper.make_node("DequantizeLinear", [q_name, s_name], [name], axis=0,
                                      name=f"dequantize/{name}"))
        del saved[name]
        saved[q_name], saved[s_name] = torch.from_numpy(q), torch.from_numpy(scale)
        done[name] = (q_name, s_name)
    for i, node in enumerate(nodes):  # before every reader: at the head of the graph
        fwd.graph.node.insert(i, node)
    return done


def fidelity(model: torch.nn.Module, names: tuple[str, ...], X: torch.Tensor, y: torch.Tensor
             ) -> dict:
    """Accuracy of `model` on (X, y) with float32 weights and with `names` rounded to 8 bits
    as the artifact stores them, and how often the two predict the same."""
    rounded = copy.deepcopy(model)
    params = dict(rounded.named_parameters())
    with torch.no_grad():
        for name in names:
            q, scale = quantize_per_channel(params[name].detach().cpu().numpy())
            params[name].copy_(torch.from_numpy(
                q.astype(np.float32) * scale.reshape(-1, *([1] * (q.ndim - 1)))))
    before, after = _predictions(model, X), _predictions(rounded, X)
    truth = y.numpy()
    return {"windows": len(y), "accuracy_float32": round(float(np.mean(before == truth)), 4),
            "accuracy_int8": round(float(np.mean(after == truth)), 4),
            "agreement": round(float(np.mean(before == after)), 4)}


def _predictions(m: torch.nn.Module, X: torch.Tensor) -> np.ndarray:
    m.eval()
    with torch.no_grad():
        return torch.stack([m(X[i]).mean(0) for i in range(len(X))]).argmax(1).numpy()
