"""torch -> ONNX for ORT's artifact builder, with the fixes onnxruntime-training 1.19.2 needs
before it (shared/notes/ort-training.md); the fixes after it are passes
(exporters/passes/evalfixes.py, recurrentgrads.py):
  * exporting in TRAINING mode runs the model once and moves BatchNorm running stats: every
    tensor is put back, and the original values are written into the ONNX initializers;
  * ORT's gradient builder needs LayerNormalization's optional Mean and InvStdDev outputs.
Also the optimizer graph's settings, and ORT's C++ log kept off the terminal.
"""
from __future__ import annotations

import contextlib
import io
import os
import sys
import tempfile
import warnings
from pathlib import Path

import onnx
import torch
from onnx import numpy_helper

from edgetrain import names


def torch_to_onnx(model: torch.nn.Module, example_input: torch.Tensor,
                  tensors: dict[str, torch.Tensor]) -> onnx.ModelProto:
    """The legacy exporter's training-mode graph of `model`, its initializers holding
    `tensors` (name -> the values before export, which the export's forward pass moved)."""
    model = model.train()
    buf = io.BytesIO()
    with warnings.catch_warnings():  # the legacy exporter is deliberate (ORT training needs it)
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (example_input,), buf, input_names=[names.INPUT_NAME],
                          output_names=[names.LOGITS_NAME],
                          dynamic_axes={names.INPUT_NAME: {0: names.BATCH_AXIS},
                                        names.LOGITS_NAME: {0: names.BATCH_AXIS}},
                          opset_version=17, training=torch.onnx.TrainingMode.TRAINING,
                          do_constant_folding=False, dynamo=False)
    live = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    with torch.no_grad():  # the export ran the model in training mode: put every tensor back
        for n, t in tensors.items():
            live[n].copy_(t)
    fwd = onnx.load_from_string(buf.getvalue())
    inits = {i.name: i for i in fwd.graph.initializer}
    missing = [n for n in tensors if n not in inits]
    if missing:
        raise ValueError(f"tensors {missing[:5]} did not survive ONNX export under their PyTorch "
                         "names (the exporter folded or renamed them); export a module whose "
                         "parameters are used directly by supported operators")
    for n, t in tensors.items():
        inits[n].CopyFrom(numpy_helper.from_array(t.cpu().numpy(), n))
    add_optional_outputs(fwd)
    return fwd


# Optional outputs ORT's gradient builders read: LayerNormalization's Mean and InvStdDev,
# Dropout's mask.
OPTIONAL_OUTPUTS = {"LayerNormalization": ("mean", "inv_std_dev"), "Dropout": ("mask",)}


def add_optional_outputs(model: onnx.ModelProto) -> int:
    """Give every node in OPTIONAL_OUTPUTS the optional outputs its gradient needs. Returns the
    number of nodes changed."""
    changed = 0
    for node in model.graph.node:
        extra = OPTIONAL_OUTPUTS.get(node.op_type, ())
        if len(node.output) < 1 + len(extra):
            base = node.output[0]
            for k in range(len(node.output), 1 + len(extra)):
                node.output.append(f"{base}.{extra[k - 1]}")
            changed += 1
    return changed


def optimizer_settings(path: Path, lr: float) -> dict:
    """Read the optimizer's hyper-parameters from its graph, so the manifest states the truth."""
    m = onnx.load(str(path))
    node = next(n for n in m.graph.node if n.op_type == "AdamWOptimizer")
    a = {x.name: onnx.helper.get_attribute_value(x) for x in node.attribute}
    return {"type": "AdamW", "lr": lr, "beta1": round(a["alpha"], 6),
            "beta2": round(a["beta"], 6), "eps": a["epsilon"],
            "weight_decay": a["weight_decay"]}


@contextlib.contextmanager
def native_stderr_captured(log_lines: list[str] | None = None):
    """ORT's gradient builder logs every graph pass at INFO from C++, whatever Python sets.
    Capture file descriptor 2 while it runs; on failure the captured tail goes into
    `log_lines` (for the caller's error message) instead of the terminal."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as log:
        os.dup2(log.fileno(), 2)
        try:
            yield
        except BaseException:
            os.dup2(saved, 2)
            log.seek(0)
            tail = log.read().decode(errors="replace").splitlines()[-20:]
            if log_lines is not None:
                log_lines.extend(tail)
            raise
        finally:
            os.dup2(saved, 2)
            os.close(saved)
