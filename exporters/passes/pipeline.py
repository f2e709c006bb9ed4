"""The exporter's pipeline: named passes over the artifact's graphs, in memory, in order.

An export is two stages around ORT's artifact builder. The forward stage rewrites the ONNX
forward graph torch exported; the builder makes the training, eval and optimizer graphs from
it; the artifact stage rewrites those and adds the side graphs. Each stage is an ordered
tuple of `Pass`es (exporters/passes/__init__.py lists them); a pass is a small function in
its own module whose docstring says what it rewrites and why, and it declares the targets
and the option that enable it. `run_passes` runs the enabled ones on one `Graphs` (protobuf
objects, never written between passes) and returns what each changed, which the manifest's
provenance keeps (`provenance.passes`).

A pass changes the graph it names or nothing: the runner keeps a copy and puts it back when
the pass reports no change (a rewrite's own bookkeeping, such as inferred shapes, never
reaches the artifact unless it rewrote something).

Predictions: a pass that plans by the predicted peak (the recompute planner, the depthwise
gradient rule) asks the context. `Context.predict` writes the graphs as they stand into the
export's folder (where the checkpoint and optimizer graph already are) and runs the static
predictor; `Context.predict_as_shipped` first runs the passes still to come on a copy, so a
plan is judged as it will run.
"""
from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Callable

import onnx

from edgetrain import names
from edgetrain.names import FILES, SIDE_FILES
from edgetrain.targets import TARGETS

GRAPH_ROLES = ("forward", "training", "eval", "side")


def copy_model(model: onnx.ModelProto) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(model)
    return out


@dataclasses.dataclass
class Graphs:
    """The graphs an export holds in memory: the forward graph (forward stage), ORT's training
    and eval graphs (artifact stage) and the side graphs by role (edgetrain/names.SIDE_FILES)."""
    forward: onnx.ModelProto | None = None
    training: onnx.ModelProto | None = None
    eval: onnx.ModelProto | None = None
    side: dict[str, onnx.ModelProto] = dataclasses.field(default_factory=dict)

    def copy(self) -> Graphs:
        """A copy of the training and eval graphs (what a prediction reads); the forward and
        side graphs are shared."""
        return Graphs(self.forward, copy_model(self.training), copy_model(self.eval),
                      dict(self.side))

    def write(self, folder: Path, side: bool = True) -> dict[str, str]:
        """Write the training and eval graphs (and the side graphs) into `folder` under
        their file names; returns role -> file name of what was written."""
        written = {names.TRAINING_MODEL: FILES[names.TRAINING_MODEL],
                   names.EVAL_MODEL: FILES[names.EVAL_MODEL]}
        onnx.save(self.training, str(folder / written[names.TRAINING_MODEL]))
        onnx.save(self.eval, str(folder / written[names.EVAL_MODEL]))
        for role, model in (self.side.items() if side else ()):
            written[role] = SIDE_FILES[role]
            onnx.save(model, str(folder / written[role]))
        return written


@dataclasses.dataclass(frozen=True)
class Pass:
    """A named rewrite. graph: the role it changes (GRAPH_ROLES; "side" adds a side graph).
    run(graphs, ctx) -> how many things it changed (nodes, layers, graphs). targets: the
    targets it runs for. option: the export option that enables it, in words ("" when it
    always runs), and when(ctx): that option read from the context."""
    name: str
    graph: str
    run: Callable[[Graphs, "Context"], int]
    option: str = ""
    when: Callable[["Context"], bool] = lambda ctx: True
    targets: tuple[str, ...] = tuple(TARGETS)

    def __post_init__(self):
        if self.graph not in GRAPH_ROLES:
            raise ValueError(f"pass {self.name!r}: graph {self.graph!r} is not one of "
                             f"{GRAPH_ROLES}")

    def enabled(self, ctx: Context) -> bool:
        return ctx.target in self.targets and self.when(ctx)

    @property
    def summary(self) -> str:
        """The first sentence of its function's docstring (what it rewrites)."""
        return re.split(r"[.;]\s", " ".join((self.run.__doc__ or "").split()) + " ")[0]


@dataclasses.dataclass
class Context:
    """What the passes read besides the graphs. `plan` is updated by the passes that plan
    (recompute, NCHWc); `remaining` is set by the runner to the passes after the current one.
    predictor(folder) -> the Prediction of the artifact in `folder` (its checkpoint and
    optimizer graph are there): of the training step alone; cycle_predictor(folder): of the
    whole training cycle, as the manifest's."""
    folder: Path
    plan: object  # edgetrain.manifest.Plan
    target: str
    nchwc: bool
    predictor: Callable[[Path], object] | None = None
    cycle_predictor: Callable[[Path], object] | None = None
    options: object = None  # exporters.export.options.ExportOptions
    masks: tuple = ()  # MaskSpecs of the masked layers that train
    torch_model: object = None
    example_input: object = None
    state_names: frozenset = frozenset()
    trainable: frozenset = frozenset()
    int8: bool = False
    planning_budget_bytes: int | None = None
    remaining: tuple[Pass, ...] = ()

    def predict(self, graphs: Graphs):
        """The static prediction for the training and eval graphs as they stand."""
        graphs.write(self.folder, side=False)
        return self.predictor(self.folder)

    def predict_cycle(self, graphs: Graphs):
        """The static prediction of the whole training cycle (the manifest's), or None
        without a cycle predictor."""
        if self.cycle_predictor is None:
            return None
        graphs.write(self.folder, side=False)
        return self.cycle_predictor(self.folder)

    def predicted_peak(self, graphs: Graphs) -> int | None:
        """predict()'s peak bytes, None where the predictor makes no claim."""
        p = self.predict(graphs)
        return p.peak_bytes if p.complete else None

    def as_shipped(self, graphs: Graphs) -> Graphs:
        """A copy of `graphs` after the passes still to come on the training and eval graphs."""
        shipped = graphs.copy()
        later = tuple(p for p in self.remaining if p.graph in ("training", "eval"))
        run_passes(later, shipped, dataclasses.replace(self))
        return shipped

    def predicted_peak_as_shipped(self, graphs: Graphs) -> int | None:
        """predicted_peak of `graphs` as they will ship (as_shipped)."""
        return self.predicted_peak(self.as_shipped(graphs))


def run_passes(passes: tuple[Pass, ...], graphs: Graphs, ctx: Context) -> dict[str, int]:
    """Run the enabled passes in order on `graphs`; returns {pass name: what it changed}."""
    changed: dict[str, int] = {}
    for i, p in enumerate(passes):
        if not p.enabled(ctx):
            continue
        ctx.remaining = passes[i + 1:]
        before = getattr(graphs, p.graph) if p.graph in ("forward", "training", "eval") else None
        kept = copy_model(before) if before is not None else None
        count = int(p.run(graphs, ctx))
        if kept is not None and not count:
            setattr(graphs, p.graph, kept)
        changed[p.name] = count
    ctx.remaining = ()
    return changed
