"""torch.nn.Module -> edgetrain artifact (ORT training/eval/optimizer graphs, checkpoint, manifest).

Works for any module built from operators the legacy ONNX exporter and ORT's gradient builder
support (docs/byom.md lists them); anything else is refused with the module, the operator and
what to use instead (exporters/operators.py). The fixes ORT needs are in onnxfixes.py.
An export is atomic: everything is written into a temporary folder beside `out`, which is
renamed to `out` only when the manifest is complete; a failure leaves no folder behind.
"""
from __future__ import annotations

import dataclasses
import shutil
import tempfile
from pathlib import Path

import torch

from edgetrain import names, signing
from edgetrain.manifest import SCHEMA_VERSION, InputSpec, Manifest, Plan, TensorSpec, file_entry
from edgetrain.names import FILES, INPUT_NAME, LABEL_NAME, LOGITS_NAME, SIDE_FILES
from exporters.arguments import (check_export_arguments, replace_folder, resolve_target,
                                 work_folder)
from exporters.convbn import fold_conv_batchnorms
from exporters.cost import step_cost
from exporters.dryrun import dry_run_artifact, export_within_budget
from exporters.densebuild import DENSE_BUILDS, rewrite_dense_builds_file
from exporters.gradkernels import rewrite_training_model
from exporters.logits import check_logits
from exporters.nchwc import host_block, rewrite_nchwc_file
from exporters.pointwisegrad import rewrite_pointwise_grads_file
from exporters.norms import freeze_batchnorm_layers
from exporters.onnxfixes import (fix_eval_batchnorm, fix_eval_graph, fix_recurrent_grads,
                                 native_stderr_captured, optimizer_settings, torch_to_onnx)
from exporters.operators import (check_device_graphs, check_loads, check_operators,
                                 explain_artifact_failure)
from exporters.predictor import predict
from exporters.predictor.evaluated import forward_shapes
from exporters.predictor.scratch import MLAS_CONV_BUFFER_FLOATS_PER_THREAD
from exporters.recompute import plan_and_rewrite
from exporters.rewrites import rewrite_for_training
from exporters.sidegraphs import write_batchnorm_stats_model, write_mask_grad_model
from exporters.quantize import quantize_frozen_weights
from exporters.sparsegrad import WEIGHT_GRADS, rewrite_masked_pointwise_grads_file
from exporters.sparse import dense_reasons, int32_scatter_indices, sparsify
from exporters import updateplans
from exporters.updateplans import first_use


# A recompute plan must save at least one MLAS convolution buffer per thread (16384 floats):
# recomputed convolutions in backward can need a buffer region of that size of their own, so
# a smaller predicted saving may turn into a measured loss (seen on small 1-D CNNs).
MIN_RECOMPUTE_SAVING_BYTES_PER_THREAD = MLAS_CONV_BUFFER_FLOATS_PER_THREAD * 4


