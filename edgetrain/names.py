"""Every name of the artifact contract, in one place: file roles and file names, graph inputs
and outputs, and the suffixes that tie a tensor to its gradient, its sparse parts, its
recomputed copy. The exporter writes these names, the runtime reads them; neither spells them
out again. (As ORT's `training/api` keeps one object per file: one role per file.)
"""
from __future__ import annotations

MANIFEST_NAME = "manifest.json"
SIGNATURE_NAME = "manifest.sig"  # an Ed25519 signature of the manifest's bytes (signing.py)

# File roles -> the file names the exporter writes. The runtime reads file names from the
# manifest only; these are what the exporter chooses.
TRAINING_MODEL, EVAL_MODEL, OPTIMIZER_MODEL, CHECKPOINT = (
    "training_model", "eval_model", "optimizer_model", "checkpoint")
MASK_GRAD_MODEL, BATCHNORM_STATS_MODEL = "mask_grad_model", "batchnorm_stats_model"
BATCHNORM_MOMENTS_MODEL = "batchnorm_moments_model"
REQUIRED_ROLES = (TRAINING_MODEL, EVAL_MODEL, OPTIMIZER_MODEL, CHECKPOINT)
MODULE_ROLES = (TRAINING_MODEL, EVAL_MODEL, OPTIMIZER_MODEL)  # the training Module's graphs
FILES = {TRAINING_MODEL: "training_model.onnx", EVAL_MODEL: "eval_model.onnx",
         OPTIMIZER_MODEL: "optimizer_model.onnx", CHECKPOINT: "checkpoint"}
# Written only when the model has sparse masks / BatchNorm layers (exporters/passes/maskgrad.py,
# batchnormstats.py).
SIDE_FILES = {MASK_GRAD_MODEL: "mask_grad_model.onnx",
              BATCHNORM_STATS_MODEL: "batchnorm_stats_model.onnx",
              BATCHNORM_MOMENTS_MODEL: "batchnorm_moments_model.onnx"}
# How the runtime re-estimates BatchNorm statistics (the plan's `batchnorm_adapt`) -> the side
# graph it runs: "batch" averages each layer's micro-batch statistics in one pass (seed 003's
# RESET); "exact" sets one layer per pass from the moments of its input over every sample.
BATCHNORM_ADAPT_ROLES = {"batch": BATCHNORM_STATS_MODEL, "exact": BATCHNORM_MOMENTS_MODEL}


def batchnorm_side_roles(adapt: str) -> tuple[str, ...]:
    """The side graphs an artifact of BatchNorm adaptation `adapt` carries: its own, and for
    "batch" the moments graph too, from which RESET estimates over a step of several
    micro-batches (the batch the step stands for, edgetrain/sidegraphs.py)."""
    own = BATCHNORM_ADAPT_ROLES[adapt]
    return (own,) if own == BATCHNORM_MOMENTS_MODEL else (own, BATCHNORM_MOMENTS_MODEL)

# A run folder's outputs (personalise, reset-bn).
RUN_CHECKPOINT, RUN_INFERENCE_MODEL, RUN_RESULT = "checkpoint", "inference.onnx", "result.json"

# Graph inputs and outputs.
INPUT_NAME, LABEL_NAME, LOGITS_NAME = "input", "labels", "logits"
BATCH_AXIS = "batch"  # the dynamic first axis of INPUT_NAME and LOGITS_NAME

