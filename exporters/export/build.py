"""One artifact built into an empty folder: the torch side, the forward passes, ORT's artifact
builder, the artifact passes (exporters/passes/), the manifest.

export_artifact (artifact.py) calls build_artifact inside a temporary folder and renames it
into place when the manifest is complete; the budget recompute planner may call it again
with a smaller planning budget (dryrun.export_within_budget).
"""
from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path

import onnx
import torch

from edgetrain import names
from edgetrain.manifest import SCHEMA_VERSION, InputSpec, Manifest, TensorSpec, file_entry
from edgetrain.names import FILES, INPUT_NAME, LABEL_NAME, LOGITS_NAME
from exporters.export.dryrun import dry_run_artifact
from exporters.export.logits import check_logits
from exporters.export.operators import (check_device_graphs, check_loads, check_operators,
                                        explain_artifact_failure)
from exporters.export.options import ExportOptions
from exporters.export.torchonnx import native_stderr_captured, optimizer_settings, torch_to_onnx
from exporters.models.norms import freeze_batchnorm_layers
from exporters.models.rewrites import rewrite_for_training
from exporters.passes import ARTIFACT_PASSES, FORWARD_PASSES, Context, Graphs, run_passes
from exporters.passes.densebuild import DENSE_BUILDS
from exporters.passes.sparsegrad import WEIGHT_GRADS
from exporters.plans import updateplans
from exporters.plans.preflight import choose_preflight_order
from exporters.plans.quantize import quantize_frozen_weights
from exporters.plans.sparse import dense_reasons, sparsify
from exporters.plans.updateplans import first_use
from exporters.predictor import predict
from exporters.predictor.cost import step_cost


@dataclasses.dataclass(frozen=True)
class ModelInfo:
    """What the manifest says about the model besides the plan: its classes, name, input
    (image_shape, preprocess and its arguments, layout: one letter an axis) and provenance."""
    classes: tuple[str, ...]
    model_name: str = "custom"
    image_shape: tuple[int, ...] | None = None
    preprocess: str = "none"
    preprocess_args: dict | None = None
    provenance: dict | None = None
    layout: str | None = None


