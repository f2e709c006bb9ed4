"""Population pretraining in torch (host side), cached, then export of the named networks.

The population model of a held-out user is trained on the other nine subjects' windows.
For a patch model each epoch draws `patches_per_window` random patches from every window
(the label is the window's); whole-image models see whole images. The trained weights are
cached under .cache/pretrain/ keyed by everything that determines them, so a second
`export` (or `make demo`) does not train again. A long run also leaves a resume point there
after every epoch, and at the step where Ctrl-C or SIGTERM stopped it (`<name>.partial.pt`:
weights, optimizer, schedule, generators, masks, the position in the epoch;
exporters/models/popfit.py), so running the command again continues from that step.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from edgetrain import data, datasets, signing
from edgetrain.atomicfile import atomic_write
from edgetrain.manifest import Manifest
from exporters.models.dst import DstConfig, TorchMasks
from exporters.export import ExportOptions, export_artifact
from exporters.plans import updatesearch
from exporters.models.hostfinetune import Inputs
from exporters.models.maskfidelity import masking_fidelity
from exporters.plans.quantize import fidelity
from exporters.models.networks import build_network
from exporters.models.popfit import fit_population
from edgetrain.personalise import StopRequests

# Bump when pretraining code changes what it produces. 2: the initial weights are seeded
# (cfg.seed), so every run of one config trains the same model.
CACHE_VERSION = 2
PRETRAIN_THREADS = 2  # torch threads while pretraining: sums in one order on every machine
# Bump when the sparse (DST) epochs change what they produce; only keys with `dst` carry it.
# 2: the mask update is edgetrain.masks.mask_update, dropping round(fraction x nnz) weights
#    per layer as the device does (1 dropped int(fraction x nnz)).
DST_VERSION = 2
FIDELITY_WINDOWS = 300  # population windows an int8 export is checked on


@dataclass(frozen=True)
class PretrainConfig:
    model: str = "patch_mobilenet"
    width: float | None = None
    holdout_user: int = 10
    epochs: int = 6
    batch: int = 64
    lr: float = 3e-3
    patches_per_window: int = 8
    seed: int = 0
    also_held_out: tuple[int, ...] = ()  # more subjects kept out of the population
    dataset: str = "watch"  # edgetrain.datasets: the recordings the population comes from
    dst: DstConfig | None = None  # sparse epochs after the dense ones (exporters/models/dst.py)

    @property
    def held_out(self) -> tuple[int, ...]:
        return tuple(sorted({self.holdout_user, *self.also_held_out}))


def cache_key(cfg: PretrainConfig) -> str:
    fields = asdict(cfg)
    for name in ("also_held_out", "dst"):  # absent when unused: older cache keys stay valid
        if not fields[name]:
            del fields[name]
    if fields["dataset"] == "watch":
        del fields["dataset"]
    if cfg.dst is not None:
        fields["dst_version"] = DST_VERSION
    blob = json.dumps({"v": CACHE_VERSION, **fields}, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def pretrain(cfg: PretrainConfig, cache_dir: Path | None = Path(".cache/pretrain"),
             show_progress: bool = True) -> tuple[torch.nn.Module, dict]:
    """Train (or load from cache) the population model. Returns (model, summary).

    With cfg.dst, the dense model of the same config (cached too) trains on under masks."""
    recs = datasets.recordings(cfg.dataset)
    xw, yw = datasets.population_windows(cfg.dataset, cfg.held_out)
    mean, scale = data.channel_stats(xw)
    torch.manual_seed(cfg.seed)  # the initial weights too: one config, one model
    model, spec = build_network(cfg.model, len(recs.classes), cfg.width)
    summary = {"population_subjects": sorted(int(s) for s in set(recs.subject.tolist())
                                             if s not in cfg.held_out),
               "dataset": cfg.dataset, "holdout_user": cfg.holdout_user,
               "held_out_users": list(cfg.held_out),
               "windows": int(len(yw)), "channel_mean": mean, "channel_scale": scale,
               "config": asdict(cfg)}
    cached = cache_dir / f"{cfg.model}-{cache_key(cfg)}.pt" if cache_dir else None
    if cached is not None and cached.is_file():
        blob = torch.load(cached, weights_only=False)
        model.load_state_dict(blob["state_dict"])
        return model, {**summary, **blob["train"], "cache": str(cached)}

    signals = (data.standardised_windows(xw, mean, scale) if spec.input == "imu_window"
               else data.standardised_signals(xw, mean, scale, spec.image_size))
    partial = cached.with_suffix(".partial.pt") if cached is not None else None
    if show_progress and cfg.epochs == 0:
        tqdm.write(f"--epochs 0: the {cfg.model} network is exported untrained (its initial "
                   "weights)", file=sys.stderr)
    elif show_progress:  # say what is about to take long, and how to make it short
        kept = (f"once: cached in {cache_dir}; Ctrl-C stops after the current step and keeps "
                "the progress" if cached is not None else "not cached: --no-cache")
        tqdm.write(f"pretraining the {cfg.model} population model: {cfg.epochs} epoch"
                   f"{'s' if cfg.epochs != 1 else ''} over {len(yw)} windows of subjects "
                   f"{summary['population_subjects']} ({kept}); the bar shows the time left; "
                   "--epochs 1 for a quick try", file=sys.stderr)
    threads = torch.get_num_threads()
    torch.set_num_threads(PRETRAIN_THREADS)
    try:  # Ctrl-C (or SIGTERM) stops at the end of the current step, its progress kept
        with StopRequests() as stop:
            train = _train(model, cfg, spec, signals, yw, show_progress, partial, cache_dir,
                           (lambda: stop.signum) if partial is not None else None)
    finally:
        torch.set_num_threads(threads)
    if cached is not None:
        cached.parent.mkdir(parents=True, exist_ok=True)
        with atomic_write(cached) as tmp:
            torch.save({"state_dict": model.state_dict(), "train": train}, tmp)
        partial.unlink(missing_ok=True)
    return model, {**summary, **train, "cache": str(cached) if cached else None}


def _train(model, cfg: PretrainConfig, spec, signals, yw, show_progress: bool,
           partial: Path | None, cache_dir: Path | None, stop=None) -> dict:
    """Dense epochs, or (cfg.dst) sparse epochs from the cached dense model of the config."""
    if cfg.dst is None:
        torch.manual_seed(cfg.seed)
        train = fit_population(model, cfg, spec, signals, yw, cfg.epochs, cfg.lr, None,
                               show_progress, partial, stop)
    else:
        dense, dense_summary = pretrain(dataclasses.replace(cfg, dst=None), cache_dir,
                                        show_progress)
        model.load_state_dict(dense.state_dict())
        masks = TorchMasks(model, cfg.dst.density, cfg.dst.allocation)
        train = fit_population(model, cfg, spec, signals, yw, cfg.dst.epochs, cfg.dst.lr,
                               masks, show_progress, partial, stop)
        train["dense"] = {k: dense_summary[k] for k in ("final_loss", "pretrain_time_s", "steps")}
    return train


def export_named(cfg: PretrainConfig, out: str | Path, options: ExportOptions = ExportOptions(),
                 cache_dir: Path | None = Path(".cache/pretrain"),
                 show_progress: bool = True) -> Manifest:
    """Pretrain (or load) the population model of `cfg` and export it as an artifact: what
    `edgetrain export` runs, with the same options object (exporters/export/options.py).

    options.update "auto" scores the plans that fit options.update_budget_bytes by a host
    replay on inner subjects (exporters/plans/updatesearch.py; the search goes into the
    manifest's provenance). int8_frozen: the effect on the population model's accuracy
    (FIDELITY_WINDOWS population windows) goes into the provenance. Masks: those of cfg.dst
    (its kept weights are the only nonzero ones) unless options.density is below 1.
    options.masking_check: a pruned trained model's accuracy dense, masked and after RESET on
    the held-out users goes into the provenance (`masking`); False skips those evaluations."""
    key = signing.private_key(options.sign_key) if options.sign_key else None  # before work
    options = options.replace(sign_key=None)  # signed last: the provenance grows below
    model, summary = pretrain(cfg, cache_dir, show_progress)
    if cfg.dst is not None and options.density == 1.0:  # export the masks it trained with
        options = options.replace(density=cfg.dst.density, mask_allocation=cfg.dst.allocation,
                                  mask_init="magnitude")
    _, spec = build_network(cfg.model, 1, cfg.width)
    stats = {"window_samples": data.WINDOW_SAMPLES, "mean": summary["channel_mean"],
             "scale": summary["channel_scale"]}
    options = options.replace(freeze_batchnorm=True)
    if spec.input == "imu_window":
        shape = dict(image_shape=None, preprocess="imu_window", layout=spec.layout)
    else:
        options = options.replace(plan=dataclasses.replace(options.plan,
                                                           patch_size=spec.patch_size))
        shape = dict(image_shape=(3, spec.image_size, spec.image_size), preprocess="imu_gasf")
    provenance = {k: v for k, v in summary.items() if k not in ("channel_mean", "channel_scale")}
    score = None
    if options.update == "auto":
        inner = updatesearch.inner_subjects(summary["population_subjects"])
        inner_model, s = pretrain(dataclasses.replace(
            cfg, also_held_out=(*cfg.also_held_out, *inner)), cache_dir, show_progress)
        score = updatesearch.UpdateScore(
            lambda names: updatesearch.contribution(inner_model, spec, s["channel_mean"],
                                                    s["channel_scale"], inner, names,
                                                    cfg.dataset), inner)
    m = export_artifact(model, spec.example_input(2, data.WINDOW_SAMPLES), out,
                        classes=datasets.recordings(cfg.dataset).classes, options=options,
                        model_name=cfg.model, preprocess_args=stats, provenance=provenance,
                        update_score=score, **shape)
    # what pruning cost; an untrained network (--epochs 0) is at chance dense or masked, and
    # the three evaluations took minutes (C7: 627 s of a 654 s export): not measured
    if (options.masking_check and options.density < 1 and cfg.dst is None
            and summary.get("steps") != 0):
        recs = datasets.recordings(cfg.dataset)
        mask_options = {"density": options.density, "mask_allocation": options.mask_allocation,
                        "mask_init": options.mask_init}
        found = masking_fidelity(model, spec, summary["channel_mean"], summary["channel_scale"],
                                 data.windows(recs, np.flatnonzero(np.isin(recs.subject,
                                                                           cfg.held_out))),
                                 datasets.population_windows(cfg.dataset, cfg.held_out),
                                 cfg.held_out, mask_options)
        m = dataclasses.replace(m, provenance={**m.provenance, "masking": found})
        m.write(Path(out))
    if m.plan.frozen_int8:
        xw, yw = datasets.population_windows(cfg.dataset, cfg.held_out)
        pick = np.random.default_rng(0).choice(len(yw), min(FIDELITY_WINDOWS, len(yw)), False)
        inputs = Inputs(spec, summary["channel_mean"], summary["channel_scale"])
        found = fidelity(model, m.plan.frozen_int8, inputs(xw[pick]), torch.from_numpy(yw[pick]))
        m = dataclasses.replace(m, provenance={**m.provenance, "int8_frozen": found})
        m.write(Path(out))
    if key is not None:
        signing.sign(Path(out), key)
    return m
