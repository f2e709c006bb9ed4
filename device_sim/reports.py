"""What `edgetrain measure` and `edgetrain fit` report: the runtime's measured peak beside the
static prediction, the step's counted cost and a roofline time on a device profile; and the
largest batch that trains under a budget. Pure functions over an artifact folder, each
returning plain data; the CLI only prints them. Host side: the prediction reads the graphs
with onnx, the measurement runs in its own torch-free child process.
"""
from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from device_sim.measure import measure, replays_batchnorm
from device_sim.profiles import get_profile
from device_sim.scenario import FitResult, largest_batch
from edgetrain import names
from edgetrain.budget import BudgetError, with_prediction
from edgetrain.manifest import load_manifest
from exporters.predictor.cost import recompute_flops, step_cost
from exporters.predictor import predict_manifest
from exporters.views.activationparts import masks_at_peak

# Micro-batches each of fit's capped steps sums (the plan's count where smaller). A step's
# peak is reached by its second micro-batch: later ones add into the gradient buffers the
# first allocated and reuse its activation blocks (tests/test_fit_accumulation.py measures it),
# so the plan's full count (1,568 one-patch micro-batches for C6) would only make each capped
# run slower, not its peak higher. Throughput counts every sample a timed step trained.
FIT_ACCUMULATION = 2

COVERS = ("every byte ONNX Runtime allocates for the training working set: parameters, "
          "gradients, optimizer state, activations and temporaries, runtime scalars; not the "
          "interpreter or input batches (see process_peak_rss_bytes)")


def measure_report(artifact: str | Path, batch: int, *, device: str | None = None,
                   budget_bytes: int | None = None, accumulate: int | None = None, steps: int = 3,
                   threads: int | None = None, plot_dir: str | Path | None = None,
                   select: bool = True, adapt: str = "none") -> dict:
    """Measure the training cycle at `batch` (capped at budget_bytes if given) and put the
    prediction for the same thread count, the step's cost and recompute overhead beside it.
    plot_dir: also draw timeline.png and graph.png there (needs matplotlib). accumulate:
    micro-batches a step sums (None: the plan's; it also groups the statistics pass's batches).
    Raises BudgetError (does not fit), ArtifactError or ValueError (bad input)."""
    manifest = load_manifest(artifact)
    accumulate = manifest.plan.accumulation_steps if accumulate is None else accumulate
    r = measure(artifact, batch, budget_bytes, accumulate, steps, threads, select=select,
                adapt=adapt)
    stats = replays_batchnorm(manifest, adapt)
    pred = predict_manifest(artifact, manifest, batch, r.threads, batchnorm_stats=stats,
                            batchnorm_group=accumulate)
    train = str(Path(artifact) / manifest.files[names.TRAINING_MODEL].path)
    eval_model = str(Path(artifact) / manifest.files[names.EVAL_MODEL].path)
    cost = step_cost(train, batch, sum(t.nbytes // 4 for t in manifest.trainable))
    device_time = None
    if device:
        p = get_profile(device)
        device_time = cost.predicted_time_s(p.compute_flops_per_s, p.memory_bandwidth_bytes_per_s)
    extra = recompute_flops(cost.nodes)
    doc = {"artifact": str(artifact), "device": device, "budget_bytes": budget_bytes,
           **r.to_dict(), "predicted_peak_bytes": pred.peak_bytes,
           "predicted_breakdown": pred.breakdown, "predicted_threads": pred.threads,
           "predicted_complete": pred.complete, "prediction_caveat": pred.caveat(),
           "predicted_masks_at_peak": asdict(masks_at_peak(train, eval_model, batch,
                                                           pred.threads)),
           "step_flops": cost.flops, "step_bytes_moved": cost.bytes_moved,
           "recompute": {"planner": manifest.plan.recompute,
                         "checkpoints": list(manifest.plan.checkpoints),
                         "recomputed": list(manifest.plan.recomputed), "extra_flops": extra,
                         "extra_flops_ratio": round(extra / max(1, cost.flops - extra), 4)},
           "predicted_device_step_time_s": device_time, "covers": COVERS,
           # --adapt replayed BatchNorm statistics first (the prediction includes the pass)
           "batchnorm_stats_pass": stats}
    if plot_dir:
        from exporters.views.graphview import forward_graph, parts_of, write_graph_svg
        from exporters.views.report import plot_graph, plot_timeline  # matplotlib: only when asked

        out = Path(plot_dir)
        out.mkdir(parents=True, exist_ok=True)
        shown = {"eval_model": str(Path(artifact) / manifest.files[names.EVAL_MODEL].path),
                 "threads": r.threads}  # as the prediction beside the measurement uses them
        # one figure in every picture: the measured activations, split into parts
        parts = parts_of(train, forward_graph(train), batch=batch,
                         measured_bytes=r.breakdown["activations"], **shown)
        doc["plots"] = [str(plot_timeline(parts, r.breakdown, r.peak_bytes, budget_bytes,
                                          out, batch)),
                        str(plot_graph(parts, out, batch)),
                        str(write_graph_svg(train, batch, out, parts=parts, **shown))]
        doc["activation_parts"] = parts.rows()
    return doc


def fit_report(artifact: str | Path, budget_bytes: int, steps: int = 5,
               adapt: str = "none", progress=None) -> FitResult:
    """The largest batch that trains under budget_bytes: the prediction proposes, capped runs
    confirm (device_sim/scenario.py), replaying personalise --adapt `adapt`, each step
    summing FIT_ACCUMULATION micro-batches (the plan's count where smaller). progress(batch):
    told as each capped run starts."""
    manifest = load_manifest(artifact)
    accumulation = min(manifest.plan.accumulation_steps, FIT_ACCUMULATION)

    def predicted_peak(b: int) -> int | None:
        p = predict_manifest(artifact, manifest, b, batchnorm_stats=replays_batchnorm(
            manifest, adapt), batchnorm_group=accumulation)
        return p.peak_bytes if p.complete else None

    def confirmed(b: int):
        if progress:
            progress(b)
        try:
            return measure(artifact, b, budget_bytes, accumulation, steps=steps, adapt=adapt)
        except BudgetError as e:  # the error fit reports says what that batch needs
            raise with_predicted_need(e, artifact, b, adapt=adapt) from e

    return largest_batch(predicted_peak, confirmed, budget_bytes, accumulation)


def with_predicted_need(err: BudgetError, artifact: str | Path, micro_batch: int | None,
                        threads: int | None = None, adapt: str = "none") -> BudgetError:
    """A budget error with the failing step's predicted need, when the message lacks it (the
    manifest predicts the plan's micro-batch only), for the cycle of personalise --adapt
    `adapt`. The prediction is extra: an artifact it cannot read leaves the error as it was,
    since that error is what the user must see."""
    if err.predicted or micro_batch is None:
        return err
    try:
        m = load_manifest(artifact)
        pred = predict_manifest(artifact, m, micro_batch, threads,
                                batchnorm_stats=replays_batchnorm(m, adapt),
                                batchnorm_group=m.plan.accumulation_steps)
    except Exception:  # noqa: BLE001 - any failure here must not hide the budget error
        return err
    return with_prediction(err, {"batch": micro_batch, "peak_bytes": pred.peak_bytes,
                                 "complete": pred.complete}, micro_batch)
