"""`edgetrain export`: pretrain a population model (cached) and export it (host side);
`edgetrain keygen`: a key pair to sign artifacts with (edgetrain/signing.py)."""
from __future__ import annotations

import json

import click

from device_sim.profiles import PROFILES
from edgetrain import signing
from edgetrain.datasets import DATASETS
from edgetrain.cli.common import (budget_option, device_option, exit_on_device_errors, json_option,
                                  resolve_budget)
from edgetrain.cli.plan_variants import plan_over_variants
from edgetrain.manifest import DEFAULT_THREADS, SAVED_ACTIVATIONS

# exporters.models.networks.NETWORKS' names, spelled here so `--help` needs no torch (a test keeps
# them equal)
NETWORK_NAMES = ("imu_cnn", "imu_transformer", "mobilenet_v1", "patch_mobilenet", "resnet50")
from edgetrain.names import BATCHNORM_ADAPT_ROLES, SIGNATURE_NAME
from edgetrain.targets import TARGETS


def record_measured_peak(out, m):
    """Measure the artifact the update search chose (device_sim, the allocator) and record
    the peak beside the search in the manifest's provenance."""
    import dataclasses

    from device_sim.measure import measure

    peak = measure(out, m.plan.micro_batch, threads=m.plan.threads).peak_bytes
    search = {**m.provenance["update_search"], "measured_peak_bytes": peak,
              "measured_fits": peak <= m.provenance["update_search"]["budget_bytes"]}
    m = dataclasses.replace(m, provenance={**m.provenance, "update_search": search})
    m.write(out)
    return m


@click.command(options_metavar="--model NAME --out DIR [OPTIONS]")
@click.option("--model", "model_name", required=True, type=click.Choice(NETWORK_NAMES),
              help="Built-in network: patch_mobilenet, mobilenet_v1, resnet50 (GASF images), "
                   "imu_cnn, imu_transformer (raw IMU windows).")
@click.option("--out", required=True, type=click.Path(file_okay=False), help="Artifact folder.")
@click.option("--width", type=float, default=None,
              help="Width multiplier (default per network: 0.25 for the MobileNets, 1.0 for "
                   "resnet50 and imu_cnn, 0.5 for imu_transformer).")
@click.option("--dataset", type=click.Choice(sorted(DATASETS)), default="watch",
              show_default=True, help="Data set the population model pretrains on: watch "
              "(smartwatch IMU, 10 subjects, one session) or hapt (UCI HAPT, 30 subjects, two "
              "sessions).")
@click.option("--holdout-user", type=int, default=10, show_default=True,
              help="Subject left out of population pretraining (personalise on this one).")
@click.option("--also-holdout", type=str, default="", metavar="N,N",
              help="More subjects left out of pretraining, e.g. 8,9 (a fleet's real users and "
                   "the sources of its synthetic ones: docs/fleet.md).")
@click.option("--micro-batch", type=int, default=8, show_default=True,
              help="Samples per forward/backward call on the device (the plan's micro-batch).")
@click.option("--accumulate", type=int, default=1, show_default=True,
              help="Micro-batches summed per optimizer step.")
@click.option("--threads", type=click.IntRange(min=1), default=DEFAULT_THREADS, show_default=True,
              help="ORT intra-op threads the device will run with (recorded in the plan; the "
                   "predicted peak is for this count).")
@click.option("--epochs", type=click.IntRange(min=0), default=8, show_default=True,
              help="Pretraining epochs (0: export the network untrained, a quick check of the "
              "toolchain).")
@click.option("--lr", type=float, default=3e-4, show_default=True, help="On-device learning rate.")
@click.option("--no-cache", is_flag=True, help="Pretrain again even if cached.")
@click.option("--recompute", type=click.Choice(["none", "sqrt", "budget", "optimal"]),
              default="none", show_default=True, help="Recompute plan written into the "
              "training graph; budget: the cheapest plan predicted to fit --budget or --device; "
              "optimal: the lowest peak within --recompute-time.")
@click.option("--recompute-time", type=click.FloatRange(min=1.0), default=None,
              help="For --recompute optimal: the step may take at most this many times the "
              "time of the step without recompute, as the step-time model predicts it "
              "(default 1.3).")
@device_option("Budget from a device profile.")
@budget_option("Byte budget for --recompute budget, e.g. 64MiB.")
@click.option("--density", type=click.FloatRange(0, 1, min_open=True), default=1.0,
              show_default=True, help="Kept fraction of Conv/Linear weights (1.0 = dense).")
