"""`edgetrain fleet` and `edgetrain fleet-report`: personalise many users across a device mix on
Ray (device_sim/fleet.py) and summarise the records (device_sim/fleetreport.py); these
commands only parse and print."""
from __future__ import annotations

import json
from pathlib import Path

import click

from edgetrain.cli.common import exit_on_device_errors, fail, json_option, progress_bar

EXIT_INCOMPLETE = 6  # some tasks failed after all their retries: run the same command again


def _report(records: list[dict], plot_dir: Path | None, devices=()) -> tuple[dict, list[str]]:
    from device_sim.fleetreport import plots, report

    rep = report(records, devices)
    return rep, (plots(records, plot_dir) if plot_dir and records else [])


@click.command(options_metavar="--out DIR [OPTIONS]")
@click.argument("spec_file", metavar="SPEC", type=click.Path())
@click.option("--out", required=True, type=click.Path(file_okay=False),
              help="The fleet folder: records, run folders, merged table (docs/fleet.md). "
                   "Running again into it skips every user x device already done.")
@click.option("--address", default=None,
              help="Join a running Ray cluster (`auto`, or HEAD:6379 from `ray start --head`); "
                   "default: an embedded local Ray, nothing to start.")
@click.option("--workers", type=click.IntRange(min=1), default=None,
              help="CPUs of the embedded local Ray (default: every core); with --address the "
                   "cluster's own.")
@click.option("--plots", "plot_dir", type=click.Path(file_okay=False), default=None,
              help="Draw gains.png, peaks.png and timeline.png here (default: OUT/plots).")
@json_option
def fleet(spec_file, out, address, workers, plot_dir, as_json):
    """Personalise a fleet of users on a mix of devices, one capped process per run, on Ray."""
    from device_sim.fleet import run_fleet
    from device_sim.fleetreport import table
    from device_sim.fleetspec import load_spec

    with exit_on_device_errors():
        spec = load_spec(spec_file)
        total = len(spec.pairs())
        bar = None
        if not as_json:
            bar = progress_bar(total=total, desc="fleet", unit="run")
        try:
            run = run_fleet(spec, out, address, workers, bar.update if bar else None)
        finally:
            if bar is not None:
                bar.close()
        rep, pictures = _report(run.records, Path(plot_dir or Path(out) / "plots"),
                                spec.devices)
    doc = {"out": run.out, "scheduled": run.scheduled, "skipped": run.skipped,
           "failed": [list(f) for f in run.failed], "wall_s": run.wall_s,
           "cluster_cpus": run.workers, "plots": pictures, "report": rep}
    if as_json:
        click.echo(json.dumps(doc, indent=2))
    else:
        click.echo(table(rep))
        done = (f"{run.scheduled} runs on {run.workers} CPUs in {run.wall_s:.1f} s "
                f"({run.skipped} already done)" if run.scheduled else
                f"nothing to run: all {run.skipped} user x device pairs already have records")
        click.echo(f"{done}; records: {Path(out) / 'fleet.json'}"
                   + (f"; plots: {', '.join(pictures)}" if pictures else ""))
    if run.failed:
        lines = "; ".join(f"user {u} on {d}: {e}" for u, d, e in run.failed[:5])
        fail(f"{len(run.failed)} runs failed after their retries ({lines}); their resume points "
             "are kept: run the same command again to continue them", EXIT_INCOMPLETE)


@click.command("fleet-report", options_metavar="[OPTIONS]")
@click.argument("fleet_dir", metavar="DIR", type=click.Path(file_okay=False))
@click.option("--plots", "plot_dir", type=click.Path(file_okay=False), default=None,
              help="Draw gains.png, peaks.png and timeline.png here.")
@json_option
def fleet_report(fleet_dir, plot_dir, as_json):
    """Summarise a fleet folder's records: per device, per user."""
    from device_sim.fleetreport import load_records, spec_devices, table

    with exit_on_device_errors():
        records = load_records(fleet_dir)
        rep, pictures = _report(records, Path(plot_dir) if plot_dir else None,
                                spec_devices(fleet_dir))
    if as_json:
        click.echo(json.dumps({**rep, "plots": pictures}, indent=2))
    else:
        click.echo(table(rep))
