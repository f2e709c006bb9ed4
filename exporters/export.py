"""torch.nn.Module -> edgetrain artifact (ORT training/eval/optimizer graphs, checkpoint, manifest).

Works for any module built from operators the legacy ONNX exporter and ORT's gradient builder
support. Fixes applied (shared/notes/ort-training.md):
  * exporting in TRAINING mode runs the model once and moves BatchNorm running stats: the
    original values are written back into the ONNX initializers before artifacts are built;
  * the eval graph keeps BatchNormalization's training-only outputs, which ORT then refuses to
    load: they are deleted.
"""
from __future__ import annotations

import contextlib
import copy
import dataclasses
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
from edgetrain.manifest import SCHEMA_VERSION, InputSpec, Manifest, Plan, TensorSpec, file_entry
from edgetrain.names import FILES, INPUT_NAME, LABEL_NAME, LOGITS_NAME, SIDE_FILES
from exporters.predictor import predict
from exporters.recompute import plan_and_rewrite
from exporters.sidegraphs import write_batchnorm_stats_model, write_mask_grad_model
from exporters.sparse import sparsify


def export_artifact(model: torch.nn.Module, example_input: torch.Tensor, out: str | Path, *,
                    classes: list[str] | tuple[str, ...], trainable: list[str] | None = None,
                    plan: Plan = Plan(), lr: float = 1e-3, model_name: str = "custom",
                    image_shape: tuple[int, ...] | None = None, preprocess: str = "none",
                    preprocess_args: dict | None = None, provenance: dict | None = None,
                    freeze_batchnorm: bool = False, recompute: str = "none",
                    recompute_budget_bytes: int | None = None, density: float = 1.0,
                    mask_allocation: str = "erk", mask_init: str = "magnitude",
                    mask_seed: int = 0) -> Manifest:
    """Export `model` to an artifact folder `out` and return its manifest.

    example_input: one batch [B, *sample_shape]; the batch axis is exported as dynamic.
    trainable: fully-qualified parameter names to train (default: every parameter); all other
    parameters and floating-point buffers are frozen.
    freeze_batchnorm: train with BatchNorm as a fixed affine map (running statistics frozen,
    weight and bias still trainable), as fine-tuning on small micro-batches wants; the
    tensors keep their names. Otherwise BatchNorm uses batch statistics and updates its
    running statistics during training.
    recompute: a planner of exporters.recompute.PLANNERS; its plan is written into the
    training graph and recorded in the manifest.
    density: below 1, Conv2d and Linear weights are masked to this overall density
    (exporters.sparse: per-layer allocation `mask_allocation`, first mask `mask_init`); the
    artifact then holds only the kept values and their positions (manifest `masks`).
    """
    from onnxruntime.training import artifacts  # host side only (imports torch)

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if freeze_batchnorm:
        model = freeze_batchnorm_layers(model)
    model, masks = sparsify(model, density, mask_allocation, mask_init, mask_seed)
    masked = {m.weight: m.values for m in masks}
    if trainable is not None:  # a masked weight trains as its kept values
        trainable = [masked.get(n, n) for n in trainable]
    plan = dataclasses.replace(plan, batchnorm="frozen" if freeze_batchnorm else "batch")
    params = dict(model.named_parameters())
    trainable = list(params) if trainable is None else list(trainable)
    unknown = [n for n in trainable if n not in params]
    if unknown:
        raise ValueError(f"trainable names {unknown} are not parameters of the model; "
                         f"its parameters are {list(params)[:8]}…")
    positions = {m.positions for m in masks}
    buffers = {n: b for n, b in model.named_buffers() if b.is_floating_point() or n in positions}
    frozen = [n for n in params if n not in trainable] + list(buffers)
    saved = {n: t.detach().clone() for n, t in list(params.items()) + list(buffers.items())}

    model = model.train()
    buf = io.BytesIO()
    with warnings.catch_warnings():  # the legacy exporter is deliberate (ORT training needs it)
        warnings.simplefilter("ignore")
        _export(model, example_input, buf)
    # The export ran the model in training mode; put every tensor back as it was.
    with torch.no_grad():
        for n, t in saved.items():
            (params.get(n) if n in params else buffers[n]).copy_(t)
    fwd = onnx.load_from_string(buf.getvalue())
    inits = {i.name: i for i in fwd.graph.initializer}
    missing = [n for n in trainable + frozen if n not in inits]
    if missing:
        raise ValueError(f"tensors {missing[:5]} did not survive ONNX export under their PyTorch "
                         "names (the exporter folded or renamed them); export a module whose "
                         "parameters are used directly by supported operators")
    for n, t in saved.items():
        inits[n].CopyFrom(numpy_helper.from_array(t.cpu().numpy(), n))

    with tempfile.TemporaryDirectory() as tmp, _native_stderr_captured():
        artifacts.generate_artifacts(
            fwd, requires_grad=trainable, frozen_params=frozen,
            loss=artifacts.LossType.CrossEntropyLoss, optimizer=artifacts.OptimType.AdamW,
            artifact_directory=tmp, additional_output_names=[LOGITS_NAME])
        for role, name in FILES.items():
            (out / name).write_bytes((Path(tmp) / name).read_bytes())
    _fix_eval_batchnorm(out / FILES[names.EVAL_MODEL])
    sample_shape = tuple(int(d) for d in example_input.shape[1:])
    specs = {n: TensorSpec(n, tuple(t.shape), str(t.numpy().dtype)) for n, t in saved.items()}
    trainable_specs = tuple(specs[n] for n in trainable)
    frozen_specs = tuple(specs[n] for n in frozen)

    def predicted_peak() -> int:
        return predict(out, trainable_specs, frozen_specs, plan.micro_batch, FILES,
                       plan.threads).peak_bytes

    rplan = plan_and_rewrite(str(out / FILES[names.TRAINING_MODEL]), recompute,
                             batch=plan.micro_batch, budget_bytes=recompute_budget_bytes,
                             predict_file_peak=predicted_peak)
    plan = dataclasses.replace(plan, recompute=rplan.planner, checkpoints=rplan.checkpoints,
                               recomputed=rplan.recomputed,
                               recompute_budget_bytes=recompute_budget_bytes)
    optimizer = _optimizer_settings(out / FILES[names.OPTIMIZER_MODEL], lr)
    files = dict(FILES)
    if masks:
        files[names.MASK_GRAD_MODEL] = SIDE_FILES[names.MASK_GRAD_MODEL]
        write_mask_grad_model(out / FILES[names.TRAINING_MODEL], masks,
                              out / files[names.MASK_GRAD_MODEL])
    stats = SIDE_FILES[names.BATCHNORM_STATS_MODEL]
    if write_batchnorm_stats_model(model, example_input, out / stats, set(trainable + frozen),
                                   INPUT_NAME):
        files[names.BATCHNORM_STATS_MODEL] = stats

    predicted = predict(out, trainable_specs, frozen_specs, plan.micro_batch, FILES,
                        plan.threads).to_dict()
    manifest = Manifest(
        schema_version=SCHEMA_VERSION, model=model_name,
        files={role: file_entry(out, name) for role, name in files.items()},
        input=InputSpec(name=INPUT_NAME, sample_shape=sample_shape, dtype="float32",
                        label_name=LABEL_NAME,
                        image_shape=tuple(image_shape) if image_shape else sample_shape,
                        preprocess=preprocess, preprocess_args=dict(preprocess_args or {})),
        classes=tuple(classes), trainable=trainable_specs, frozen=frozen_specs, plan=plan,
        optimizer=optimizer, predicted=predicted, provenance=dict(provenance or {}),
        masks=masks)
    manifest.write(out)
    return manifest


