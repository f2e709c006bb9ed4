"""The `edgetrain` command line: each command parses, calls one tested function, prints.

`export` is the host side (it imports torch); `personalise` and `measure` are the device side
and never load torch. Byte sizes such as "15MB" or "8MiB" are parsed here and nowhere else.
"""
from __future__ import annotations

import contextlib
import json
import re
import sys

import click

from device_sim.cap import BudgetError
from device_sim.profiles import PROFILES, get_profile
from edgetrain.data import DataError
from edgetrain.manifest import ArtifactError
from edgetrain.masks import UPDATERS
from edgetrain.runtime import CheckpointWriteError

EXIT_BAD_INPUT = 2
EXIT_BUDGET = 3
EXIT_DISK = 4  # a checkpoint could not be written (disk full, I/O error)
_UNITS = {"": 1, "b": 1, "kb": 1000, "mb": 1000**2, "gb": 1000**3,
          "kib": 1024, "mib": 1024**2, "gib": 1024**3}


def parse_bytes(text: str) -> int:
    """'8692224', '15MB' (10^6), '15MiB' (2^20), '1.5GiB' -> bytes."""
    m = re.fullmatch(r"\s*(-?\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", str(text))
    if not m or m.group(2).lower() not in _UNITS:
        raise click.BadParameter(f"{text!r} is not a byte size; write e.g. 8692224, 15MB or 16MiB")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


class Bytes(click.ParamType):
    name = "BYTES"

    def convert(self, value, param, ctx):
        return value if isinstance(value, int) else parse_bytes(value)


def _fail(message: str, code: int) -> None:
    click.echo(f"error: {message}", err=True)
    sys.exit(code)


def _budget(device: str | None, budget: int | None) -> tuple[str | None, int | None]:
    if device and budget is not None:
        raise click.UsageError("give --device or --budget, not both")
    if device:
        return device, get_profile(device).ram_budget_bytes
    return None, budget


def _user_run_options(f):
    """--user/--data/--test, --device/--budget and --out: a run on one user's data in a budget."""
    options = [
        click.option("--user", type=int, help="A subject of the built-in IMU data set (1-10)."),
        click.option("--data", "data_file", type=click.Path(),
                     help="Your windows: .npz with x and y."),
        click.option("--test", "test_file", type=click.Path(),
                     help="Optional .npz test set for --data."),
        click.option("--device", type=click.Choice(sorted(PROFILES)),
                     help="Device profile (budget)."),
        click.option("--budget", type=Bytes(), help="RAM budget, e.g. 15MB or 8692224."),
        click.option("--out", required=True, type=click.Path(file_okay=False),
                     help="Run folder."),
    ]
    for option in reversed(options):
        f = option(f)
    return f


def _user_run_budget(user, data_file, device, budget, what: str) -> tuple[str | None, int]:
    """Check the user-data and budget options of a run; returns (device, budget_bytes)."""
    if (user is None) == (data_file is None):
        raise click.UsageError("give exactly one of --user N or --data FILE.npz")
    if device is None and budget is None:
        raise click.UsageError(f"give --device NAME or --budget BYTES: {what} always runs "
                               "inside a memory budget (`edgetrain devices` lists profiles)")
    return _budget(device, budget)


@contextlib.contextmanager
def _exit_on_device_errors():
    """A budget too small exits 3; a bad artifact, bad data or bad argument exits 2."""
    try:
        yield
    except BudgetError as e:
        _fail(str(e), EXIT_BUDGET)
    except CheckpointWriteError as e:
        _fail(str(e), EXIT_DISK)
    except (ArtifactError, ValueError) as e:  # DataError and ResumeError are ValueErrors
        _fail(str(e), EXIT_BAD_INPUT)


def _mib(n: int | None) -> str:
    return "-" if n is None else f"{n:,} bytes ({n / 2**20:.2f} MiB)"


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main():
    """On-device training for wearables: export, personalise and measure under a RAM budget."""


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def devices(as_json):
    """List the device profiles and their RAM budgets for training."""
    if as_json:
        click.echo(json.dumps({n: vars(p) for n, p in PROFILES.items()}, indent=2))
        return
    for p in PROFILES.values():
        click.echo(f"{p.name:18s} {p.ram_budget_bytes / 2**20:8.1f} MiB  {p.description}")