def export_artifact(model: torch.nn.Module, example_input: torch.Tensor, out: str | Path, *,
                    classes: list[str] | tuple[str, ...], trainable: list[str] | None = None,
                    plan: Plan = Plan(), lr: float = 1e-3, model_name: str = "custom",
                    image_shape: tuple[int, ...] | None = None, preprocess: str = "none",
                    preprocess_args: dict | None = None, provenance: dict | None = None,
                    freeze_batchnorm: bool = False, recompute: str = "none",
                    recompute_budget_bytes: int | None = None, density: float = 1.0,
                    mask_allocation: str = "erk", mask_init: str = "magnitude",
                    mask_seed: int = 0, layout: str | None = None,
                    update: str | None = None, int8_frozen: bool = False,
                    nchwc: bool | None = None, sign_key: str | Path | None = None,
                    target: str | None = None) -> Manifest:
    """Export `model` to an artifact folder `out` and return its manifest.

    example_input: one batch [B, *sample_shape]; the batch axis is exported as dynamic.
    trainable: fully-qualified parameter names to train (default: every parameter); all other
    parameters and floating-point buffers are frozen.
    update: an update plan instead of `trainable` (exporters/updateplans.py: "all", "head",
    "bias", "last:K", names or module prefixes, comma-separated); recorded in the plan.
    int8_frozen: store frozen weights of two or more dims in 8 bits (exporters/quantize.py);
    the plan lists them (`frozen_int8`).
    freeze_batchnorm: train with BatchNorm as a fixed affine map (running statistics frozen,
    weight and bias still trainable), as fine-tuning on small micro-batches wants; the
    tensors keep their names. Otherwise BatchNorm uses batch statistics and updates its
    running statistics during training.
    recompute: a planner of exporters.recompute.PLANNERS; its plan is written into the
    training graph and recorded in the manifest.
    density: below 1, Conv2d and Linear weights are masked to this overall density
    (exporters.sparse: per-layer allocation `mask_allocation`, first mask `mask_init`); the
    artifact then holds only the kept values and their positions (manifest `masks`).
    layout: the sample's axes, one letter each ("CHW", "CT", "TF"); default "CHW" for a 3-D
    sample, else unnamed.
    target: what runs it (edgetrain/targets.py): "portable" by default (any ORT 1.19.2 CPU
    build: a watch), "arm64", or "host" (this machine's kernels too); plan.target records it.
    nchwc: run the training graph's 2-D depthwise convolutions in ONNX Runtime's NCHWc
    kernels of this machine's block, the host target's default and its alone
    (exporters/nchwc.py; plan.nchwc_block records the block,
    0 when none was rewritten). sign_key: an Ed25519 private key file (edgetrain/signing.py).
    """
    out = Path(out)
    check_export_arguments(example_input, out, classes, lr, layout)
    key = signing.private_key(sign_key) if sign_key is not None else None  # before any work
    target, nchwc = resolve_target(target, nchwc)
    plan = dataclasses.replace(plan, target=target)
    out.parent.mkdir(parents=True, exist_ok=True)
    work = work_folder(out)  # and what a killed export to `out` left is swept
    args = dict(classes=classes, trainable=trainable, plan=plan, lr=lr, model_name=model_name,
                image_shape=image_shape, preprocess=preprocess, preprocess_args=preprocess_args,
                provenance=provenance, freeze_batchnorm=freeze_batchnorm, recompute=recompute,
                recompute_budget_bytes=recompute_budget_bytes, density=density,
                mask_allocation=mask_allocation, mask_init=mask_init, mask_seed=mask_seed,
                layout=layout, update=update, int8_frozen=int8_frozen, nchwc=nchwc)
    try:
        manifest = export_within_budget(  # a budget plan that overruns: planned again
            lambda target: _export_into(work, model, example_input, **args,
                                        planning_budget_bytes=target),
            lambda: (shutil.rmtree(work), work.mkdir()), recompute_budget_bytes)
        if key is not None:
            signing.sign(work, key)  # manifest.sig: the manifest's bytes, signed
        replace_folder(work, out)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return manifest


def late_rewrites(train: Path, plan: Plan, nchwc: bool) -> tuple[int, int, int, int]:
    """The training graph's last rewrites, in place: dense weights as one MaxUnpool each
    (plan.dense_build), pointwise gradients split, depthwise weight gradients stacked and
    depthwise convolutions in NCHWc kernels. Returns how many of each were rewritten."""
    unpools = rewrite_dense_builds_file(train) if plan.dense_build == "unpool" else 0
    split = rewrite_pointwise_grads_file(train)
    return unpools, split, *(rewrite_nchwc_file(train, plan.micro_batch) if nchwc else (0, 0))