@click.option("--mask-allocation", type=click.Choice(["erk", "global", "uniform"]),
              default="erk", show_default=True,
              help="Per-layer densities: ERK, one global magnitude threshold, or uniform.")
@click.option("--mask-init", type=click.Choice(["magnitude", "random"]), default="magnitude",
              show_default=True, help="Which weights the first mask keeps.")
@click.option("--masking-check/--no-masking-check", default=True, show_default=True,
              help="With --density below 1: the accuracy dense, masked and after BatchNorm "
                   "RESET on the held-out users (torch, host); off skips it, e.g. in a sweep.")
@click.option("--update", default="all", show_default=True, metavar="PLAN",
              help="What trains on the device: all, head (the last layer), bias (biases and "
                   "norm scales/shifts), bias-only (biases and norm shifts), last:K (the last K layers), or PyTorch parameter "
                   "names / module prefixes; comma-separated items are joined. Frozen "
                   "tensors get no gradient, no optimizer state, and below the lowest trained "
                   "layer no saved activations.")
@click.option("--int8-frozen", is_flag=True,
              help="Store frozen weights (two or more dims) in 8 bits, one scale per output "
                   "channel; the population model's accuracy with and without is recorded.")
@click.option("--plan", "plan_mode", type=click.Choice(["given", "auto"]), default="given",
              show_default=True,
              help="auto: the fastest micro-batch x accumulation that fits --device/--budget "
                   "for the step --micro-batch x --accumulate describes, over the recompute "
                   "plans none and sqrt (or the one given), confirmed by capped runs "
                   "(`edgetrain plan`); the winner is written.")
@click.option("--plan-update", "plan_updates", multiple=True, metavar="PLAN",
              help="With --plan auto: an update plan it may choose as well (repeatable, e.g. "
                   "--plan-update head). It changes what trains, so check its accuracy.")
@click.option("--plan-density", "plan_densities", multiple=True, metavar="D",
              type=click.FloatRange(0, 1, min_open=True),
              help="With --plan auto: a kept fraction of weights it may choose as well "
                   "(repeatable, e.g. --plan-density 0.1). Each is pretrained (cached) and "
                   "exported like --density; it changes the model, so check its accuracy.")
@click.option("--weight-grad", type=click.Choice(["dense", "kept"]), default="dense",
              show_default=True,
              help="Masked pointwise layers' weight gradient: dense (ORT's dense dW, read at the "
                   "kept weights) or kept (computed at the kept weights only: less memory at "
                   "small micro-batches, a slower step). --plan auto tries kept when nothing "
                   "fits with dense.")
@click.option("--plan-weight-grad", "plan_weight_grads", multiple=True,
              type=click.Choice(["kept"]),
              help="With --plan auto on a sparse artifact: also try each variant with kept-"
                   "weights gradients (see --weight-grad).")
@click.option("--target", type=click.Choice(sorted(TARGETS)), default=None,
              help="What runs the artifact: portable (any ONNX Runtime CPU build: a watch; the "
                   "default), arm64, or host (this machine's kernels too, for simulator "
                   "throughput). Default: the --device profile's target, else portable.")
@click.option("--nchwc/--no-nchwc", default=None,
              help="Run 2-D depthwise convolutions in this machine's NCHWc kernels (faster "
                   "here; host target only, where it is the default).")
@click.option("--dense-build", type=click.Choice(["unpool", "scatter"]), default="unpool",
              show_default=True,
              help="How masked weights are rebuilt dense on each call: one MaxUnpool (faster, "
                   "one buffer) or Expand + ScatterElements (the export before this option).")
@click.option("--batchnorm-adapt", type=click.Choice(sorted(BATCHNORM_ADAPT_ROLES)),
              default="batch",
              show_default=True,
              help="How the device re-estimates BatchNorm statistics on the user's data "
                   "(personalise --adapt bn, reset-bn): batch averages each micro-batch's "
                   "statistics in one pass (RESET); exact sets one layer per pass from all the "
                   "samples, the same at any micro-batch (for small micro-batches).")
@click.option("--saved-activations", type=click.Choice(SAVED_ACTIVATIONS), default="fp32",
              show_default=True,
              help="Hold the activations a step saves for backward in 8 bits (int8: rounded "
                   "in forward, rebuilt when backward reaches them; about 4x fewer bytes, "
                   "gradients of the rounded tensors). Not with --recompute.")