@main.command()
@click.option("--model", "model_name", required=True, help="Network name: patch_mobilenet, mobilenet_v1.")
@click.option("--out", required=True, type=click.Path(file_okay=False), help="Artifact folder.")
@click.option("--width", type=float, default=None, help="Width multiplier (default per network).")
@click.option("--holdout-user", type=int, default=10, show_default=True,
              help="Subject left out of population pretraining (personalise on this one).")
@click.option("--micro-batch", type=int, default=8, show_default=True)
@click.option("--accumulate", type=int, default=1, show_default=True,
              help="Micro-batches summed per optimizer step.")
@click.option("--epochs", type=int, default=8, show_default=True, help="Pretraining epochs.")
@click.option("--lr", type=float, default=3e-4, show_default=True, help="On-device learning rate.")
@click.option("--no-cache", is_flag=True, help="Pretrain again even if cached.")
@click.option("--recompute", type=click.Choice(["none", "sqrt", "budget"]), default="none",
              show_default=True, help="Recompute plan written into the training graph; "
              "budget: the cheapest plan predicted to fit --budget or --device.")
@click.option("--device", type=click.Choice(sorted(PROFILES)), help="Budget from a device profile.")
@click.option("--budget", type=Bytes(), help="Byte budget for --recompute budget, e.g. 64MiB.")
@click.option("--density", type=click.FloatRange(0, 1, min_open=True), default=1.0,
              show_default=True, help="Kept fraction of Conv/Linear weights (1.0 = dense).")
@click.option("--mask-allocation", type=click.Choice(["erk", "global", "uniform"]),
              default="erk", show_default=True,
              help="Per-layer densities: ERK, one global magnitude threshold, or uniform.")
@click.option("--mask-init", type=click.Choice(["magnitude", "random"]), default="magnitude",
              show_default=True, help="Which weights the first mask keeps.")
@click.option("--json", "as_json", is_flag=True)
def export(model_name, out, width, holdout_user, micro_batch, accumulate, epochs, lr, no_cache,
           recompute, device, budget, density, mask_allocation, mask_init, as_json):
    """Pretrain a population model (cached) and export it as an artifact folder."""
    from pathlib import Path

    import torch

    import onnxruntime

    from edgetrain.manifest import Plan
    from exporters.pretrain import PretrainConfig, export_named

    onnxruntime.set_default_logger_severity(3)
    torch.set_num_threads(max(1, torch.get_num_threads()))
    _, budget_bytes = _budget(device, budget)
    if (recompute == "budget") != (budget_bytes is not None):
        raise click.UsageError("--recompute budget needs --budget or --device, and they only "
                               "apply to it")
    try:
        cfg = PretrainConfig(model=model_name, width=width, holdout_user=holdout_user,
                             epochs=epochs)
        m = export_named(cfg, out, Plan(micro_batch=micro_batch, accumulation_steps=accumulate),
                         lr=lr, cache_dir=None if no_cache else Path(".cache/pretrain"),
                         show_progress=not as_json, recompute=recompute,
                         recompute_budget_bytes=budget_bytes, density=density,
                         mask_allocation=mask_allocation, mask_init=mask_init)
    except (ValueError, DataError) as e:
        _fail(str(e), EXIT_BAD_INPUT)
    if as_json:
        click.echo(json.dumps(m.to_dict(), indent=2))
        return
    click.echo(f"exported {m.model} to {out}: {len(m.trainable)} trainable tensors "
               f"({m.trainable_bytes:,} bytes), {len(m.frozen)} frozen, {m.num_classes} classes")
    click.echo(f"predicted peak at micro-batch {m.predicted['batch']} (a prediction): "
               f"{_mib(m.predicted['peak_bytes'])}")
    if m.masks:
        kept = sum(k.nnz for k in m.masks)
        click.echo(f"sparse: {len(m.masks)} masked weights keep {kept:,} of "
                   f"{sum(k.numel for k in m.masks):,} values ({mask_allocation}, {mask_init})")
    if m.plan.recompute != "none":
        click.echo(f"recompute ({m.plan.recompute}): {len(m.plan.checkpoints)} checkpoints, "
                   f"{len(m.plan.recomputed)} tensors recomputed in backward")