# Suffixes. ORT names the gradient of tensor t `t_grad`.
GRAD_SUFFIX = "_grad"
# A masked weight `<w>` (e.g. `conv.weight`) is held as `<w>_values` (trainable, [nnz]) and
# `<w>_positions` (frozen int32, [nnz]).
MASK_VALUES_SUFFIX, MASK_POSITIONS_SUFFIX = "_values", "_positions"
# A ReLU output Y whose gradient reads a 1-byte mask made in forward: `<Y>_relumask`
# (exporters/passes/relugrad.py); `measure` names the masks live at the step's peak by it.
RELU_MASK_SUFFIX = "_relumask"
# An activation saved for backward in 8 bits (exporters/passes/int8saved.py): `<T>_saved_int8`
# (uint8) with its scale and zero point, the copy backward waits for, the float rebuilt from it.
SAVED_INT8_SUFFIX = "_saved_int8"
# A forward node or tensor copied into backward by a recompute plan.
RECOMPUTE_SUFFIX = "_recompute"
# A forward node copied to rebuild a checkpoint a plan does not keep (a nested plan):
# f"{node}{REBUILT_TAG}{RECOMPUTE_SUFFIX}", run once when backward reaches its checkpoints.
REBUILT_TAG = "_rebuilt"
# A computed weight's node rebuilt beside one backward reader: f"{node}{REMAT_TAG}{k}.{j}"
REMAT_TAG = "_remat."
# The PassThrough nodes that order a plan's copies after a gradient: a segment's, a rebuilt
# weight's (exporters/plans/recompute/rewrite.py, remat.py)
RECOMPUTE_ORDER_PREFIXES = ("recompute.seg", "remat.")
# ONNX Runtime's blocked-channel kernels (ReorderInput, Conv, ReorderOutput): the training
# graph's depthwise convolutions run in them (exporters/passes/nchwc.py, edgetrain/nchwcprobe.py).
NCHWC_DOMAIN = "com.microsoft.nchwc"
# BatchNorm running statistics, estimated by the BatchNorm-statistics graph.
RUNNING_STATS = ("running_mean", "running_var")
# The BatchNorm-moments graph's outputs per layer: the mean and the mean square of the layer's
# input minus its running mean, per channel (shifted, so the variance keeps its precision).
INPUT_MOMENTS = ("shifted_mean", "shifted_mean_square")
# The graph's metadata gives each layer's elements per channel of one sample (its positions),
# which turns a biased variance of several micro-batches into the unbiased one RESET records.
INPUT_COUNT = "elements"


def grad_name(tensor: str) -> str:
    return f"{tensor}{GRAD_SUFFIX}"


def is_grad_name(name: str) -> bool:
    return name.endswith(GRAD_SUFFIX)


def grad_of(name: str) -> str:
    """The tensor whose gradient `name` is (name must end in GRAD_SUFFIX)."""
    return name[:-len(GRAD_SUFFIX)]


def recompute_name(name: str) -> str:
    return f"{name}{RECOMPUTE_SUFFIX}"


def rebuilt_name(name: str) -> str:
    return recompute_name(f"{name}{REBUILT_TAG}")


def recomputed_original(name: str) -> str:
    """The forward tensor a recompute copy stands for (`name` itself if it is none)."""
    if not is_recompute_name(name):
        return name
    return name.removesuffix(RECOMPUTE_SUFFIX).removesuffix(REBUILT_TAG)


def is_recompute_name(name: str) -> bool:
    return name.endswith(RECOMPUTE_SUFFIX)


def is_recompute_node(name: str) -> bool:
    """A node a recompute plan added to the training graph: a segment's copy, a rebuilt
    computed weight's node, or a PassThrough that orders them (what the plan costs in time)."""
    return (is_recompute_name(name) or REMAT_TAG in name
            or name.startswith(RECOMPUTE_ORDER_PREFIXES))


def saved_int8_names(tensor: str) -> tuple[str, str, str, str, str]:
    """(uint8 copy, scale, zero point, the copy backward reads, the float rebuilt) of a
    forward tensor saved in 8 bits."""
    base = f"{tensor}{SAVED_INT8_SUFFIX}"
    return base, f"{base}_scale", f"{base}_zero_point", f"{base}_late", f"{base}_dequantized"


def mask_tensor_names(weight: str) -> tuple[str, str, str]:
    """(dense weight, kept values, positions) of a masked weight, by its PyTorch name."""
    return weight, f"{weight}{MASK_VALUES_SUFFIX}", f"{weight}{MASK_POSITIONS_SUFFIX}"


def running_stat_names(bn_layer: str) -> tuple[str, str]:
    return tuple(f"{bn_layer}.{s}" for s in RUNNING_STATS)  # type: ignore[return-value]


def moment_names(bn_layer: str) -> tuple[str, str]:
    return tuple(f"{bn_layer}.{s}" for s in INPUT_MOMENTS)  # type: ignore[return-value]


def moment_count_name(bn_layer: str) -> str:
    return f"{bn_layer}.{INPUT_COUNT}"


def moments_layer(output: str) -> str | None:
    """The BatchNorm layer whose first moment `output` is, None for any other name."""
    suffix = f".{INPUT_MOMENTS[0]}"
    return output[:-len(suffix)] if output.endswith(suffix) else None
