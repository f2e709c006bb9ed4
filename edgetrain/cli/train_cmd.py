"""`edgetrain personalise` and `edgetrain reset-bn`: a run on one user's data inside a budget
(device side: these commands never load torch)."""
from __future__ import annotations

import json

import click
import numpy as np

from device_sim.profiles import PROFILES
from edgetrain.cli.common import (Bytes, Progress, budget_advice, check_target,
                                  exit_on_device_errors, fixed_address_layout, json_option,
                                  mib, refuse_unused, resolve_budget)
from edgetrain import signing
from edgetrain.datasets import DATASETS, PROTOCOL_LABELS, PROTOCOLS
from edgetrain.intervals import UserTest, gain_interval
from edgetrain.masks import UPDATERS


def user_run_options(f):
    """--user/--dataset/--protocol, --data/--test, --device/--budget and --out: a run on one
    user's data in a budget."""
    options = [
        click.option("--user", type=int, help="A subject of a built-in data set (watch: 1-10, "
                     "hapt: 1-30) the artifact did not pretrain on."),
        click.option("--dataset", type=click.Choice(sorted(DATASETS)), default=None,
                     help="The data set of --user (default: the one the artifact pretrained "
                          "on)."),
        click.option("--protocol", type=click.Choice(sorted(PROTOCOLS)), default=None,
                     help="How --user's recordings split (default: the data set's: hapt "
                          "later-session, watch other-arm; watch within-set is an upper "
                          "bound). docs/concepts.md#the-personalisation-protocol"),
        click.option("--data", "data_file", type=click.Path(),
                     help="Your windows: .npz with x and y."),
        click.option("--test", "test_file", type=click.Path(),
                     help="Optional .npz test set for --data."),
        click.option("--device", type=click.Choice(sorted(PROFILES)),
                     help="Device profile (budget)."),
        click.option("--budget", type=Bytes(), help="RAM budget, e.g. 15MB or 8692224."),
        click.option("--out", required=True, type=click.Path(file_okay=False),
                     help="Run folder."),
        click.option("--trust", type=click.Path(dir_okay=False), default=None,
                     help="An Ed25519 public key (`edgetrain keygen`): refuse the artifact "
                          "unless that key signed it (`export --sign`)."),
    ]
    for option in reversed(options):
        f = option(f)
    return f


def user_run_budget(user, data_file, device, budget, what: str) -> tuple[str | None, int]:
    """Check the user-data and budget options of a run; returns (device, budget_bytes)."""
    if (user is None) == (data_file is None):
        raise click.UsageError("give exactly one of --user N or --data FILE.npz")
    if device is None and budget is None:
        raise click.UsageError(f"give --device NAME or --budget BYTES: {what} always runs "
                               "inside a memory budget (`edgetrain devices` lists profiles)")
    return resolve_budget(device, budget)


@click.command(
    options_metavar="(--user N | --data FILE) (--device P | --budget BYTES) --out DIR [OPTIONS]")
@click.argument("artifact", type=click.Path())
@user_run_options
@click.option("--epochs", type=int, default=5, show_default=True,
              help="Epochs per learning rate (at most, with early stopping).")
@click.option("--lr", type=float, default=None, help="Learning rate (default: the artifact's).")
@click.option("--micro-batch", type=int, default=None, help="Default: the artifact's plan.")
@click.option("--accumulate", type=int, default=None, help="Default: the artifact's plan.")
@click.option("--seed", type=int, default=0, show_default=True,
              help="Seeds the data order and anything random (the same seed, the same run).")
@click.option("--threads", type=int, default=None, help="ORT intra-op threads.")
@click.option("--mask-update", type=click.Choice(sorted(UPDATERS)), default=None,
              help="Dynamic sparse training (sparse artifacts): regrow at random (set) or "
                   "where the dense gradient is largest (rigl).")
@click.option("--mask-every", type=int, default=10, show_default=True,
              help="Optimizer steps between mask updates.")