@main.command()
@click.argument("artifact", type=click.Path())
@_user_run_options
@click.option("--epochs", type=int, default=3, show_default=True)
@click.option("--lr", type=float, default=None, help="Learning rate (default: the artifact's).")
@click.option("--micro-batch", type=int, default=None, help="Default: the artifact's plan.")
@click.option("--accumulate", type=int, default=None, help="Default: the artifact's plan.")
@click.option("--seed", type=int, default=0, show_default=True)
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
@click.option("--json", "as_json", is_flag=True)
def personalise(artifact, user, data_file, test_file, device, budget, out, epochs, lr,
                micro_batch, accumulate, seed, threads, mask_update, mask_every, drop_fraction,
                mask_end, checkpoint_every, resume, as_json):
    """Train an artifact on one user's data inside a device's memory budget."""
    from edgetrain.masks import MaskSchedule
    from edgetrain.personalise import TrainConfig
    from edgetrain.personalise import personalise as run
    from edgetrain.userdata import user_data

    device, budget_bytes = _user_run_budget(user, data_file, device, budget, "personalisation")
    with _exit_on_device_errors():
        train, test = user_data(artifact, user, data_file, test_file)
        masks = (MaskSchedule(mask_update, mask_every, drop_fraction, mask_end)
                 if mask_update else None)
        cfg = TrainConfig(epochs=epochs, lr=lr, micro_batch=micro_batch,
                          accumulation_steps=accumulate, seed=seed, masks=masks,
                          checkpoint_every=checkpoint_every)
        with _progress(not as_json) as progress:
            r = run(artifact, train, test, out, budget_bytes, cfg, progress=progress,
                    threads=threads, resume=resume)
    if as_json:
        click.echo(json.dumps({"device": device, **r.to_dict()}, indent=2))
        return
    click.echo(f"device: {device or 'custom'}  budget: {_mib(budget_bytes)}")
    if r.resumed_from_step is not None:
        click.echo(f"resumed from the resume point after step {r.resumed_from_step}")
    click.echo(f"trained {r.optimizer_steps} optimizer steps of {r.micro_batch} x "
               f"{r.accumulation_steps} items ({r.train_items} items/epoch) in {r.train_time_s:.1f} s")
    if r.accuracy_before is not None:
        click.echo(f"held-out accuracy: before {r.accuracy_before:.3f}  after {r.accuracy_after:.3f}")
        click.echo(f"inference model agrees with runtime eval on {r.inference_agreement:.1%} "
                   "of test samples")
    if r.mask_method:
        click.echo(f"mask updates ({r.mask_method}): {r.mask_updates}, {r.regrown_weights:,} "
                   "weights regrown in all")
    click.echo(f"checkpoint: {r.checkpoint}  inference model: {r.inference_model}")


@main.command("reset-bn")
@click.argument("artifact", type=click.Path())
@_user_run_options
@click.option("--samples", type=int, default=256, show_default=True,
              help="User samples that feed the statistics (forward passes only).")
@click.option("--micro-batch", type=int, default=None, help="Default: the artifact's plan.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--threads", type=int, default=None, help="ORT intra-op threads.")
@click.option("--json", "as_json", is_flag=True)
def reset_bn(artifact, user, data_file, test_file, device, budget, out, samples, micro_batch,
             seed, threads, as_json):
    """Re-estimate BatchNorm statistics on a user's samples (RESET, after pruning)."""
    from edgetrain.bnreset import reset_batchnorm
    from edgetrain.userdata import user_data

    device, budget_bytes = _user_run_budget(user, data_file, device, budget, "RESET")
    with _exit_on_device_errors():
        train, test = user_data(artifact, user, data_file, test_file)
        r = reset_batchnorm(artifact, train, test, out, budget_bytes, samples, seed,
                            micro_batch, threads)
    if as_json:
        click.echo(json.dumps({"device": device, **r.to_dict()}, indent=2))
        return
    click.echo(f"device: {device or 'custom'}  budget: {_mib(budget_bytes)}")
    click.echo(f"RESET from {r.samples} samples in {r.batches} forward passes of "
               f"{r.micro_batch} items")
    if r.accuracy_before is not None:
        click.echo(f"held-out accuracy: before RESET {r.accuracy_before:.3f}  after "
                   f"{r.accuracy_after:.3f}")
    click.echo(f"checkpoint: {r.checkpoint}  inference model: {r.inference_model}")