def _export_into(out: Path, model: torch.nn.Module, example_input: torch.Tensor, *, classes,
                 trainable, plan: Plan, lr: float, model_name: str, image_shape, preprocess,
                 preprocess_args, provenance, freeze_batchnorm: bool, recompute: str,
                 recompute_budget_bytes, density: float, mask_allocation: str, mask_init: str,
                 mask_seed: int, layout: str | None, update: str | None,
                 int8_frozen: bool, nchwc: bool, planning_budget_bytes=None) -> Manifest:
    """export_artifact's work, written into the (empty, temporary) folder `out`; a budget
    recompute plan is planned for `planning_budget_bytes` and runs capped at the budget."""
    from onnxruntime.training import artifacts  # host side only (imports torch)

    if update is not None and trainable is not None:
        raise ValueError("give an update plan or a list of trainable names, not both")
    if plan.weight_grad not in WEIGHT_GRADS:
        raise ValueError(f"weight gradient {plan.weight_grad!r} is not one of {WEIGHT_GRADS}; "
                         "'kept' computes a masked layer's gradient at its kept weights only")
    if plan.dense_build not in DENSE_BUILDS:
        raise ValueError(f"dense build {plan.dense_build!r} is not one of {DENSE_BUILDS}")
    model = rewrite_for_training(model)
    if freeze_batchnorm:
        model = freeze_batchnorm_layers(model)
    dense_shapes = {n: tuple(p.shape) for n, p in model.named_parameters()}
    model, masks = sparsify(model, density, mask_allocation, mask_init, mask_seed)
    masked = {m.weight: m.values for m in masks}
    plan = dataclasses.replace(plan, batchnorm="frozen" if freeze_batchnorm else "batch",
                               update=update or ("all" if trainable is None else "names"))
    params = dict(model.named_parameters())
    # a masked weight trains as its kept values
    trainable = list(params) if trainable is None else [masked.get(n, n) for n in trainable]
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
                           image_shape=tuple(image_shape) if image_shape else sample_shape,
                           preprocess=preprocess, preprocess_args=dict(preprocess_args or {}),
                           layout=layout if layout is not None else
                           ("CHW" if len(sample_shape) == 3 else ""))
    fwd = torch_to_onnx(model, example_input, saved)
    check_logits(fwd, len(classes))
    check_operators(fwd)
    if update is not None:
        use = first_use(fwd.graph, list(dense_shapes))
        use.update({n: updateplans.first_layer_use(fwd.graph, v) for n, v in masked.items()})
        trainable = updateplans.resolve(update, dense_shapes, use)
        trainable = [masked.get(n, n) for n in trainable]  # a masked weight trains as its values
        frozen = [n for n in params if n not in trainable] + list(buffers)
        if not trainable:
            raise ValueError(f"update plan {update!r} trains no parameter of this model; choose "
                             "one that does (all, head, last:K or parameter names)")
    int8 = {}
    if int8_frozen:
        if masks:
            raise ValueError("--int8-frozen stores dense frozen weights in 8 bits; a sparse "
                             "artifact (--density below 1) is not supported")
        int8 = quantize_frozen_weights(fwd, [n for n in frozen if n in params], saved)
        frozen = [n for n in frozen if n not in int8] + [t for pair in int8.values() for t in pair]
        plan = dataclasses.replace(plan, frozen_int8=tuple(int8))

    folded = fold_conv_batchnorms(fwd, plan.micro_batch, set(trainable))
    index_casts = int32_scatter_indices(fwd)
    log: list[str] = []
    try:
        with tempfile.TemporaryDirectory() as tmp, native_stderr_captured(log):
            artifacts.generate_artifacts(
                fwd, requires_grad=trainable, frozen_params=frozen,
                loss=artifacts.LossType.CrossEntropyLoss, optimizer=artifacts.OptimType.AdamW,
                artifact_directory=tmp, additional_output_names=[LOGITS_NAME])
            for role, name in FILES.items():
                (out / name).write_bytes((Path(tmp) / name).read_bytes())
    except Exception as e:
        raise explain_artifact_failure(e, fwd, log) from e
    check_loads(out, FILES, fwd)  # a kernel ORT lacks fails before any work (the dry run opens
    # the finished artifact)
    fix_eval_batchnorm(out / FILES[names.EVAL_MODEL])
    fix_recurrent_grads(out / FILES[names.TRAINING_MODEL])
    specs = {n: TensorSpec(n, tuple(t.shape), str(t.numpy().dtype)) for n, t in saved.items()}
    trainable_specs = tuple(specs[n] for n in trainable)
    frozen_specs = tuple(specs[n] for n in frozen)

    def predicted_peak() -> int | None:
        p = predict(out, trainable_specs, frozen_specs, plan.micro_batch, FILES, plan.threads)
        return p.peak_bytes if p.complete else None

    gradient_rewrites = rewrite_training_model(out / FILES[names.TRAINING_MODEL],
                                               plan.micro_batch, plan.threads, predicted_peak)

    if recompute == "budget":
        first = predict(out, trainable_specs, frozen_specs, plan.micro_batch, FILES,
                        plan.threads)
        if not first.complete:
            raise ValueError(f"--recompute budget plans by the static prediction, and the "
                             f"predictor {first.caveat()}. Use --recompute sqrt, or find a "
                             "micro-batch that fits with `edgetrain fit` (capped runs). Nothing "
                             "was written.")

    try:
        known = forward_shapes(str(out / FILES[names.EVAL_MODEL]), plan.micro_batch)
    except Exception:  # noqa: BLE001 - shapes then come from ONNX inference alone
        known = None
    def predicted_peak_as_shipped() -> int | None:
        """predicted_peak with the export's last rewrites applied to the training graph, then
        undone: the budget recompute planner judges each plan as it will run."""
        train = out / FILES[names.TRAINING_MODEL]
        written = train.read_bytes()
        try:
            late_rewrites(train, plan, nchwc)
            return predicted_peak()
        finally:
            train.write_bytes(written)

    rplan = plan_and_rewrite(str(out / FILES[names.TRAINING_MODEL]), recompute,
                             batch=plan.micro_batch, budget_bytes=planning_budget_bytes,
                             predict_file_peak=predicted_peak_as_shipped
                             if recompute == "budget" else predicted_peak, known_shapes=known,
                             min_saving_bytes=MIN_RECOMPUTE_SAVING_BYTES_PER_THREAD
                             * plan.threads)
    plan = dataclasses.replace(plan, recompute=rplan.planner, checkpoints=rplan.checkpoints,
                               recomputed=rplan.recomputed,
                               recompute_budget_bytes=recompute_budget_bytes,
                               recompute_note=rplan.note)
    optimizer = optimizer_settings(out / FILES[names.OPTIMIZER_MODEL], lr)
    files = dict(FILES)
    trained_masks = tuple(k for k in masks if k.values in trainable)  # others stay as they are
    if trained_masks:
        files[names.MASK_GRAD_MODEL] = SIDE_FILES[names.MASK_GRAD_MODEL]
        write_mask_grad_model(out / FILES[names.TRAINING_MODEL], trained_masks,
                              out / files[names.MASK_GRAD_MODEL])
    if plan.weight_grad == "kept":
        gradient_rewrites["ConvGrad_masked_pointwise"] = rewrite_masked_pointwise_grads_file(
            out / FILES[names.TRAINING_MODEL], plan.micro_batch)
    stats = SIDE_FILES[names.BATCHNORM_STATS_MODEL]
    if not int8 and write_batchnorm_stats_model(model, example_input, out / stats,
                                                set(trainable + frozen), INPUT_NAME):
        files[names.BATCHNORM_STATS_MODEL] = stats

    fix_eval_graph(out / FILES[names.EVAL_MODEL], out / FILES[names.TRAINING_MODEL])
    dense_unpools, split, stacked, nchwc_convs = late_rewrites(
        out / FILES[names.TRAINING_MODEL], plan, nchwc)
    gradient_rewrites.update((k, n) for k, n in (("ConvGrad_pointwise_split", split), (
        "ConvGrad_depthwise_weight_stacked", stacked), ("Conv_nchwc", nchwc_convs)) if n)
    if nchwc_convs or stacked:  # blocked layouts in the graph: the block is recorded
        plan = dataclasses.replace(plan, nchwc_block=host_block())
    check_device_graphs(out, files)
    predicted = {**predict(out, trainable_specs, frozen_specs, plan.micro_batch, FILES,
                           plan.threads).to_dict(),  # and the step's cost, for the watchdog
                 "step_flops": step_cost(str(out / FILES[names.TRAINING_MODEL]), plan.micro_batch,
                                         sum(t.nbytes // 4 for t in trainable_specs)).flops}
    manifest = Manifest(
        schema_version=SCHEMA_VERSION, model=model_name,
        files={role: file_entry(out, name) for role, name in files.items()},
        input=input_spec,
        classes=tuple(classes), trainable=trainable_specs, frozen=frozen_specs, plan=plan,
        optimizer=optimizer, predicted=predicted,
        provenance={**(provenance or {}), "gradient_rewrites": gradient_rewrites,
                    "folded_conv_batchnorms": folded,
                    "int32_scatter_indices": index_casts,
                    "dense_weight_unpools": dense_unpools},
        masks=masks,
        dense_weights=dense_reasons(model, {k.weight for k in masks}) if masks else {})
    manifest.write(out)
    dry_run_artifact(out, manifest, recompute_budget_bytes if recompute == "budget" else None)
    return manifest
