"""`edgetrain devices`, `measure` and `fit`: the simulator drives the runtime from outside and
reports (device_sim/reports.py); these commands only parse and print."""
from __future__ import annotations

import json

import click

from device_sim.profiles import PROFILES, TIER_PLANS
from edgetrain.cli.common import (budget_advice, budget_option, check_target, device_option,
                                  exit_on_device_errors, json_option, mib, progress_bar,
                                  resolve_budget)


@click.command()
@json_option
def devices(as_json):
    """List the device profiles and their RAM budgets for training."""
    if as_json:
        click.echo(json.dumps({n: {**vars(p), "target": p.target, "ships": (
            {**vars(TIER_PLANS[n]), "export_args": TIER_PLANS[n].export_args()}
            if n in TIER_PLANS else None)} for n, p in PROFILES.items()}, indent=2))
        return
    for p in PROFILES.values():
        size = (f"{p.ram_budget_bytes / 2**20:8.1f} MiB" if p.ram_budget_bytes >= 2**20
                else f"{p.ram_budget_bytes / 2**10:8.0f} KiB")
        click.echo(f"{p.name:18s} {size}  {p.target:8s}  {p.description}")
        if p.name in TIER_PLANS:
            click.echo(f"{'':18s} ships: {TIER_PLANS[p.name].label} "
                       f"(edgetrain export {' '.join(TIER_PLANS[p.name].export_args())})")


@click.command(options_metavar="--batch N [--device P | --budget BYTES] [OPTIONS]")
@click.argument("artifact", type=click.Path())
@click.option("--batch", type=int, required=True, help="Micro-batch (samples per step).")
@device_option("Run capped at this profile.")
@budget_option("Run capped at this many bytes.")
@click.option("--accumulate", type=int, default=None,
              help="Micro-batches summed per optimizer step in the replayed cycle (and per "
                   "BatchNorm statistics batch with --adapt). Default: the artifact's plan.")
@click.option("--steps", type=int, default=3, show_default=True, help="Timed optimizer steps.")
@click.option("--threads", type=int, default=None,
              help="ORT intra-op threads (default: the artifact's plan).")
@click.option("--plot", "plot_dir", type=click.Path(file_okay=False),
              help="Write timeline.png and graph.png into this folder.")
@click.option("--select/--no-select", default=True, show_default=True,
              help="Replay on-device selection as personalise does by default (weights "
                   "saved, a candidate restarted, the best loaded back).")
@click.option("--adapt", type=click.Choice(["none", "bn", "auto"]), default="none",
              show_default=True, help="Replay personalise --adapt (bn: BatchNorm statistics "
              "first; auto: where the artifact has BatchNorm layers). The prediction covers "
              "the statistics pass too.")
