"""torch -> ONNX for ORT training, with the fixes onnxruntime-training 1.19.2 needs
(shared/notes/ort-training.md):
  * exporting in TRAINING mode runs the model once and moves BatchNorm running stats: every
    tensor is put back, and the original values are written into the ONNX initializers;
  * ORT's gradient builder needs LayerNormalization's optional Mean and InvStdDev outputs;
  * the eval graph keeps BatchNormalization's training-only outputs, which ORT then refuses to
    load: they are deleted;
  * a GRUGrad/LSTMGrad whose weight gradients are not wanted (the cell frozen, something below
    it trained) kills the process (SIGSEGV): its dW and dR outputs are named, and dropped.
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
import numpy as np
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


RECURRENT_GRADS = {"GRUGrad", "LSTMGrad"}  # outputs: dX, dW, dR, dB, ...


def fix_recurrent_grads(path: Path) -> int:
    """Name the missing dW and dR outputs (1 and 2) of each GRUGrad/LSTMGrad in the training
    graph: ORT 1.19.2's kernels write them unconditionally, and crash when the gradient builder
    left them out (a frozen GRU/LSTM layer above a trained one; measured for every frozen
    subset of one layer's W, R and biases). Nothing reads the named outputs; they live only
    while the node runs. Returns how many nodes were changed."""
    m = onnx.load(str(path))
    changed = 0
    for node in m.graph.node:
        if node.op_type in RECURRENT_GRADS:
            missing = [i for i in (1, 2) if len(node.output) <= i or not node.output[i]]
            while len(node.output) < 3:
                node.output.append("")
            for i in missing:
                node.output[i] = f"{node.name}_unused_output_{i}"
            changed += bool(missing)
    if changed:
        onnx.save(m, str(path))
    return changed


def fix_eval_batchnorm(path: Path) -> None:
    m = onnx.load(str(path))
    for node in m.graph.node:
        if node.op_type == "BatchNormalization" and len(node.output) > 1:
            del node.output[1:]
    onnx.save(m, str(path))


def fix_eval_graph(eval_path: Path, training_path: Path) -> dict[str, int]:
    """The eval-graph fixes made once the training graph is final, in one load and save:
    how many declarations fix_eval_scalar_shapes corrected and how many weights
    order_eval_weight_builds tied to their layer's input."""
    m = onnx.load(str(eval_path))
    train = onnx.load(str(training_path), load_external_data=False)
    done = {"shapes": fix_eval_scalar_shapes(m, train), "ordered": order_eval_weight_builds(m)}
    if any(done.values()):
        onnx.save(m, str(eval_path))
    return done


def fix_eval_scalar_shapes(m: onnx.ModelProto, train: onnx.ModelProto) -> int:
    """Give the eval graph's tensors declared without a shape the static shape the training
    graph declares. ORT's artifact builder declares a sparse layer's flat dense weight
    (Expand's zeros, the ScatterElements into them) with no shape in the eval graph; the inference
    model exported from it keeps that, so ORT cannot run the scatter in place there and holds
    the dense weight twice during the end-of-run inference check (measured: 4 MiB more on
    the full-width patch MobileNet). In place; returns how many declarations were corrected."""
    shaped = {v.name: v for v in train.graph.value_info
              if v.type.tensor_type.shape.dim and all(d.HasField("dim_value")
                                                      for d in v.type.tensor_type.shape.dim)}
    fixed = 0
    for v in m.graph.value_info:
        t = v.type.tensor_type
        if not t.shape.dim and v.name in shaped and (
                shaped[v.name].type.tensor_type.elem_type == t.elem_type):
            v.CopyFrom(shaped[v.name])
            fixed += 1
    return fixed


VIEW_OPS = ("Reshape", "Transpose", "Squeeze", "Unsqueeze", "Identity", "Flatten")


def order_eval_weight_builds(m: onnx.ModelProto) -> int:
    """Make each sparse layer's dense weight, in the eval graph, wait for its layer's input.

    The eval graph builds a masked weight from initializers alone (Expand zeros, scatter the
    kept values), so ORT may build every layer's weight before the first layer runs and hold
    them all: the end-of-run inference check, which runs the model exported from this graph
    without a memory pattern, then grew ResNet-50's arena (C4) by 41.9 MB. The zeros' scalar
    is rebuilt as Cast(Shape(X)[0:1]) * 0, X being the layer's input (a shape is always
    finite, so it is exactly 0), and the weight can then be built only once X exists, just
    before it is read. In place; returns how many weights were tied to their input."""
    g = m.graph
    producer = {o: n for n in g.node for o in n.output if o}
    readers: dict[str, list] = {}
    for n in g.node:
        for k, x in enumerate(n.input):
            readers.setdefault(x, []).append((n, k))
    zero = "edgetrain_eval_zero"
    tied = 0
    for n in list(g.node):
        if n.op_type != "ScatterElements" or not n.input[1].endswith(
                names.MASK_POSITIONS_SUFFIX):
            continue
        expand = producer.get(n.input[0])
        if expand is None or expand.op_type != "Expand":
            continue
        t = n.output[0]
        while len(readers.get(t, [])) == 1 and readers[t][0][0].op_type in VIEW_OPS:
            t = readers[t][0][0].output[0]
        if len(readers.get(t, [])) != 1:
            continue
        layer, k = readers[t][0]
        data = layer.input[1 if k == 0 else 0] if len(layer.input) > 1 else ""
        if not data or data == t:
            continue
        base = f"{expand.output[0]}_after_input"
        if not tied:
            g.initializer.append(numpy_helper.from_array(
                np.zeros((), np.float32), zero))
        new = [onnx.helper.make_node("Shape", [data], [f"{base}_shape"], start=0, end=1,
                                     name=f"{base}/shape"),
               onnx.helper.make_node("Cast", [f"{base}_shape"], [f"{base}_float"],
                                     to=onnx.TensorProto.FLOAT, name=f"{base}/cast"),
               onnx.helper.make_node("Mul", [f"{base}_float", zero], [base], name=f"{base}/zero")]
        at = list(g.node).index(expand)
        for j, node in enumerate(new):
            g.node.insert(at + j, node)
        expand.input[0] = base
        tied += 1
    return tied


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