def build_artifact(out: Path, model: torch.nn.Module, example_input: torch.Tensor,
                   options: ExportOptions, info: ModelInfo,
                   planning_budget_bytes: int | None = None) -> Manifest:
    """The artifact of `model` written into the empty folder `out`; a budget recompute plan is
    planned for `planning_budget_bytes` and runs capped at the options' budget."""
    from onnxruntime.training import artifacts  # host side only (imports torch)

    plan = options.plan
    if plan.weight_grad not in WEIGHT_GRADS:
        raise ValueError(f"weight gradient {plan.weight_grad!r} is not one of {WEIGHT_GRADS}; "
                         "'kept' computes a masked layer's gradient at its kept weights only")
    if plan.dense_build not in DENSE_BUILDS:
        raise ValueError(f"dense build {plan.dense_build!r} is not one of {DENSE_BUILDS}")
    model = rewrite_for_training(model)
    if options.freeze_batchnorm:
        model = freeze_batchnorm_layers(model)
    dense_shapes = {n: tuple(p.shape) for n, p in model.named_parameters()}
    model, masks = sparsify(model, options.density, options.mask_allocation, options.mask_init,
                            options.mask_seed)
    masked = {m.weight: m.values for m in masks}
    update = options.update
    plan = dataclasses.replace(
        plan, batchnorm="frozen" if options.freeze_batchnorm else "batch",
        update=update or ("all" if options.trainable is None else "names"),
        recompute=options.recompute, recompute_budget_bytes=options.recompute_budget_bytes,
        recompute_time_ratio=(float(options.recompute_time_ratio)
                              if options.recompute == "optimal" else None))
    params = dict(model.named_parameters())
    trainable = (list(params) if options.trainable is None  # a masked weight trains as its values
                 else [masked.get(n, n) for n in options.trainable])
    if not trainable:
        raise ValueError("nothing to train: the model has no parameters (or the trainable list "
                         "is empty); personalisation trains parameters. Nothing was written.")
    unknown = [n for n in trainable if n not in params]
    if unknown:
        raise ValueError(f"trainable names {unknown} are not parameters of the model; "
                         f"its parameters are {list(params)[:8]}…")
    positions = {m.positions for m in masks}
    buffers = {n: b for n, b in model.named_buffers() if b.is_floating_point() or n in positions}
    frozen = [n for n in params if n not in trainable] + list(buffers)
    saved = {n: t.detach().clone() for n, t in list(params.items()) + list(buffers.items())}
    sample_shape = tuple(int(d) for d in example_input.shape[1:])
    input_spec = InputSpec(name=INPUT_NAME, sample_shape=sample_shape, dtype="float32",
                           label_name=LABEL_NAME,
                           image_shape=tuple(info.image_shape) if info.image_shape
                           else sample_shape, preprocess=info.preprocess,
                           preprocess_args=dict(info.preprocess_args or {}),
                           layout=info.layout if info.layout is not None else
                           ("CHW" if len(sample_shape) == 3 else ""))
    fwd = torch_to_onnx(model, example_input, saved)
    check_logits(fwd, len(info.classes))
    check_operators(fwd)
    if update is not None:
        use = first_use(fwd.graph, list(dense_shapes))
        use.update({n: updateplans.first_layer_use(fwd.graph, v) for n, v in masked.items()})
        trainable = [masked.get(n, n) for n in updateplans.resolve(update, dense_shapes, use)]
        frozen = [n for n in params if n not in trainable] + list(buffers)
        if not trainable:
            raise ValueError(f"update plan {update!r} trains no parameter of this model; choose "
                             "one that does (all, head, last:K or parameter names)")
    int8 = {}
    if options.int8_frozen:
        if masks:
            raise ValueError("--int8-frozen stores dense frozen weights in 8 bits; a sparse "
                             "artifact (--density below 1) is not supported")
        int8 = quantize_frozen_weights(fwd, [n for n in frozen if n in params], saved)
        frozen = [n for n in frozen if n not in int8] + [t for pair in int8.values() for t in pair]
        plan = dataclasses.replace(plan, frozen_int8=tuple(int8))
    specs = {n: TensorSpec(n, tuple(t.shape), str(t.numpy().dtype)) for n, t in saved.items()}
    trainable_specs = tuple(specs[n] for n in trainable)
    frozen_specs = tuple(specs[n] for n in frozen)

    ctx = Context(folder=out, plan=plan, target=options.target, nchwc=bool(options.nchwc),
                  options=options, trainable=frozenset(trainable),
                  masks=tuple(k for k in masks if k.values in trainable),  # others stay
                  torch_model=model, example_input=example_input,
                  state_names=frozenset(trainable + frozen), int8=bool(int8),
                  planning_budget_bytes=planning_budget_bytes,
                  predictor=lambda folder: predict(folder, trainable_specs, frozen_specs,
                                                   plan.micro_batch, FILES, plan.threads,
                                                   step_only=True),
                  cycle_predictor=lambda folder: predict(folder, trainable_specs,
                                                         frozen_specs, plan.micro_batch,
                                                         FILES, plan.threads))
    graphs = Graphs(forward=fwd)
    changed = run_passes(FORWARD_PASSES, graphs, ctx)
    build_training_graphs(out, graphs.forward, trainable, frozen, artifacts)
    check_loads(out, FILES, graphs.forward)  # a kernel ORT lacks fails before any work (the
    # dry run opens the finished artifact)
    graphs.training = onnx.load(str(out / FILES[names.TRAINING_MODEL]))
    graphs.eval = onnx.load(str(out / FILES[names.EVAL_MODEL]))
    changed.update(run_passes(ARTIFACT_PASSES, graphs, ctx))
    plan = ctx.plan
    files = {**FILES, **graphs.write(out)}
    check_device_graphs(out, files)
    predicted = {**predict(out, trainable_specs, frozen_specs, plan.micro_batch, FILES,
                           plan.threads).to_dict(),  # and the step's cost, for the watchdog
                 "step_flops": step_cost(str(out / FILES[names.TRAINING_MODEL]), plan.micro_batch,
                                         sum(t.nbytes // 4 for t in trainable_specs)).flops}
    manifest = Manifest(
        schema_version=SCHEMA_VERSION, model=info.model_name,
        files={role: file_entry(out, name) for role, name in files.items()},
        input=input_spec, classes=tuple(info.classes), trainable=trainable_specs,
        frozen=frozen_specs, plan=plan,
        optimizer=optimizer_settings(out / FILES[names.OPTIMIZER_MODEL], options.lr),
        predicted=predicted, provenance={**(info.provenance or {}), "passes": changed},
        masks=masks,
        dense_weights=dense_reasons(model, {k.weight for k in masks}) if masks else {})
    manifest = choose_preflight_order(out, manifest)
    manifest.write(out)
    dry_run_artifact(out, manifest, options.recompute_budget_bytes
                     if options.recompute == "budget" else None)
    return manifest


def build_training_graphs(out: Path, forward: onnx.ModelProto, trainable: list[str],
                          frozen: list[str], artifacts) -> None:
    """ORT's artifact builder on `forward`: the training, eval and optimizer graphs and the
    checkpoint, copied into `out` under the contract's file names."""
    from onnxruntime.training.onnxblock import _graph_utils

    # onnxblock names the nodes it adds with a counter that lives as long as the process
    # ("onnx::AdamWOptimizer::6"): started again, an export's bytes depend on its options
    # alone, not on how many artifacts this process built before (tests/test_pipeline.py)
    _graph_utils._GRAPH_TOKEN = 0
    log: list[str] = []
    try:
        with tempfile.TemporaryDirectory() as tmp, native_stderr_captured(log):
            artifacts.generate_artifacts(
                forward, requires_grad=trainable, frozen_params=frozen,
                loss=artifacts.LossType.CrossEntropyLoss, optimizer=artifacts.OptimType.AdamW,
                artifact_directory=tmp, additional_output_names=[LOGITS_NAME])
            for name in FILES.values():
                (out / name).write_bytes((Path(tmp) / name).read_bytes())
    except Exception as e:
        raise explain_artifact_failure(e, forward, log) from e