@click.option("--drop-fraction", type=float, default=0.3, show_default=True,
              help="Fraction of kept weights replaced at the first update (cosine decay).")
@click.option("--mask-end", type=float, default=0.75, show_default=True,
              help="No mask updates after this fraction of the steps.")
@click.option("--checkpoint-every", type=click.IntRange(min=0), default=100, show_default=True,
              help="Optimizer steps between resume points (0: only at epoch ends).")
@click.option("--resume", is_flag=True,
              help="Continue the run in --out from its newest intact resume point.")
@click.option("--select/--no-select", default=True, show_default=True,
              help="Hold out a validation slice of your labelled windows (cut in time) and "
                   "choose the learning rate, the epoch and the final model on it; the guard "
                   "keeps the population model if personalising did not help.")
@click.option("--val-fraction", type=click.FloatRange(0, 1, min_open=True, max_open=True),
              default=0.25, show_default=True, help="Share of each recording (--user) or of "
              "each class's windows (--data, in time order) that validates.")
@click.option("--val", "val_file", type=click.Path(), help="Your validation windows (.npz) "
              "for --data, instead of cutting them from it.")
@click.option("--lr-grid", type=str, default=None, help="Learning rates tried, e.g. "
              "1e-4,3e-4,1e-3 (default: the lr and a third and three times it).")
@click.option("--patience", type=click.IntRange(min=1), default=2, show_default=True,
              help="Epochs without a better validation score before a learning rate stops.")
@click.option("--guard-margin", type=click.IntRange(min=0), default=1, show_default=True,
              help="Validation windows personalising must gain over the population model.")
@click.option("--adapt", type=click.Choice(["none", "bn", "auto"]), default="none",
              show_default=True, help="bn: re-estimate BatchNorm statistics from your windows "
              "first (no labels); the guard keeps them by --adapt-guard (the benchmark's and "
              "the demo's recipe). auto: bn where the artifact has BatchNorm layers. "
              "`measure --adapt` replays it.")
@click.option("--adapt-guard", type=click.Choice(["loss", "windows"]), default="loss",
              show_default=True, help="When the guard keeps the adapted statistics (no weight "
              "trained) over the population model: loss, if they lose no validation window "
              "and do not raise the validation loss; windows, if they lose no window.")
@click.option("--mix", "mixes", type=str, default=None, help="Weight interpolation: after "
              "training, mix the start and the best trained weights, start + m x (best - "
              "start). One m (e.g. 0.5) is used as it is; several (e.g. 0.25,0.5,1) are scored "
              "on the validation slice and the best kept; 'default' is 0.25,0.5,0.75,1. The "
              "guard then judges the mix.")
@click.option("--labels-per-class", type=click.IntRange(min=0), default=None,
              help="Train on each class's first N windows only (0: label-free, --adapt bn).")
