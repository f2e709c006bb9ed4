"""The static predictor: the peak bytes of a training cycle, from the artifact alone.

One entry point, `predict(...) -> Prediction`. Exact: parameters, gradients, AdamW moments
(each tensor one 256-byte-rounded arena chunk), the runtime's scalars and what the training
Module's sessions reserve for their graphs' constants. Simulated, on the graph ORT runs
(ortgraph.py): activations = what the arena holds beyond the training state after the
cycle's runs, each planned (plan.py) and replayed with its run-time allocations (scratch.py)
through one arena (cycle.py): a BatchNorm statistics pass where the run adapts BatchNorm, the
training step, an eval pass, the inference check; for the intra-op thread count the runtime
will use (the manifest's plan), never the exporting machine's. It models
onnxruntime-training 1.19.2's internals and refuses to predict for any other version. ORT
loads the graphs (to optimise them, read their shapes and their execution order), runs the
eval graph forward at batch 1 and 2 (evaluated.py) and writes the inference model the device
would (inferencegraph.py); nothing trains.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path

import onnx

from edgetrain import names
from edgetrain.budget import RUNTIME_SCALAR_BYTES, arena_rounded, state_bytes
from exporters.predictor.cycle import (INFERENCE_BATCH, Run, cycle_activation_bytes, inference_run,
                                       side_run, step_activation_bytes)
from exporters.predictor.evaluated import forward_shapes
from exporters.predictor.inferencegraph import inference_model
from exporters.predictor.ortgraph import initializer_chunks_bytes, optimized_graph
from exporters.predictor.plan import StepPlan, plan_step
from exporters.predictor.shapes import Shapes

SUPPORTED_ORT_VERSION = "1.19.2"
ORT_DISTRIBUTIONS = ("onnxruntime-training-cpu", "onnxruntime-training", "onnxruntime")
METHOD = ("graph plan on ORT's optimised graph: execution order, reuse plan, memory pattern, "
          "run-time allocations through an arena model")


# Operators whose run-time memory the predictor models (their kernels allocate nothing from
# the arena beyond their outputs, or what scratch.py replays; "Conv" covers the NCHWc
# domain's too, with ReorderInput and ReorderOutput: exporters/passes/nchwc.py), checked against the
# allocator on the seed networks (dense and sparse) and the layer families of
# tests/wearable_models.py: convolutions, norms, pooling, activations, attention (MatMul,
# Softmax, Transpose, Gather), embeddings (Range: positions made in forward); and the
# unoptimised ops of the inference check's model (Erf: GELU before ORT fuses it;
# ConstantOfShape, Equal, Where: a sparse weight's build before ORT folds it). A cycle with
# any other operator (recurrent cells, TopK routing) gets no peak claim: `complete` is False.
MODELLED_OPS = frozenset({
    "Add", "And", "BatchNormInternal", "BatchNormalization", "BatchNormalizationGrad",
    "BroadcastGradientArgs",
    "Cast", "Ceil", "Clip", "Concat", "ConcatTraining", "ConstantOfShape", "Conv", "ConvGrad",
    "ConvTranspose",
    "DequantizeLinear", "DynamicQuantizeLinear",
    "Div", "Dropout", "DropoutGrad", "Equal",
    "Erf", "Exp", "Expand", "Flatten", "FusedConv", "FusedMatMul", "Gather", "GatherElements",
    "GatherGrad",
    "Gelu", "GeluGrad", "Gemm", "GlobalAveragePool", "Greater", "GreaterOrEqual", "HardSigmoid",
    "Identity",
    "InPlaceAccumulatorV2", "LayerNormalization", "LayerNormalizationGrad", "LeakyRelu",
    "SkipLayerNormalization",
    "LeakyReluGrad", "LessOrEqual", "Log",
    "MatMul", "MaxPool", "MaxPoolGrad", "MaxUnpool", "Mod", "Mul", "Neg", "Pad", "PassThrough",
    "Pow",
    "QuickGelu", "Range",
    "QuickGeluGrad", "Reciprocal", "ReduceMean", "ReduceProd", "ReduceSum", "ReduceSumTraining",
    "Relu",
    "ReluGrad", "ReorderInput", "ReorderOutput", "Reshape", "Scale", "ScatterElements", "Shape",
    "Size", "Slice", "SliceGrad",
    "Sigmoid", "SigmoidGrad", "Sign", "Softmax", "SoftmaxCrossEntropyLoss",
    "SoftmaxCrossEntropyLossGrad",
    "SoftmaxGrad_13",
    "Split", "SplitTraining", "Sqrt", "Squeeze", "Sub", "Sum", "Tanh", "TanhGrad", "Transpose",
    "Unsqueeze", "Where"})


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
    # why the step could not be simulated at all ('' when it was)
    failure: str = ""
    # the side graph of the BatchNorm statistics pass run before the first step, whose
    # allocations the prediction includes ('' when the cycle runs none)
    batchnorm_pass: str = ""
    method: str = METHOD

    @property
    def complete(self) -> bool:
        """Whether peak_bytes is a prediction at all (else not to be trusted)."""
        return not (self.unsized_tensors or self.unmodelled_ops or self.failure)

    def caveat(self) -> str:
        """Why the prediction cannot be trusted ('' when it can)."""
        why = []
        if self.unsized_tensors:
            why.append(f"{len(self.unsized_tensors)} tensors of unknown size (e.g. "
                       f"{self.unsized_tensors[0]!r})")
        if self.unmodelled_ops:
            why.append(f"operators whose run-time memory it does not model "
                       f"({', '.join(self.unmodelled_ops)})")
        if self.failure:
            why.append(self.failure)
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


def known_shapes(eval_path: str, batch: int, train: str | None = None) -> Shapes | None:
    """Forward tensor shapes from running the eval graph, or None where ORT cannot run it
    forward (shapes are then inferred from the graph alone). With the training graph `train`,
    also its recompute copies' shapes: each is its original's (a copy runs the same node on
    the same shapes), which shape inference cannot always find (a copied attention's
    reshapes to computed shapes: 97 tensors unsized on a transformer encoder's sqrt plan)."""
    try:
        shapes = forward_shapes(eval_path, batch)
    except Exception:  # noqa: BLE001 - a graph ORT cannot run forward: fall back to inference
        return None
    if train is not None:
        graph = onnx.load(train, load_external_data=False).graph
        copies = {o for n in graph.node if names.is_recompute_name(n.name) for o in n.output}
        for o in copies:
            original = names.recomputed_original(o)
            if o != original and original in shapes and o not in shapes:
                shapes[o] = shapes[original]
    return shapes


def activation_plan(train: str, batch: int, threads: int, known: Shapes | None
                    ) -> tuple[StepPlan, int]:
    """The step's plan with its activation bytes: the memory-pattern block (arena-rounded)
    plus the run-time allocations outside it."""
    run = Run.of(train, plan_step(train, batch, known), known)
    return run.plan, step_activation_bytes(run, threads)


def claimed_plan(train: str, eval_model: str, batch: int, threads: int
                 ) -> tuple[StepPlan, int]:
    """The step's plan the prediction claims, with its activation bytes; shapes from running
    the eval graph forward where ORT can."""
    return activation_plan(train, batch, threads, known_shapes(eval_model, batch, train))


def predict(folder: str | Path, trainable, frozen, batch: int, files: dict[str, str],
            threads: int, batchnorm_role: str | None = None, step_only: bool = False,
            step_first: bool = False) -> Prediction:
    """Predicted peak of the training cycle at `batch` for the artifact in `folder`.

    trainable, frozen: TensorSpecs of the checkpoint; files: role -> file name;
    threads: the runtime's intra-op thread count (the manifest's plan.threads);
    batchnorm_role: the side graph of a BatchNorm statistics pass the cycle runs
    (Manifest.batchnorm_pass_role), None for a cycle without one; step_first: after a first
    training step (Plan.preflight_order "step-first"), else before it. step_only: the
    training step's activations alone, as export passes judge a rewrite by the step it
    changes (the rest of the cycle can hide a change to the step)."""
    version = check_ort_version()
    if threads < 1:
        raise ValueError(f"threads must be a positive number, got {threads}")
    folder = Path(folder)
    tensors = list(trainable) + list(frozen)
    grads = state_bytes(trainable)
    train = str(folder / files[names.TRAINING_MODEL])
    known = known_shapes(str(folder / files[names.EVAL_MODEL]), batch, train)
    state = {"parameters": state_bytes(tensors), "gradients": grads,
             "optimizer_state": 2 * grads}
    try:
        run = Run.of(train, plan_step(train, batch, known), known)  # the step, sized once
        graphs, unsized = [optimized_graph(train)], run.plan.unsized
        if step_only:
            acts = step_activation_bytes(run, threads)
        else:
            acts, more, more_unsized = _cycle(folder, files, run, trainable, tensors, batch,
                                              threads, known, batchnorm_role, step_first)
            graphs, unsized = graphs + more, unsized + more_unsized
        constants = sum(initializer_chunks_bytes(optimized_graph(str(folder / files[role])))
                        for role in names.MODULE_ROLES)
    except Exception as e:  # noqa: BLE001 - a graph ORT will not load for analysis: no claim
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        return Prediction(batch=batch, threads=threads, peak_bytes=sum(state.values()),
                          breakdown={**state, "activations": 0, "other": 0},
                          onnxruntime=version, failure=f"its simulation failed ({first})",
                          batchnorm_pass=batchnorm_role or "")
    breakdown = {
        **state,
        "activations": acts,
        "other": constants + RUNTIME_SCALAR_BYTES,
    }
    ops = {n.op_type for g in graphs for n in g.graph.node}
    return Prediction(batch=batch, threads=threads, peak_bytes=sum(breakdown.values()),
                      breakdown=breakdown, onnxruntime=version,
                      unsized_tensors=unsized,
                      unmodelled_ops=tuple(sorted(ops - MODELLED_OPS)),
                      batchnorm_pass=batchnorm_role or "")


def _cycle(folder: Path, files: dict[str, str], train_run: Run, trainable, tensors,
           batch: int, threads: int, known: Shapes | None, batchnorm_role: str | None,
           step_first: bool = False):
    """The training step's activations over the whole cycle (cycle.py), with the other graphs
    the cycle runs and the tensors of theirs that could not be sized."""
    train, eval_path = (str(folder / files[r]) for r in (names.TRAINING_MODEL, names.EVAL_MODEL))
    chunks = [arena_rounded(t.nbytes) for t in trainable for _ in range(3)]  # dW, m, v
    eval_pass = Run.of(eval_path, plan_step(eval_path, batch, known), known)
    inference = inference_run(
        inference_model(train, eval_path, str(folder / files[names.CHECKPOINT])),
        known_shapes(eval_path, INFERENCE_BATCH), frozenset(t.name for t in tensors))
    side_path = None if batchnorm_role is None else str(folder / files[batchnorm_role])
    side = None if side_path is None else side_run(side_path, batch,
                                                  known=known_shapes(side_path, batch))
    acts = cycle_activation_bytes(train_run, eval_pass, threads, chunks, side, inference,
                                  step_first)
    runs = [inference] + ([side] if side else [])
    return (acts, [optimized_graph(r.path, r.plan.graph_level) for r in runs],
            tuple(u for r in runs for u in r.plan.unsized))


def predict_manifest(folder: str | Path, manifest, batch: int, threads: int | None = None,
                     batchnorm_stats: bool = False, batchnorm_group: int = 1) -> Prediction:
    """predict() for a loaded artifact, at the runtime's thread count unless told another.
    batchnorm_stats: the cycle runs a BatchNorm statistics pass, over steps of
    `batchnorm_group` micro-batches (as DeviceRuntime.preflight is told), in the plan's
    preflight order."""
    side = manifest.batchnorm_pass_role(batchnorm_group) if batchnorm_stats else None
    return predict(folder, manifest.trainable, manifest.frozen, batch,
                   {role: e.path for role, e in manifest.files.items()},
                   threads or manifest.plan.threads, side,
                   step_first=manifest.plan.preflight_order == "step-first")
