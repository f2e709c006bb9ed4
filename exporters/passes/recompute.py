"""Pass `recompute` (training graph): the recompute plan (gradient checkpointing) written into
ORT's training graph.

ORT's own memory optimizer does nothing on on-device artifacts, so the exporter rewrites the
graph itself: the plan's checkpoints are kept, every other saved tensor of a segment is
recomputed in backward from the checkpoint before it (exporters/plans/recompute/). The
planner is the export's `recompute` option (sqrt, or budget: the cheapest plan predicted to fit
the budget, judged with the passes after this one applied, as the artifact will run); the
plan goes into the manifest's plan (checkpoints, recomputed tensors, a note).
"""
from __future__ import annotations

import dataclasses

from edgetrain import names
from edgetrain.names import FILES
from exporters.passes.pipeline import Context, Graphs, Pass
from exporters.plans.recompute import plan_and_rewrite
from exporters.predictor.cost import node_costs
from exporters.predictor import Prediction
from exporters.predictor.evaluated import forward_shapes
from exporters.predictor.scratch import MLAS_CONV_BUFFER_FLOATS_PER_THREAD

# A recompute plan must save at least one MLAS convolution buffer per thread (16384 floats):
# recomputed convolutions in backward can need a buffer region of that size of their own, so
# a smaller predicted saving may turn into a measured loss (seen on small 1-D CNNs).
MIN_RECOMPUTE_SAVING_BYTES_PER_THREAD = MLAS_CONV_BUFFER_FLOATS_PER_THREAD * 4


def judged_peak(p: Prediction) -> int | None:
    """The peak a plan is judged by: the prediction's, None where it makes no claim."""
    return p.peak_bytes if p.complete else None


def write_recompute_plan(graphs: Graphs, ctx: Context) -> int:
    """Plan recompute with the export's planner and write the plan into the training graph;
    returns how many tensors backward recomputes."""
    planner, plan = ctx.options.recompute, ctx.plan
    if planner == "budget":
        first = ctx.predict(graphs)
        if not first.complete:
            raise ValueError(f"--recompute budget plans by the static prediction, and the "
                             f"predictor {first.caveat()}. Use --recompute sqrt, or find a "
                             "micro-batch that fits with `edgetrain fit` (capped runs). Nothing "
                             "was written.")
    graphs.write(ctx.folder, side=False)  # the eval graph's shapes, evaluated by ORT
    try:
        known = forward_shapes(str(ctx.folder / FILES[names.EVAL_MODEL]), plan.micro_batch)
    except Exception:  # noqa: BLE001 - shapes then come from ONNX inference alone
        known = None
    shipped: list = []  # (training graph, its graphs as shipped): the last one made

    def as_shipped(training):  # the optimal search counts and predicts each plan's graph
        if not shipped or shipped[0][0] is not training:
            shipped[:] = [(training, ctx.as_shipped(dataclasses.replace(graphs,
                                                                        training=training)))]
        return shipped[0][1]

    def peak_of(training):
        judged = (as_shipped(training) if planner in ("budget", "optimal")
                  else dataclasses.replace(graphs, training=training))
        return judged_peak(ctx.predict(judged))

    def cycle_peak_of(training):  # optimal's finalists: the whole cycle's peak, as shipped
        p = ctx.predict_cycle(as_shipped(training))
        return None if p is None else judged_peak(p)

    def costs_of(training):  # node_costs' rows of the training graph as shipped
        return node_costs(as_shipped(training).training, plan.micro_batch)

    rplan, graphs.training = plan_and_rewrite(
        graphs.training, planner, batch=plan.micro_batch, budget_bytes=ctx.planning_budget_bytes,
        predict_model_peak=peak_of, known_shapes=known,
        min_saving_bytes=MIN_RECOMPUTE_SAVING_BYTES_PER_THREAD * plan.threads,
        time_ratio=plan.recompute_time_ratio, shipped_costs=costs_of,
        predict_cycle_peak=cycle_peak_of if planner == "optimal" else None)
    # a nested plan's rebuilt checkpoints are recomputed tensors: the manifest's checkpoints
    # are the tensors backward keeps from forward
    recomputed = rplan.recomputed + tuple(r for r in rplan.rebuilt if r not in rplan.recomputed)
    ctx.plan = dataclasses.replace(plan, recompute=rplan.planner, checkpoints=rplan.kept(),
                                   recomputed=recomputed, recompute_note=rplan.note)
    return len(rplan.recomputed)


PASS = Pass("recompute", "training", write_recompute_plan,
            option="recompute sqrt, budget or optimal",
            when=lambda ctx: ctx.options.recompute != "none")