@json_option
def personalise(artifact, user, dataset, protocol, data_file, test_file, device, budget, out,
                trust, epochs, lr,
                micro_batch, accumulate, seed, threads, mask_update, mask_every, drop_fraction,
                mask_end, checkpoint_every, resume, select, val_fraction, val_file, lr_grid,
                patience, guard_margin, adapt, adapt_guard, mixes, labels_per_class, as_json):
    """Train an artifact on one user's data inside a device's memory budget."""
    from edgetrain.masks import MaskSchedule
    from edgetrain.personalise import TrainConfig
    from edgetrain.personalise import personalise as run
    from edgetrain.userdata import user_split

    device, budget_bytes = user_run_budget(user, data_file, device, budget, "personalisation")
    fixed_address_layout()
    with exit_on_device_errors(), budget_advice(artifact, micro_batch, threads, adapt=(
            "bn" if labels_per_class == 0 else adapt)):
        if trust:  # before any other part of the artifact is read
            signing.verify(artifact, trust)
        check_target(artifact, device)
        if labels_per_class == 0:  # label-free: adaptation only, nothing to select with
            if adapt == "none":
                raise click.UsageError("--labels-per-class 0 trains nothing: add --adapt bn")
            epochs, labels_per_class, select, adapt = 0, None, False, "bn"
        d = user_split(artifact, user, data_file, test_file,
                       val_fraction if select else None, val_file if select else None,
                       dataset, protocol)
        if not mask_update:
            refuse_unused(("mask_every", "drop_fraction", "mask_end"), "--mask-update rigl|set")
        masks = (MaskSchedule(mask_update, mask_every, drop_fraction, mask_end)
                 if mask_update else None)
        if mask_update and UPDATERS[mask_update].needs_dense_grad and not as_json:
            click.echo(dense_gradient_note(artifact, mask_update), err=True)
        cfg = TrainConfig(epochs=epochs, lr=lr, micro_batch=micro_batch,
                          accumulation_steps=accumulate, seed=seed, masks=masks,
                          checkpoint_every=checkpoint_every, lrs=parse_lrs(lr_grid),
                          patience=patience, guard_margin=guard_margin, adapt=adapt,
                          labels_per_class=labels_per_class, adapt_guard=adapt_guard,
                          mixes=parse_mixes(mixes))
        with Progress(not as_json) as progress:
            r = run(artifact, d.train, d.test, out, budget_bytes, cfg, progress=progress,
                    threads=threads, resume=resume, val=d.val, test_groups=d.test_groups,
                    trust=trust)
    if as_json:
        click.echo(json.dumps({"device": device, "protocol": d.protocol, **r.to_dict()},
                              indent=2))
        return
    click.echo(f"device: {device or 'custom'}  budget: {mib(budget_bytes)}")
    if d.protocol:
        click.echo(f"protocol: {PROTOCOL_LABELS[d.protocol]}")
    if r.resumed_from_step is not None:
        click.echo(f"resumed from the resume point after step {r.resumed_from_step}")
    if r.damaged_resume_points_moved_to:
        click.echo(f"no resume point was intact: they are kept in "
                   f"{r.damaged_resume_points_moved_to}, and the run started again")
    done_here = r.optimizer_steps - (r.resumed_from_step or 0)
    click.echo(f"trained {r.optimizer_steps} optimizer steps of {r.micro_batch} x "
               f"{r.accumulation_steps} items ({r.train_items} items an epoch{per_item(artifact)}"
               + (f", for each of {len(r.learning_rates)} learning rates)"
                  if r.learning_rates and len(r.learning_rates) > 1 else ")")
               + (f"; this process trained the last {done_here} in {r.train_time_s:.1f} s"
                  if r.resumed_from_step is not None else f" in {r.train_time_s:.1f} s"))
    if r.measured_peak_bytes is not None:
        click.echo(f"measured peak of this run: {mib(r.measured_peak_bytes)} (ONNX Runtime's "
                   "allocator; the training working set the budget covers)")
    if r.guard is not None:
        click.echo(r.guard["message"])
    if r.accuracy_before is not None:
        g = gain_interval([UserTest.of(r.test_correct_before, r.test_correct_after,
                                       r.test_recordings or range(len(r.test_correct_after)))])
        click.echo(f"held-out accuracy: before {r.accuracy_before:.3f}  after "
                   f"{r.accuracy_after:.3f}  gain {g.gain_points:+.1f} points (95% interval "
                   f"{g.low_points:+.1f} to {g.high_points:+.1f}, resampling {g.recordings} "
                   f"test {d.test_unit}; {len(r.test_correct_after)} windows)")
        click.echo(f"inference model agrees with runtime eval on {r.inference_agreement:.1%} "
                   "of test samples")
    if r.mask_method:
        click.echo(f"mask updates ({r.mask_method}): {r.mask_updates}, {r.regrown_weights:,} "
                   "weights regrown in all")
    click.echo(f"checkpoint: {r.checkpoint}  inference model: {r.inference_model}")