@main.command()
@click.argument("artifact", type=click.Path())
@click.option("--batch", type=int, required=True, help="Micro-batch (samples per step).")
@click.option("--device", type=click.Choice(sorted(PROFILES)), help="Run capped at this profile.")
@click.option("--budget", type=Bytes(), help="Run capped at this many bytes.")
@click.option("--accumulate", type=int, default=1, show_default=True)
@click.option("--steps", type=int, default=3, show_default=True, help="Timed optimizer steps.")
@click.option("--threads", type=int, default=None)
@click.option("--plot", "plot_dir", type=click.Path(file_okay=False),
              help="Write timeline.png and graph.png into this folder.")
@click.option("--json", "as_json", is_flag=True)
def measure(artifact, batch, device, budget, accumulate, steps, threads, plot_dir, as_json):
    """Measure the peak bytes of training, from the runtime's own allocator."""
    from pathlib import Path

    from device_sim.measure import measure as run
    from edgetrain.manifest import load_manifest
    from exporters.memplan import predict_memory  # host side: reads the graphs with onnx

    device, budget_bytes = _budget(device, budget)
    try:
        manifest = load_manifest(artifact)
        r = run(artifact, batch, budget_bytes, accumulate, steps, threads)
    except BudgetError as e:
        _fail(str(e), EXIT_BUDGET)
    except (ArtifactError, ValueError) as e:
        _fail(str(e), EXIT_BAD_INPUT)
    from exporters.cost import step_cost

    pred = predict_memory(Path(artifact), manifest.trainable, manifest.frozen, batch,
                          {role: e.path for role, e in manifest.files.items()})
    cost = step_cost(str(Path(artifact) / manifest.files["training_model"].path), batch,
                     sum(t.nbytes // 4 for t in manifest.trainable))
    device_time = None
    if device:
        p = get_profile(device)
        device_time = cost.predicted_time_s(p.compute_flops_per_s, p.memory_bandwidth_bytes_per_s)
    doc = {"artifact": str(artifact), "device": device, "budget_bytes": budget_bytes,
           **r.to_dict(), "predicted_peak_bytes": pred["peak_bytes"],
           "predicted_breakdown": pred["breakdown"],
           "step_flops": cost.flops, "step_bytes_moved": cost.bytes_moved,
           "recompute": _recompute_summary(manifest, cost),
           "predicted_device_step_time_s": device_time,
           "covers": "every byte ONNX Runtime allocates for the training working set: "
                     "parameters, gradients, optimizer state, activations and temporaries, "
                     "runtime scalars; not the interpreter or input batches (see "
                     "process_peak_rss_bytes)"}
    if plot_dir:
        from exporters.report import plot_graph, plot_timeline

        out = Path(plot_dir)
        out.mkdir(parents=True, exist_ok=True)
        train = str(Path(artifact) / manifest.files["training_model"].path)
        doc["plots"] = [str(plot_timeline(train, batch, r.breakdown, r.peak_bytes,
                                          budget_bytes, out)),
                        str(plot_graph(train, batch, out))]
    if as_json:
        click.echo(json.dumps(doc, indent=2))
        return
    click.echo(f"device: {device or 'uncapped'}  budget: {_mib(budget_bytes)}")
    click.echo(f"measured peak at batch {batch}: {_mib(r.peak_bytes)}"
               + ("" if budget_bytes is None else
                  f"  ({'within' if r.peak_bytes <= budget_bytes else 'OVER'} budget)"))
    for k, v in r.breakdown.items():
        click.echo(f"  {k:16s} {v:>14,}   predicted {pred['breakdown'][k]:>14,}")
    rc = doc["recompute"]
    if rc["recomputed"]:
        click.echo(f"recompute ({rc['planner']}): {len(rc['recomputed'])} tensors rebuilt in "
                   f"backward from {len(rc['checkpoints'])} checkpoints, "
                   f"+{rc['extra_flops_ratio']:.0%} FLOPs per step")
    err = (pred["peak_bytes"] - r.peak_bytes) / r.peak_bytes
    click.echo(f"predicted peak (static graph plan): {_mib(pred['peak_bytes'])}  "
               f"({err:+.1%} of measured)")
    click.echo(f"step: {cost.flops / 1e9:.2f} GFLOP, {cost.bytes_moved / 1e6:.1f} MB moved"
               + ("" if device_time is None else
                  f"; predicted on {device} (roofline at peak): {device_time * 1e3:.1f} ms"))
    click.echo(f"step time on this machine: {r.step_time_s * 1e3:.1f} ms; "
               f"process peak RSS {_mib(r.process_peak_rss_bytes)}; torch loaded: {r.torch_loaded}")
    for path in doc.get("plots", []):
        click.echo(f"wrote {path}")


@main.command()
@click.argument("artifact", type=click.Path())
@click.option("--device", type=click.Choice(sorted(PROFILES)), help="Device profile (budget).")
@click.option("--budget", type=Bytes(), help="Budget in bytes, e.g. 15MiB.")
@click.option("--json", "as_json", is_flag=True)
def fit(artifact, device, budget, as_json):
    """Largest batch that trains under a budget: predicted, then confirmed by capped runs."""
    from pathlib import Path

    from device_sim.measure import measure as run
    from device_sim.scenario import largest_batch
    from edgetrain.manifest import load_manifest
    from exporters.memplan import predict_memory

    if (device is None) == (budget is None):
        raise click.UsageError("give --device NAME or --budget BYTES")
    device, budget_bytes = _budget(device, budget)
    try:
        m = load_manifest(artifact)
        files = {role: e.path for role, e in m.files.items()}

        def predict(b: int) -> int:
            return predict_memory(Path(artifact), m.trainable, m.frozen, b, files)["peak_bytes"]

        r = largest_batch(predict, lambda b: run(artifact, b, budget_bytes, steps=5),
                          budget_bytes)
    except (ArtifactError, ValueError) as e:
        _fail(str(e), EXIT_BAD_INPUT)
    if as_json:
        click.echo(json.dumps({"artifact": str(artifact), "device": device, **r.to_dict()},
                              indent=2))
        return
    click.echo(f"device: {device or 'custom'}  budget: {_mib(budget_bytes)}")
    click.echo(f"largest batch predicted to fit: {r.predicted_max_batch}")
    if r.max_batch == 0:
        click.echo(f"confirmed: not even batch 1 trains ({r.runs} capped runs): {r.next_batch_error}")
        return
    click.echo(f"confirmed largest batch: {r.max_batch} (measured peak {_mib(r.peak_bytes)}); "
               f"batch {r.max_batch + 1} fails cleanly ({r.runs} capped runs)")
    click.echo(f"throughput at batch {r.max_batch} on this machine: "
               f"{r.throughput_samples_per_s:.1f} samples/s ({r.step_time_s * 1e3:.1f} ms/step)")


def _recompute_summary(manifest, cost) -> dict:
    """The manifest's recompute plan and the FLOPs its copies add to a step (counted)."""
    extra = sum(f for name, _, f, _ in cost.nodes if name.endswith("_recompute"))
    return {"planner": manifest.plan.recompute, "checkpoints": list(manifest.plan.checkpoints),
            "recomputed": list(manifest.plan.recomputed), "extra_flops": extra,
            "extra_flops_ratio": round(extra / max(1, cost.flops - extra), 4)}


class _progress:
    """A tqdm bar on stderr for long work, or nothing."""

    def __init__(self, enabled: bool):
        self.enabled, self.bar = enabled, None

    def __enter__(self):
        if not self.enabled:
            return None
        from tqdm import tqdm

        def update(done: int, total: int) -> None:
            if self.bar is None:
                self.bar = tqdm(total=total, desc="personalise", unit="step", file=sys.stderr,
                                disable=None, mininterval=1.0)
            self.bar.n = done
            self.bar.refresh()
        return update

    def __exit__(self, *exc):
        if self.bar is not None:
            self.bar.close()
        return False


if __name__ == "__main__":
    main()
