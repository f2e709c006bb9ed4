"""The artifact contract: a frozen, versioned manifest between exporter and runtime.

An artifact folder holds ONNX Runtime's training, eval and optimizer graphs, its checkpoint,
and `manifest.json`. The runtime reads only what the manifest names and refuses any file whose
size or sha256 differs from it. Every field is documented in docs/artifact-format.md.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from edgetrain.atomicfile import atomic_write_bytes
from edgetrain.graphcheck import check_model_bytes
from edgetrain.jsonfile import read_json
from edgetrain.manifestcheck import check_dict, check_patching, check_plan_values
from edgetrain.names import (BATCHNORM_ADAPT_ROLES, BATCHNORM_MOMENTS_MODEL, MANIFEST_NAME,
                             REQUIRED_ROLES)
from edgetrain.specs import (IMU_CHANNELS, PREPROCESSES, ArtifactError, InputSpec, MaskSpec,
                             TensorSpec)

__all__ = ["SCHEMA_VERSION", "DEFAULT_THREADS", "IMU_CHANNELS", "PREPROCESSES", "ArtifactError",
           "FileEntry", "InputSpec", "Manifest", "MaskSpec", "Plan", "TensorSpec", "file_entry",
           "load_manifest", "sha256_file", "verify_files"]

SCHEMA_VERSION = 1
# ORT intra-op threads of a plan that names none (artifacts from before the field existed).
DEFAULT_THREADS = 2
MAX_MANIFEST_BYTES = 16 << 20  # a manifest lists files and tensors: megabytes at the most


SAVED_ACTIVATIONS = ("fp32", "int8")
# the order of the preflight's first runs when the run adapts BatchNorm (DeviceRuntime.preflight)
PREFLIGHT_ORDERS = ("statistics-first", "step-first")


@dataclass(frozen=True)
class Plan:
    """Memory plan carried by the artifact. Patch size 0 means the model sees whole images."""

    micro_batch: int = 8  # samples per forward/backward call
    accumulation_steps: int = 1  # micro-batches summed per optimizer step
    patch_size: int = 0
    recompute: str = "none"  # the recompute planner that wrote the training graph
    batchnorm: str = "batch"  # "batch": batch statistics; "frozen": a fixed affine map
    checkpoints: tuple[str, ...] = ()  # forward tensors kept as segment boundaries
    recomputed: tuple[str, ...] = ()  # forward tensors rebuilt during backward
    recompute_budget_bytes: int | None = None  # the budget the "budget" planner planned for
    # the "optimal" planner's step budget: at most this many times the step's FLOPs
    recompute_time_ratio: float | None = None
    recompute_note: str = ""  # what the planner decided and why, when that needs saying
    # ORT intra-op threads the runtime runs with (unless told otherwise); the predicted peak
    # is for this count, so it is the same whichever machine exported the artifact.
    threads: int = DEFAULT_THREADS
    # what trains (exporters/plans/updateplans.py): "all", "head", "bias", "last:K", parameter names
    # or prefixes, comma-separated; "names" when given as a list. The manifest's `trainable`
    # holds the tensors it resolved to.
    update: str = "all"
    # frozen weights stored in 8 bits (exporters/plans/quantize.py): PyTorch names; each is held as
    # `<name>_int8` and `<name>_scale` and rebuilt by a DequantizeLinear node
    frozen_int8: tuple[str, ...] = ()
    # masked weights' gradients (exporters/passes/sparsegrad.py): "dense", ORT's dense dW read
    # at the kept positions; "kept": computed at the kept positions only, where the layer allows
    weight_grad: str = "dense"
    # channels a block of ORT's NCHWc kernels holds on the exporting machine, when the
    # training graph's depthwise convolutions run in them (exporters/passes/nchwc.py); 0: they do
    # not. The runtime refuses the artifact where its ORT uses another block.
    nchwc_block: int = 0
    # how masked weights are rebuilt dense on each call (exporters/passes/densebuild.py): "unpool",
    # one MaxUnpool; "scatter", Expand + ScatterElements (manifests written before: scatter)
    dense_build: str = "unpool"
    # what runs it (edgetrain/targets.py): "portable" (any ORT 1.19.2 CPU build), "arm64",
    # "host" (this machine's kernels too); manifests written before: "host"
    target: str = "host"
    # how the runtime re-estimates BatchNorm statistics on the user's data (label-free
    # adaptation, RESET): "batch", each layer normalised by its micro-batch's statistics and
    # their average kept (seed 003), one pass; "exact", one pass per layer, each layer's
    # statistics over every sample given the layers before it, whatever the micro-batch
    # (edgetrain/names.BATCHNORM_ADAPT_ROLES: the side graph each runs)
    batchnorm_adapt: str = "batch"
    # activations saved for backward: "fp32", or "int8" (exporters/passes/int8saved.py: each
    # rounded to 8 bits in forward, rebuilt when backward reaches it)
    saved_activations: str = "fp32"
    # which runs first where a run adapts BatchNorm: the statistics pass or a training step.
    # The arena never gives a region back, so the first leaves the regions the second reuses;
    # the exporter writes the order its predictor gives the lower peak (manifests written
    # before: "statistics-first")
    preflight_order: str = "statistics-first"

    def __post_init__(self):
        check_plan_values(self, SAVED_ACTIVATIONS, BATCHNORM_ADAPT_ROLES, PREFLIGHT_ORDERS)


@dataclass(frozen=True)
class FileEntry:
    path: str  # relative to the artifact folder, no directories
    size_bytes: int
    sha256: str


@dataclass(frozen=True)
class Manifest:
    schema_version: int
    model: str
    files: dict[str, FileEntry]  # role -> file
    input: InputSpec
    classes: tuple[str, ...]
    trainable: tuple[TensorSpec, ...]
    frozen: tuple[TensorSpec, ...]
    plan: Plan
    optimizer: dict  # {"type": "AdamW", "lr": ..., "weight_decay": ..., "eps": ...}
    predicted: dict  # {"batch": B, "peak_bytes": ..., "breakdown": {...}} (a prediction)
    provenance: dict  # population subjects, pretraining summary, versions
    masks: tuple[MaskSpec, ...] = ()  # sparse weights (empty: dense)
    # with masks: every parameter that stays dense, and why (PyTorch name -> reason)
    dense_weights: dict = dataclasses.field(default_factory=dict)

    # ---- serialisation -------------------------------------------------------------------
    def to_dict(self) -> dict:
        """The manifest as JSON holds it (tuples as lists), so from_dict(to_dict()) == self."""
        return _as_json(dataclasses.asdict(self))

    @classmethod
    def from_dict(cls, d: dict) -> "Manifest":
        if not isinstance(d, dict):
            raise ArtifactError(f"manifest must be a JSON object, got {type(d).__name__}")
        version = d.get("schema_version")
        if version != SCHEMA_VERSION:
            raise ArtifactError(
                f"manifest schema_version is {version!r}, this runtime reads {SCHEMA_VERSION}; "
                "re-export the artifact with this version of edgetrain")
        check_dict(d, dataclasses.fields(Plan))  # every field's JSON type, before any use
        try:
            inp = dict(d["input"])
            inp["sample_shape"] = tuple(inp["sample_shape"])
            inp["image_shape"] = tuple(inp["image_shape"])
            return cls(
                schema_version=version,
                model=str(d["model"]),
                files={role: FileEntry(**f) for role, f in d["files"].items()},
                input=InputSpec(**inp),
                classes=tuple(d["classes"]),
                trainable=tuple(_tensor(t) for t in d["trainable"]),
                frozen=tuple(_tensor(t) for t in d["frozen"]),
                plan=_plan(d["plan"]),
                optimizer=dict(d["optimizer"]),
                predicted=dict(d["predicted"]),
                provenance=dict(d["provenance"]),
                masks=tuple(MaskSpec(m["weight"], tuple(m["shape"]), int(m["nnz"]),
                                     m["values"], m["positions"]) for m in d.get("masks", [])),
                dense_weights=dict(d.get("dense_weights", {})),
            )
        except (KeyError, TypeError, AttributeError) as e:
            raise ArtifactError(f"manifest is missing or has a malformed field: {e}; "
                                "re-export the artifact") from e

    def __post_init__(self):
        for field in ("optimizer", "predicted", "provenance", "dense_weights"):  # free-form:
            object.__setattr__(self, field, _as_json(getattr(self, field)))  # held as JSON is
        check_patching(self.input.sample_shape, self.input.image_shape, self.plan.patch_size)
        trainable = {t.name: t for t in self.trainable}
        frozen = {t.name: t for t in self.frozen}
        for m in self.masks:  # a frozen masked layer keeps its values frozen (update plans)
            v, p = trainable.get(m.values, frozen.get(m.values)), frozen.get(m.positions)
            if (v is None or p is None or v.shape != (m.nnz,) or p.shape != (m.nnz,)
                    or p.dtype != "int32" or not 0 < m.nnz <= m.numel):
                raise ArtifactError(
                    f"mask of {m.weight!r} does not match the artifact's tensors: it needs a "
                    f"{m.values!r} tensor and a frozen int32 {m.positions!r}, both of shape "
                    f"({m.nnz},), with 0 < nnz <= {m.numel}; re-export the artifact")

    @property
    def trained_masks(self) -> tuple[MaskSpec, ...]:
        """The masks of layers that train: the ones mask updates may change."""
        trainable = {t.name for t in self.trainable}
        return tuple(m for m in self.masks if m.values in trainable)

    def write(self, folder: Path) -> Path:
        path = Path(folder) / MANIFEST_NAME
        atomic_write_bytes(path, json.dumps(self.to_dict(), indent=2).encode())
        return path

    # ---- derived figures -----------------------------------------------------------------
    @property
    def num_classes(self) -> int:
        return len(self.classes)

    @property
    def batchnorm_adapt_role(self) -> str | None:
        """The side graph that re-estimates BatchNorm statistics as the plan says, None when
        the artifact has none (no BatchNorm layer, or frozen weights in 8 bits)."""
        role = BATCHNORM_ADAPT_ROLES[self.plan.batchnorm_adapt]
        return role if role in self.files else None

    def batchnorm_pass_role(self, group: int = 1) -> str:
        """The side graph a BatchNorm statistics pass over steps of `group` micro-batches runs:
        the plan's, or for a step of several the moments graph (sidegraphs.py). The artifact
        may have none (batchnorm_adapt_role None)."""
        return (BATCHNORM_MOMENTS_MODEL if group > 1
                else BATCHNORM_ADAPT_ROLES[self.plan.batchnorm_adapt])

    @property
    def trainable_bytes(self) -> int:
        return sum(t.nbytes for t in self.trainable)

    @property
    def frozen_bytes(self) -> int:
        return sum(t.nbytes for t in self.frozen)


def _plan(d: dict) -> Plan:
    d = dict(d)
    for key in ("checkpoints", "recomputed", "frozen_int8"):
        d[key] = tuple(d.get(key, ()))
    d.setdefault("dense_build", "scatter")
    try:
        return Plan(**d)
    except ValueError as e:  # a field out of range
        raise ArtifactError(f"manifest {e}; re-export the artifact") from e


def _tensor(t: dict) -> TensorSpec:
    return TensorSpec(name=t["name"], shape=tuple(t["shape"]), dtype=t["dtype"])


def _as_json(value):
    """Tuples become lists, at any depth: the value JSON gives back."""
    if isinstance(value, dict):
        return {k: _as_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_as_json(v) for v in value]
    return value


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def file_entry(folder: Path, name: str) -> FileEntry:
    p = Path(folder) / name
    return FileEntry(path=name, size_bytes=p.stat().st_size, sha256=sha256_file(p))


def load_manifest(folder: str | os.PathLike, verify: bool = True) -> Manifest:
    """Read and (by default) verify an artifact folder. Raises ArtifactError with the fix."""
    folder = Path(folder)
    path = folder / MANIFEST_NAME
    if not folder.is_dir():
        what = "is a file, not a folder" if folder.exists() else "does not exist"
        raise ArtifactError(f"artifact folder {str(folder)!r} {what}; give the folder "
                            "`edgetrain export --out DIR` wrote (or create one with it)")
    if not path.is_file():
        raise ArtifactError(f"{path} is missing: {folder} is not an edgetrain artifact; "
                            "create one with `edgetrain export --out DIR`")
    d = read_json(path, MAX_MANIFEST_BYTES, "manifest", "The artifact is refused; re-export "
                  "it (an artifact holds its own manifest)", ArtifactError)
    m = Manifest.from_dict(d)
    missing = [r for r in REQUIRED_ROLES if r not in m.files]
    if missing:
        raise ArtifactError(f"manifest names no file for {missing}; re-export the artifact")
    if verify:
        verify_files(folder, m)
    return m


def verify_files(folder: Path, m: Manifest) -> None:
    for role, entry in m.files.items():
        if os.path.basename(entry.path) != entry.path or entry.path in ("", ".", ".."):
            raise ArtifactError(f"manifest file {entry.path!r} for {role} is not a plain file name "
                                "inside the artifact folder; the artifact is refused")
        p = folder / entry.path
        if p.is_symlink():
            raise ArtifactError(f"{role} file {p} is a symbolic link (to {os.readlink(p)!r}); "
                                "an artifact holds its own files, and a link could point "
                                "anywhere. The artifact is refused; copy the real files")
        if not p.is_file():
            raise ArtifactError(f"{role} file {p} is missing; copy the whole artifact folder again")
        sidecar = p.with_name(p.name + ".data")
        if os.path.lexists(sidecar):  # ORT reads a checkpoint's tensors from here if told to
            raise ArtifactError(f"{sidecar} sits beside the {role} file; ONNX Runtime can read "
                                "tensors from it, and the manifest does not cover it. The "
                                "artifact is refused; remove the file or re-export")
        size = p.stat().st_size
        if size != entry.size_bytes:
            raise ArtifactError(f"{role} file {p} is {size} bytes, the manifest says "
                                f"{entry.size_bytes}: truncated or replaced; copy the artifact again")
        graph = p.read_bytes() if entry.path.endswith(".onnx") else None  # read once: hashed
        digest = sha256_file(p) if graph is None else hashlib.sha256(graph).hexdigest()
        if digest != entry.sha256:
            raise ArtifactError(f"{role} file {p} has sha256 {digest[:16]}…, the manifest says "
                                f"{entry.sha256[:16]}…: the file was modified; copy the artifact again")
        if graph is not None:  # and then checked for what it will do (edgetrain/graphcheck.py)
            check_model_bytes(role, p, graph)