def dense_gradient_note(artifact, method: str) -> str:
    """What a mask update that grows by dense gradients adds, said before the run starts."""
    from edgetrain.manifest import load_manifest

    m = load_manifest(artifact, verify=False)
    dense = sum(int(np.prod(k.shape)) * 4 for k in m.trained_masks)
    predicted = m.predicted.get("peak_bytes")
    return (f"{method}: every mask update also runs the dense-gradient graph inside the budget; "
            f"it holds every masked layer's dense gradient ({dense:,} bytes) and its own "
            "activations beside training's state, which the export's predicted peak"
            + (f" ({predicted:,} bytes)" if isinstance(predicted, int) else "")
            + " leaves out: the run's measured peak includes it")


def per_item(artifact) -> str:
    """What one training item is, when it is not one window: a patch of an image."""
    from edgetrain.manifest import load_manifest

    inp = load_manifest(artifact, verify=False).input
    if inp.sample_shape == inp.image_shape:
        return ""
    per = int(np.prod(inp.image_shape)) // int(np.prod(inp.sample_shape))
    return f"; an item is one {list(inp.sample_shape)} patch, {per} to a window"


def parse_lrs(text: str | None) -> tuple[float, ...] | None:
    if text is None:
        return None
    try:
        return tuple(float(v) for v in text.split(","))
    except ValueError:
        raise click.BadParameter(f"{text!r} is not a list of learning rates; write e.g. "
                                 "1e-4,3e-4,1e-3", param_hint="--lr-grid") from None


def parse_mixes(text: str | None) -> tuple[float, ...]:
    from edgetrain.interpolation import DEFAULT_MIXES, check_mixes

    if text is None:
        return ()
    if text == "default":
        return DEFAULT_MIXES
    try:
        mixes = tuple(float(v) for v in text.split(","))
        check_mixes(mixes)
    except ValueError as e:
        why = str(e) if "at most 1" in str(e) else f"{text!r} is not a list of numbers"
        raise click.BadParameter(f"{why}; write e.g. 0.25,0.5,0.75, or default",
                                 param_hint="--mix") from None
    return mixes


@click.command(
    "reset-bn",
    options_metavar="(--user N | --data FILE) (--device P | --budget BYTES) --out DIR [OPTIONS]")
@click.argument("artifact", type=click.Path())
@user_run_options
@click.option("--samples", type=int, default=256, show_default=True,
              help="User samples that feed the statistics (forward passes only).")
@click.option("--micro-batch", type=int, default=None, help="Default: the artifact's plan.")
@click.option("--seed", type=int, default=0, show_default=True,
              help="Seeds the data order and anything random (the same seed, the same run).")
@click.option("--threads", type=int, default=None, help="ORT intra-op threads.")
@json_option
def reset_bn(artifact, user, dataset, protocol, data_file, test_file, device, budget, out,
             trust, samples, micro_batch, seed, threads, as_json):
    """Re-estimate BatchNorm statistics on a user's samples (RESET, after pruning)."""
    from edgetrain.bnreset import reset_batchnorm
    from edgetrain.userdata import user_data

    device, budget_bytes = user_run_budget(user, data_file, device, budget, "RESET")
    fixed_address_layout()
    with exit_on_device_errors(), budget_advice(artifact, micro_batch, threads, adapt="bn"):
        if trust:  # before any other part of the artifact is read
            signing.verify(artifact, trust)
        check_target(artifact, device)
        train, test = user_data(artifact, user, data_file, test_file, dataset, protocol)
        r = reset_batchnorm(artifact, train, test, out, budget_bytes, samples, seed,
                            micro_batch, threads, trust=trust)
    if as_json:
        click.echo(json.dumps({"device": device, **r.to_dict()}, indent=2))
        return
    click.echo(f"device: {device or 'custom'}  budget: {mib(budget_bytes)}")
    click.echo(f"RESET from {r.samples} samples in {r.batches} forward passes of "
               f"{r.micro_batch} items")
    if r.accuracy_before is not None:
        click.echo(f"held-out accuracy: before RESET {r.accuracy_before:.3f}  after "
                   f"{r.accuracy_after:.3f}")
    click.echo(f"checkpoint: {r.checkpoint}  inference model: {r.inference_model}")
