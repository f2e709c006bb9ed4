"""A static prediction of a training step's peak bytes, written into the manifest.

A prediction, labelled as one. Exact parts: parameters, gradients and AdamW's two moments,
each tensor rounded to the runtime arena's 256-byte chunk, and the runtime's three scalars.
Estimated part: activations = the output of every leaf module at the micro-batch (what
backward keeps alive) plus the largest two of them (backward's working set).
"""
from __future__ import annotations

import torch

from device_sim.cap import RUNTIME_SCALAR_BYTES, arena_rounded
from edgetrain.manifest import TensorSpec


def predict_memory(model: torch.nn.Module, example_input: torch.Tensor,
                   trainable: tuple[TensorSpec, ...], frozen: tuple[TensorSpec, ...],
                   micro_batch: int) -> dict:
    outs: list[int] = []

    def hook(_m, _i, o):
        if isinstance(o, torch.Tensor):
            outs.append(o.numel() * o.element_size())

    leaves = [m for m in model.modules() if not list(m.children())]
    handles = [m.register_forward_hook(hook) for m in leaves]
    x = torch.zeros((1, *example_input.shape[1:]), dtype=example_input.dtype)  # one sample
    was_training = model.training
    state = {k: v.clone() for k, v in model.state_dict().items()}
    try:
        with torch.no_grad():
            model.eval()(x)
    finally:
        for h in handles:
            h.remove()
        model.load_state_dict(state)
        model.train(was_training)
    per_sample = sum(outs) + x.numel() * x.element_size() + sum(sorted(outs)[-2:])
    grads = sum(arena_rounded(t.nbytes) for t in trainable)
    fixed = {
        "parameters": sum(arena_rounded(t.nbytes) for t in trainable + frozen),
        "gradients": grads,
        "optimizer_state": 2 * grads,
        "activations": 0,
        "other": RUNTIME_SCALAR_BYTES,
    }
    peak = sum(fixed.values()) + per_sample * micro_batch
    return {"batch": micro_batch, "peak_bytes": peak, "fixed_breakdown": fixed,
            "activation_bytes_per_sample": per_sample,
            "method": "exact parameters/gradients/AdamW moments; activations = leaf-module "
                      "outputs per sample (coarse)"}
