"""Population pretraining in torch (host side), cached, then export of the named networks.

The population model of a held-out user is trained on the other nine subjects' windows.
For a patch model each epoch draws `patches_per_window` random patches from every window
(the label is the window's); whole-image models see whole images. The trained weights are
cached under .cache/pretrain/ keyed by everything that determines them, so a second
`export` (or `make demo`) does not train again.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from edgetrain import data
from edgetrain.manifest import Manifest, Plan
from exporters.export import export_artifact
from exporters.networks import build_network

CACHE_VERSION = 1  # bump when pretraining code changes what it produces


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


def _key(cfg: PretrainConfig) -> str:
    blob = json.dumps({"v": CACHE_VERSION, **asdict(cfg)}, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def pretrain(cfg: PretrainConfig, cache_dir: Path | None = Path(".cache/pretrain"),
             show_progress: bool = True) -> tuple[torch.nn.Module, dict]:
    """Train (or load from cache) the population model. Returns (model, summary)."""
    recs = data.load_recordings()
    split = data.leave_one_subject_out(recs, cfg.holdout_user)
    xw, yw = split.population
    mean, scale = data.channel_stats(xw)
    model, spec = build_network(cfg.model, len(recs.classes), cfg.width)
    summary = {"population_subjects": sorted(int(s) for s in set(recs.subject.tolist())
                                             if s != cfg.holdout_user),
               "holdout_user": cfg.holdout_user, "windows": int(len(yw)),
               "channel_mean": mean, "channel_scale": scale, "config": asdict(cfg)}
    cached = cache_dir / f"{cfg.model}-{_key(cfg)}.pt" if cache_dir else None
    if cached is not None and cached.is_file():
        blob = torch.load(cached, weights_only=False)
        model.load_state_dict(blob["state_dict"])
        return model, {**summary, **blob["train"], "cache": str(cached)}

    torch.manual_seed(cfg.seed)
    rng = np.random.default_rng(cfg.seed)
    signals = data.standardised_signals(xw, mean, scale, spec.image_size)
    ps = spec.patch_size or spec.image_size
    grid = spec.image_size // ps
    per = cfg.patches_per_window if spec.patch_size else 1
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=1e-4)
    n_items = len(yw) * per
    steps = cfg.epochs * (n_items // cfg.batch)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=cfg.lr, total_steps=max(1, steps))
    t0 = time.perf_counter()
    model.train()
    losses = []
    bar = tqdm(total=steps, desc=f"pretrain {cfg.model}", disable=None if show_progress else True,
               mininterval=1.0,
               unit="step")
    for _ in range(cfg.epochs):
        windows = np.repeat(rng.permutation(len(yw)), per)
        rng.shuffle(windows)
        patches = rng.integers(0, grid * grid, len(windows))
        for i in range(0, len(windows) - cfg.batch + 1, cfg.batch):
            w, p = windows[i:i + cfg.batch], patches[i:i + cfg.batch]
            xb = np.stack([data.gasf_region(signals[a], slice((q // grid) * ps, (q // grid + 1) * ps),
                                            slice((q % grid) * ps, (q % grid + 1) * ps))
                           for a, q in zip(w, p)])
            loss = torch.nn.functional.cross_entropy(model(torch.from_numpy(xb)),
                                                     torch.from_numpy(yw[w]))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            losses.append(loss.item())
            bar.update(1)
            bar.set_postfix(loss=f"{np.mean(losses[-20:]):.3f}")
    bar.close()
    train = {"final_loss": float(np.mean(losses[-20:])) if losses else None,
             "pretrain_time_s": round(time.perf_counter() - t0, 1), "steps": steps}
    if cached is not None:
        cached.parent.mkdir(parents=True, exist_ok=True)
        tmp = cached.with_suffix(".tmp")
        torch.save({"state_dict": model.state_dict(), "train": train}, tmp)
        tmp.replace(cached)
    return model, {**summary, **train, "cache": str(cached) if cached else None}


def export_named(cfg: PretrainConfig, out: str | Path, plan: Plan, lr: float = 3e-4,
                 cache_dir: Path | None = Path(".cache/pretrain"), show_progress: bool = True,
                 recompute: str = "none", recompute_budget_bytes: int | None = None,
                 **mask_options) -> Manifest:
    """Pretrain (or load) the population model of `cfg` and export it as an artifact.

    mask_options: density, mask_allocation, mask_init (exporters.export.export_artifact)."""
    model, summary = pretrain(cfg, cache_dir, show_progress)
    _, spec = build_network(cfg.model, 1, cfg.width)
    recs_classes = data.load_recordings().classes
    size = spec.image_size
    sample = spec.patch_size or size
    plan = dataclasses.replace(plan, patch_size=spec.patch_size)
    return export_artifact(
        model, torch.zeros(2, 3, sample, sample), out, classes=recs_classes, plan=plan, lr=lr,
        model_name=cfg.model, image_shape=(3, size, size), preprocess="imu_gasf",
        preprocess_args={"window_samples": data.WINDOW_SAMPLES, "mean": summary["channel_mean"],
                         "scale": summary["channel_scale"]},
        provenance={k: v for k, v in summary.items() if k not in ("channel_mean", "channel_scale")},
        freeze_batchnorm=True, recompute=recompute, recompute_budget_bytes=recompute_budget_bytes,
        **mask_options)
