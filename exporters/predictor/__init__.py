"""The static predictor: the peak bytes of a training cycle, from the artifact alone.

One entry point, `predict(...) -> Prediction`. Exact: parameters, gradients, AdamW moments
(each tensor one 256-byte-rounded arena chunk), the runtime's scalars and the inference
session's weights and constants. Simulated:
activations = the memory-pattern block of the training graph (plan.py) plus the run-time
allocations outside it (scratch.py), for the intra-op thread count the runtime will use (the
manifest's plan), never the exporting machine's. It models onnxruntime-training 1.19.2's
internals and refuses to predict for any other version.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path

import onnx

from edgetrain import names
from edgetrain.budget import RUNTIME_SCALAR_BYTES, arena_rounded, state_bytes
from edgetrain.onnxscan import constant_bytes as graph_constants
from exporters.graph import load_graph
from exporters.predictor.evaluated import forward_shapes
from exporters.predictor.plan import plan_step
from exporters.predictor.scratch import scratch_bytes
from exporters.predictor.shapes import initializer_bytes

SUPPORTED_ORT_VERSION = "1.19.2"
ORT_DISTRIBUTIONS = ("onnxruntime-training-cpu", "onnxruntime-training", "onnxruntime")
METHOD = ("graph plan: ORT execution order, tensor lifetimes, reuse, memory pattern, run-time "
          "allocations through an arena model")


# Operators whose run-time memory the predictor models, checked against the allocator on the
# seed networks (dense and sparse: a sparse weight is a Slice, a Scatter and a Reshape), 1-D
# and 2-D CNNs with BatchNorm, pooling, LayerNorm, GELU and Dropout
# (tests/test_conformance.py). A training graph with any other operator (attention's MatMul
# and Softmax, recurrent cells, gathers) gets no peak claim: `complete` is False.
MODELLED_OPS = frozenset({
    "Add", "And", "BatchNormInternal",
    "BatchNormalizationGrad", "Cast", "Clip", "ConcatTraining", "Conv", "ConvGrad", "Div",
    "Dropout", "DropoutGrad", "Expand", "Flatten", "Gelu", "GeluGrad", "Gemm",
    "GlobalAveragePool", "GreaterOrEqual", "Identity", "InPlaceAccumulatorV2",
    "LayerNormalization", "LayerNormalizationGrad", "LessOrEqual", "MaxPool", "MaxPoolGrad",
    "Mul", "Neg", "PassThrough", "Reciprocal", "ReduceMean", "ReduceSum", "Relu", "ReluGrad",
    "Reshape", "Scale", "ScatterElements", "GatherElements", "Shape", "Size", "Slice",
    "SoftmaxCrossEntropyLoss", "SoftmaxCrossEntropyLossGrad", "SplitTraining", "Sqrt", "Sum",
    "Unsqueeze"})


class UnsupportedRuntimeError(ValueError):
    """The installed onnxruntime is not the version the predictor models."""


@dataclass(frozen=True)
class Prediction:
    batch: int
    threads: int  # ORT intra-op threads the prediction is for
    peak_bytes: int
    breakdown: dict  # category -> bytes, sums to peak_bytes
    onnxruntime: str  # the version whose internals were modelled
    # Tensors of the training step whose size could not be found, counted as 0 bytes: with
    # any, peak_bytes is a lower bound and `complete` is False (fit then searches without it).
    unsized_tensors: tuple[str, ...] = ()
    # Operators of the step outside MODELLED_OPS: their run-time scratch is not modelled.
    unmodelled_ops: tuple[str, ...] = ()
    method: str = METHOD

    @property
    def complete(self) -> bool:
        """Whether peak_bytes is a prediction at all (else: a lower bound, not to be trusted)."""
        return not self.unsized_tensors and not self.unmodelled_ops

    def caveat(self) -> str:
        """Why the prediction cannot be trusted ('' when it can)."""
        why = []
        if self.unsized_tensors:
            why.append(f"{len(self.unsized_tensors)} tensors of unknown size (e.g. "
                       f"{self.unsized_tensors[0]!r})")
        if self.unmodelled_ops:
            why.append(f"operators whose run-time memory it does not model "
                       f"({', '.join(self.unmodelled_ops)})")
        return ("cannot predict this step's peak: " + " and ".join(why)) if why else ""

    def to_dict(self) -> dict:
        return {**asdict(self), "unsized_tensors": len(self.unsized_tensors),
                "unmodelled_ops": list(self.unmodelled_ops), "complete": self.complete,
                "caveat": self.caveat()}


def installed_ort_version() -> str | None:
    for dist in ORT_DISTRIBUTIONS:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def check_ort_version() -> str:
    """The installed onnxruntime version, if it is the one modelled; else a clear refusal."""
    found = installed_ort_version()
    if found != SUPPORTED_ORT_VERSION:
        raise UnsupportedRuntimeError(
            f"the static predictor models onnxruntime-training {SUPPORTED_ORT_VERSION} (its "
            f"execution order, memory pattern and MLAS buffers), but {found or 'no onnxruntime'}"
            f" is installed; its prediction would be silently wrong. Install "
            f"onnxruntime-training-cpu=={SUPPORTED_ORT_VERSION}, or measure instead "
            "(`edgetrain measure` reads the real allocator)")
    return found


def predict(folder: str | Path, trainable, frozen, batch: int, files: dict[str, str],
            threads: int) -> Prediction:
    """Predicted peak of the training cycle at `batch` for the artifact in `folder`.

    trainable, frozen: TensorSpecs of the checkpoint; files: role -> file name;
    threads: the runtime's intra-op thread count (the manifest's plan.threads)."""
    version = check_ort_version()
    if threads < 1:
        raise ValueError(f"threads must be a positive number, got {threads}")
    folder = Path(folder)
    state = {t.name for t in list(trainable) + list(frozen)}
    grads = state_bytes(trainable)
    train = str(folder / files[names.TRAINING_MODEL])
    train_graph = load_graph(train)  # read once: constants and operators below
    eval_path = folder / files[names.EVAL_MODEL]
    eval_bytes = eval_path.read_bytes()
    try:
        known = forward_shapes(str(eval_path), batch)
    except Exception:  # noqa: BLE001 - a graph ORT cannot run forward: fall back to inference
        known = None
    plan = plan_step(train, batch, known)
    # the inference session reserves its weights, each in its own 256-byte-rounded chunk
    inference = state_bytes(list(trainable) + list(frozen)) + graph_constants(eval_bytes)
    breakdown = {
        "parameters": state_bytes(list(trainable) + list(frozen)),
        "gradients": grads,
        "optimizer_state": 2 * grads,
        "activations": (arena_rounded(plan.pattern_bytes)
                        + scratch_bytes(train, batch, threads, known, plan.dynamic)),
        "other": (constant_bytes(train_graph, state)
                  + constant_bytes(onnx.load_model_from_string(eval_bytes), state)
                  + RUNTIME_SCALAR_BYTES + inference),
    }
    ops = {n.op_type for n in train_graph.graph.node}
    return Prediction(batch=batch, threads=threads, peak_bytes=sum(breakdown.values()),
                      breakdown=breakdown, onnxruntime=version, unsized_tensors=plan.unsized,
                      unmodelled_ops=tuple(sorted(ops - MODELLED_OPS)))


def predict_manifest(folder: str | Path, manifest, batch: int, threads: int | None = None
                     ) -> Prediction:
    """predict() for a loaded artifact, at the runtime's thread count unless told another."""
    return predict(folder, manifest.trainable, manifest.frozen, batch,
                   {role: e.path for role, e in manifest.files.items()},
                   threads or manifest.plan.threads)


def constant_bytes(model, state: set[str]) -> int:
    """Graph constants (initializers that are not checkpoint tensors): sessions reserve them."""
    return sum(initializer_bytes(i) for i in model.graph.initializer
               if i.name not in state)