class FrozenBatchNorm2d(torch.nn.Module):
    """BatchNorm2d with fixed statistics: y = x * w / sqrt(var + eps) + (b - mean * scale)."""

    def __init__(self, bn: torch.nn.BatchNorm2d):
        super().__init__()
        self.weight = torch.nn.Parameter(bn.weight.detach().clone())
        self.bias = torch.nn.Parameter(bn.bias.detach().clone())
        self.register_buffer("running_mean", bn.running_mean.detach().clone())
        self.register_buffer("running_var", bn.running_var.detach().clone())
        self.eps = bn.eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [B, C, H, W]
        scale = self.weight / torch.sqrt(self.running_var + self.eps)
        shift = self.bias - self.running_mean * scale
        return x * scale.view(1, -1, 1, 1) + shift.view(1, -1, 1, 1)


def freeze_batchnorm_layers(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of `model` with every BatchNorm2d replaced by FrozenBatchNorm2d (same names)."""
    model = copy.deepcopy(model)
    for name, module in list(model.named_modules()):
        if isinstance(module, torch.nn.BatchNorm2d):
            parent_name, _, child = name.rpartition(".")
            parent = model.get_submodule(parent_name) if parent_name else model
            setattr(parent, child, FrozenBatchNorm2d(module))
    return model


@contextlib.contextmanager
def _native_stderr_captured():
    """ORT's gradient builder logs every graph pass at INFO from C++, whatever Python sets.
    Capture file descriptor 2 while it runs; show the captured tail only if it fails."""
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
            sys.stderr.write("\n".join(tail) + "\n")
            raise
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def _export(model: torch.nn.Module, example_input: torch.Tensor, buf: io.BytesIO) -> None:
    torch.onnx.export(model, (example_input,), buf, input_names=[INPUT_NAME],
                      output_names=[LOGITS_NAME],
                      dynamic_axes={INPUT_NAME: {0: names.BATCH_AXIS},
                                    LOGITS_NAME: {0: names.BATCH_AXIS}},
                      opset_version=17, training=torch.onnx.TrainingMode.TRAINING,
                      do_constant_folding=False, dynamo=False)


def _fix_eval_batchnorm(path: Path) -> None:
    m = onnx.load(str(path))
    for node in m.graph.node:
        if node.op_type == "BatchNormalization" and len(node.output) > 1:
            del node.output[1:]
    onnx.save(m, str(path))


def _optimizer_settings(path: Path, lr: float) -> dict:
    """Read the optimizer's hyper-parameters from its graph, so the manifest states the truth."""
    m = onnx.load(str(path))
    node = next(n for n in m.graph.node if n.op_type == "AdamWOptimizer")
    a = {x.name: onnx.helper.get_attribute_value(x) for x in node.attribute}
    return {"type": "AdamW", "lr": lr, "beta1": round(a["alpha"], 6),
            "beta2": round(a["beta"], 6), "eps": a["epsilon"],
            "weight_decay": a["weight_decay"]}