@click.option("--sign", "sign_key", type=click.Path(dir_okay=False), default=None,
              help="Sign the artifact with this Ed25519 private key (from `edgetrain keygen`); "
                   "`personalise --trust KEY.pub` then refuses any artifact it did not sign.")
@json_option
def export(model_name, out, width, dataset, holdout_user, also_holdout, micro_batch, accumulate,
           threads,
           epochs, lr, no_cache, recompute, recompute_time, device, budget, density,
           mask_allocation, mask_init, masking_check,
           update, int8_frozen, plan_mode, plan_updates, plan_densities, weight_grad,
           plan_weight_grads, target, nchwc, dense_build, batchnorm_adapt, saved_activations, sign_key,
           as_json):
    """Pretrain a population model (cached) and export it as an artifact folder."""
    import dataclasses
    from pathlib import Path

    import torch

    import onnxruntime

    from edgetrain.manifest import Plan
    from exporters.export import ExportOptions
    from exporters.models.pretrain import PretrainConfig, export_named
    from exporters.export.summary import export_summary

    onnxruntime.set_default_logger_severity(3)
    torch.set_num_threads(max(1, torch.get_num_threads()))
    _, budget_bytes = resolve_budget(device, budget)
    if (recompute == "budget" or update == "auto" or plan_mode == "auto") != (
            budget_bytes is not None):
        raise click.UsageError("--recompute budget, --update auto and --plan auto need "
                               "--budget or --device, and those apply only to them")
    if recompute_time is not None and recompute != "optimal":
        raise click.UsageError(f"--recompute-time {recompute_time:g} sets the optimal planner's "
                               "step budget: add --recompute optimal")
    with exit_on_device_errors():  # bad input 2, a full disk 4, no traceback
        key = signing.private_key(sign_key) if sign_key else None  # refused before any work
        cfg = PretrainConfig(model=model_name, width=width, holdout_user=holdout_user,
                             epochs=epochs, also_held_out=subjects(also_holdout),
                             dataset=dataset)
        options = ExportOptions(
            plan=Plan(micro_batch=micro_batch, accumulation_steps=accumulate, threads=threads,
                      dense_build=dense_build, weight_grad=weight_grad,
                      batchnorm_adapt=batchnorm_adapt, saved_activations=saved_activations),
            lr=lr, recompute=recompute, density=density, mask_allocation=mask_allocation,
            recompute_budget_bytes=budget_bytes if recompute == "budget" else None,
            **({} if recompute_time is None else {"recompute_time_ratio": recompute_time}),
            mask_init=mask_init, int8_frozen=int8_frozen, nchwc=nchwc, masking_check=masking_check,
            target=target or (PROFILES[device].target if device else None))

        def build(folder, recompute_plan, update_plan, kept=density, grads=weight_grad,
                  micro=micro_batch, accumulation=accumulate):
            at = dataclasses.replace(options.plan, weight_grad=grads, micro_batch=micro,
                                     accumulation_steps=accumulation)
            m = export_named(cfg, folder, options.replace(
                plan=at, recompute=recompute_plan, density=kept, update=update_plan,
                recompute_budget_bytes=budget_bytes if recompute_plan == "budget" else None,
                update_budget_bytes=budget_bytes if update_plan == "auto" else None),
                cache_dir=None if no_cache else Path(".cache/pretrain"),
                show_progress=not as_json)
            if update_plan == "auto":  # the choice, measured as the device runs it
                m = record_measured_peak(Path(folder), m)
            return m

        if (plan_updates or plan_densities or plan_weight_grads) and plan_mode != "auto":
            raise click.UsageError("--plan-update, --plan-density and --plan-weight-grad are "
                                   "for --plan auto")
        m = build(out, recompute, update)
        if plan_mode == "auto":
            m = plan_over_variants(Path(out), m, build, recompute, update, plan_updates,
                                   budget_bytes, as_json, density, plan_densities,
                                   plan_weight_grads)
        if key is not None:
            signing.sign(Path(out), key)
    if as_json:
        click.echo(json.dumps(m.to_dict(), indent=2))
        return
    click.echo(export_summary(m, out))
    if m.plan.frozen_int8:
        f = m.provenance["int8_frozen"]
        click.echo(f"int8: {len(m.plan.frozen_int8)} frozen weights in 8 bits; population "
                   f"accuracy {f['accuracy_float32']:.3f} as float32, {f['accuracy_int8']:.3f} "
                   f"in 8 bits ({f['windows']} population windows, predictions agree on "
                   f"{f['agreement']:.1%})")
    search = m.provenance.get("update_search")
    if search:
        click.echo(f"update search for a budget of {search['budget_bytes']:,} bytes (gains: host "
                   f"replay on inner subjects {search['inner_users']}):")
        for c in search["candidates"]:
            peak = f"{c['predicted_peak_bytes']:,}" if c["predicted_peak_bytes"] else "no claim"
            gain = f"{c['gain_points']:+.1f} points" if c["gain_points"] is not None else "-"
            click.echo(f"  {'*' if c['update'] == search['chosen'] else ' '} {c['update']:<14} "
                       f"trains {c['trainable_bytes']:>10,} B, predicted peak {peak:>11} B"
                       f"{'' if c['fits'] else ' (over)':<7} gain {gain}")
        if max(c["gain_points"] for c in search["candidates"] if c["fits"]) <= 0:
            click.echo("  no plan that fits helped the inner subjects (host replay); the "
                       "device's guard decides per user whether personalising helps")
        click.echo(f"  chose {search['chosen']!r}: measured peak "
                   f"{search['measured_peak_bytes']:,} bytes"
                   + ("" if search["measured_fits"] else " - OVER the budget; use a smaller "
                      "--micro-batch"))
    if m.masks:
        kept = sum(k.nnz for k in m.masks)
        click.echo(f"sparse: {len(m.masks)} masked weights keep {kept:,} of "
                   f"{sum(k.numel for k in m.masks):,} values ({mask_allocation}, {mask_init})")
        vectors = [n for n, why in m.dense_weights.items() if why.startswith("a bias")]
        if vectors:
            click.echo(f"  stays dense: {len(vectors)} biases, norm scales and other vectors "
                       "(too small to pay for positions)")
        for name, why in m.dense_weights.items():
            if name not in vectors:
                click.echo(f"  stays dense: {name}: {why}")
        f = m.provenance.get("masking")
        if f:
            click.echo(f"  what masking costs, on held-out users {f['users']} ({f['windows']} "
                       f"windows): accuracy dense {f['accuracy_dense']:.3f}, masked "
                       f"{f['accuracy_masked']:.3f}, masked then BatchNorm RESET "
                       f"{f['accuracy_masked_reset']:.3f} (`edgetrain reset-bn` does RESET on "
                       "the device)")
        elif m.provenance.get("steps") == 0:
            click.echo("  what masking costs: not measured, the network is untrained "
                       "(--epochs 0: at chance, dense or masked)")
        elif not masking_check and m.masks:
            click.echo("  what masking costs: not measured (--no-masking-check)")
    if m.plan.recompute != "none":
        click.echo(f"recompute ({m.plan.recompute}): {len(m.plan.checkpoints)} checkpoints, "
                   f"{len(m.plan.recomputed)} tensors recomputed in backward"
                   + (f" ({m.plan.recompute_note})" if m.plan.recompute_note else
                      ": the planner recomputes nothing here, the step needs no more saving"
                      if not m.plan.recomputed else ""))
    if key is not None:
        click.echo(f"signed: {Path(out) / SIGNATURE_NAME} (Ed25519, key {sign_key})")


@click.command()
@click.argument("prefix", type=click.Path(dir_okay=False))
def keygen(prefix):
    """Make an Ed25519 key pair for signed artifacts: PREFIX.key (private, mode 0600: keep it
    off the watch) and PREFIX.pub (give it to `personalise --trust`)."""
    with exit_on_device_errors():
        private, public = signing.generate_keys(prefix)
    click.echo(f"private key: {private} (sign with `edgetrain export --sign {private}`)")
    click.echo(f"public key: {public} (check with `edgetrain personalise --trust {public}`)")


def subjects(text: str) -> tuple[int, ...]:
    """"8,9" -> (8, 9); "" -> ()."""
    try:
        return tuple(sorted({int(v) for v in text.split(",") if v.strip()}))
    except ValueError:
        raise click.BadParameter(f"{text!r} is not a list of subject numbers; write e.g. 8,9",
                                 param_hint="--also-holdout") from None
