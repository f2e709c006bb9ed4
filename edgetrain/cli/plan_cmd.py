"""`edgetrain plan`: the fastest plan that fits a device, predicted then confirmed by capped
runs (device_sim/planner.py); this command only parses and prints."""
from __future__ import annotations

import json

import click

from edgetrain.cli.common import (EXIT_BUDGET, budget_option, check_target, device_option,
                                  exit_on_device_errors, fail, json_option, mib, progress_bar,
                                  resolve_budget)


@click.command(options_metavar="(--device P | --budget BYTES) [OPTIONS]")
@click.argument("artifact", type=click.Path())
@device_option("Plan for this profile's budget.")
@budget_option("Plan for this many bytes.")
@click.option("--samples", type=click.IntRange(min=1), default=None,
              help="Samples (windows) per optimizer step (default: the artifact's micro-batch "
                   "x accumulation); a patch artifact's step holds each sample's patches.")
@click.option("--threads", type=click.IntRange(min=1), default=None,
              help="ORT intra-op threads (default: the artifact's plan).")
@click.option("--steps", type=click.IntRange(min=1), default=2, show_default=True,
              help="Timed optimizer steps per confirming run.")
@click.option("--write", is_flag=True,
              help="Make the chosen plan the artifact's (manifest: micro-batch, accumulation, "
                   "prediction, and the search under provenance.plan_search).")
@click.option("--recalibrate", is_flag=True,
              help="Measure this machine's speed again (it is cached under .cache/host-profile "
                   "in the working folder; measure it when the machine is otherwise idle).")
@click.option("--plot", "plot_file", type=click.Path(dir_okay=False),
              help="Draw the frontier (predicted peak vs step time) into this PNG.")
@json_option
def plan(artifact, device, budget, samples, threads, steps, write, recalibrate, plot_file,
         as_json):
    """The fastest micro-batch and accumulation that fit: predicted, then confirmed."""
    from device_sim.hostprofile import host_speed
    from device_sim.planner import items_per_sample, plan as search, write_plan
    from edgetrain.manifest import load_manifest

    if (device is None) == (budget is None):
        raise click.UsageError("give --device NAME or --budget BYTES")
    device, budget_bytes = resolve_budget(device, budget)
    with exit_on_device_errors():
        check_target(artifact, device)
        m = load_manifest(artifact)
        per = items_per_sample(m)
        speed = host_speed(threads or m.plan.threads, refresh=recalibrate)
        bar = None if as_json else progress_bar(desc="plan", unit=" capped runs")

        def started(what: str) -> None:
            bar.set_postfix_str(what, refresh=False)
            bar.update(1)
        try:
            r = search(artifact, budget_bytes, samples * per if samples else None, threads,
                       steps, speed=speed, progress=started if bar is not None else None)
        finally:
            if bar is not None:
                bar.close()
        if write and r.chosen is None:
            fail(f"no plan to write: {r.reason}; nothing was written. Try a larger budget, "
                 "fewer --samples, or re-export with less to train or keep (--update head, "
                 "--recompute sqrt, --density 0.5)", EXIT_BUDGET)
        if write:
            write_plan(artifact, r)
        if plot_file:
            from exporters.views.report import plot_frontier  # matplotlib: only when asked

            plot_frontier(r.to_dict(), plot_file)
    if as_json:
        click.echo(json.dumps({"device": device, **r.to_dict()}, indent=2))
        return
    h = r.host
    click.echo(f"device: {device or 'custom'}  budget: {mib(budget_bytes)}  step: "
               f"{r.effective_batch} items ({r.effective_batch // per} samples)  threads: "
               f"{r.threads}")
    click.echo(f"this machine, measured: {h['compute_flops_per_s'] / 1e9:.1f} GFLOP/s dense, "
               f"{h['depthwise_flops_per_s'] / 1e9:.1f} grouped, "
               f"{h['memory_bandwidth_bytes_per_s'] / 1e9:.1f} GB/s; a node costs "
               f"{h['compute_node_overhead_s'] * 1e6:.1f} us (convolution) or "
               f"{h['node_overhead_s'] * 1e6:.2f} us (other), a call "
               f"{h['call_overhead_s'] * 1e6:.0f} us")
    click.echo(f"{'micro-batch':>11} {'x acc':>6} {'predicted peak':>16} {'predicted s':>12} "
               f"{'measured peak':>15} {'measured s':>11}  confirmed")
    for c in r.candidates:
        peak = f"{c.predicted_peak_bytes:,}" if c.predicted_peak_bytes is not None else "no claim"
        mpeak = f"{c.measured_peak_bytes:,}" if c.measured_peak_bytes is not None else ""
        mt = f"{c.measured_step_time_s:.3f}" if c.measured_step_time_s is not None else ""
        click.echo(f"{c.micro_batch:>11} {c.accumulation_steps:>6} {peak:>16} "
                   f"{c.predicted_step_time_s:>12.3f} {mpeak:>15} {mt:>11}  {c.confirmed}")
    if r.chosen is None:
        click.echo(f"no plan: {r.reason}")
        return
    c = r.chosen
    click.echo(f"plan: micro-batch {c.micro_batch} x {c.accumulation_steps} "
               f"({c.measured_step_time_s:.3f} s a step, measured peak "
               f"{mib(c.measured_peak_bytes)}); {r.reason}"
               + ("; written to the manifest" if write else "; --write makes it the artifact's"))
    if plot_file:
        click.echo(f"wrote {plot_file}")