@json_option
def measure(artifact, batch, device, budget, accumulate, steps, threads, plot_dir, select,
            adapt, as_json):
    """Measure the peak bytes of training, from the runtime's own allocator."""
    from device_sim.reports import measure_report  # host side: reads the graphs with onnx

    device, budget_bytes = resolve_budget(device, budget)
    with exit_on_device_errors(), budget_advice(artifact, batch, threads, "--batch", adapt):
        check_target(artifact, device)
        doc = measure_report(artifact, batch, device=device, budget_bytes=budget_bytes,
                             accumulate=accumulate, steps=steps, threads=threads,
                             plot_dir=plot_dir, select=select, adapt=adapt)
    if as_json:
        click.echo(json.dumps(doc, indent=2))
        return
    peak = doc["peak_bytes"]
    where = device or ("capped by --budget" if budget_bytes is not None else "uncapped")
    click.echo(f"device: {where}  budget: {mib(budget_bytes)}")
    click.echo(f"measured peak at batch {batch}: {mib(peak)}"
               + ("" if budget_bytes is None else
                  f"  ({'within' if peak <= budget_bytes else 'OVER'} budget)"))
    for k, v in doc["breakdown"].items():
        click.echo(f"  {k:16s} {v:>14,}   predicted {doc['predicted_breakdown'][k]:>14,}")
    masks = doc["predicted_masks_at_peak"]
    if masks["tensors"]:
        click.echo(f"    of the predicted activations at the fullest moment: {masks['bytes']:,} "
                   f"bytes in {masks['tensors']} ReLU masks (1 byte an element, kept in place "
                   "of the float outputs for the gradient)")
    rc = doc["recompute"]
    if rc["recomputed"]:
        click.echo(f"recompute ({rc['planner']}): {len(rc['recomputed'])} tensors rebuilt in "
                   f"backward from {len(rc['checkpoints'])} checkpoints, "
                   f"+{rc['extra_flops_ratio']:.0%} FLOPs per step")
    err = (doc["predicted_peak_bytes"] - peak) / peak
    if doc["predicted_complete"]:
        click.echo(f"predicted peak (static graph plan, {doc['predicted_threads']} threads): "
                   f"{mib(doc['predicted_peak_bytes'])}  ({err:+.1%} of measured)"
                   + ("; the BatchNorm statistics pass included" if doc["batchnorm_stats_pass"]
                      else ""))
    else:
        click.echo(f"predictor: {doc['prediction_caveat']}")
    device_time = doc["predicted_device_step_time_s"]
    click.echo(f"step: {doc['step_flops'] / 1e9:.2f} GFLOP, {doc['step_bytes_moved'] / 1e6:.1f} "
               "MB moved" + ("" if device_time is None else
                             f"; predicted on {device} (roofline at peak): "
                             f"{device_time * 1e3:.1f} ms"))
    click.echo(f"step time on this machine: {doc['step_time_s'] * 1e3:.1f} ms "
               f"({doc['threads']} threads); torch loaded: {doc['torch_loaded']}")
    click.echo(f"the measuring process's peak RSS: {mib(doc['process_peak_rss_bytes'])}, the "
               "Python interpreter and ORT's code included (outside the budget, which covers "
               "the training working set: docs/concepts.md, 'What lives outside the cap')")
    for path in doc.get("plots", []):
        click.echo(f"wrote {path}")


@click.command(options_metavar="(--device P | --budget BYTES) [OPTIONS]")
@click.argument("artifact", type=click.Path())
@device_option()
@budget_option("Budget in bytes, e.g. 15MiB.")
@click.option("--adapt", type=click.Choice(["none", "bn", "auto"]), default="none",
              show_default=True, help="Confirm with personalise --adapt replayed (BatchNorm "
              "statistics first).")
@json_option
def fit(artifact, device, budget, adapt, as_json):
    """Largest batch that trains under a budget: predicted, then confirmed by capped runs."""
    from device_sim.reports import fit_report

    if (device is None) == (budget is None):
        raise click.UsageError("give --device NAME or --budget BYTES")
    device, budget_bytes = resolve_budget(device, budget)
    with exit_on_device_errors():
        check_target(artifact, device)
        bar = None if as_json else progress_bar(desc="fit", unit=" capped runs")

        def started(batch: int) -> None:
            bar.set_postfix_str(f"batch {batch}", refresh=False)
            bar.update(1)
        try:
            r = fit_report(artifact, budget_bytes, adapt=adapt,
                           progress=started if bar is not None else None)
        finally:
            if bar is not None:
                bar.close()
    if as_json:
        click.echo(json.dumps({"artifact": str(artifact), "device": device, **r.to_dict()},
                              indent=2))
        return
    click.echo(f"device: {device or 'custom'}  budget: {mib(budget_bytes)}")
    click.echo("largest batch predicted to fit: " + (
        str(r.predicted_max_batch) if r.predicted_max_batch is not None
        else "no prediction (the predictor cannot size this step: capped runs alone)"))
    if r.max_batch == 0:
        click.echo(f"confirmed: not even batch 1 trains ({r.runs} capped runs): {r.next_batch_error}")
        return
    click.echo(f"confirmed largest batch: {r.max_batch} (measured peak {mib(r.peak_bytes)}); "
               f"batch {r.max_batch + 1} fails cleanly ({r.runs} capped runs)")
    click.echo(f"throughput at batch {r.max_batch} on this machine: "
               f"{r.throughput_samples_per_s:.1f} samples/s ({r.step_time_s * 1e3:.1f} ms/step)")
