"""The population model's training loop (host side, torch), resumable to the step.

AdamW with a one-cycle schedule; each epoch draws `patches_per_window` random patches from
every window (patch models) or sees every whole window once; with DST masks, their updates.
With `partial`, the state is saved after every epoch, and also when `stop()` turns true (Ctrl-C
or SIGTERM, noted by the caller): then at the end of the current step, with the random state at
the start of the epoch and the position in it, so a run finding the file continues from that
very step and ends with the same weights as a run that never stopped.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from edgetrain import data
from edgetrain.atomicfile import atomic_write
from edgetrain.trainloop import Interrupted


def fit_population(model: torch.nn.Module, cfg, spec, signals: np.ndarray, yw: np.ndarray,
                   epochs: int, lr: float, masks, show_progress: bool,
                   partial: Path | None = None, stop=None) -> dict:
    """Train `model` in place; returns final_loss, pretrain_time_s, steps (and with masks
    their density and regrown weights). stop: a callable, true (a signal number) to stop."""
    rng = np.random.default_rng(cfg.seed + (1000 if masks is not None else 0))
    mask_rng = np.random.default_rng([cfg.seed, 1])
    grid = spec.image_size // spec.patch_size if spec.patch_size else 1
    per = cfg.patches_per_window if spec.patch_size else 1
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=1e-4)
    steps = epochs * (len(yw) * per // cfg.batch)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=max(1, steps))
    schedule = cfg.dst.schedule() if masks is not None else None
    if masks is not None:
        masks.apply(opt)
    model.train()
    losses: list[float] = []
    step = regrown = done_epochs = offset = 0
    elapsed_s = 0.0  # training time of earlier runs that this one resumes
    if partial is not None and partial.is_file():
        blob = torch.load(partial, weights_only=False)
        model.load_state_dict(blob["model"])
        opt.load_state_dict(blob["optimizer"])
        sched.load_state_dict(blob["schedule"])
        rng.bit_generator.state, mask_rng.bit_generator.state = blob["rngs"]
        if masks is not None:
            masks.masks = blob["masks"]
        step, regrown, done_epochs = blob["step"], blob["regrown"], blob["epochs"]
        losses, elapsed_s, offset = blob["losses"], blob["elapsed_s"], blob.get("offset", 0)
    t0 = time.perf_counter()

    def save(epoch: int, at: int, epoch_rng: dict) -> None:
        """The state with `epoch` epochs done and `at` items of the next one (whose draws come
        from `epoch_rng`)."""
        partial.parent.mkdir(parents=True, exist_ok=True)
        with atomic_write(partial) as tmp:
            torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(),
                        "schedule": sched.state_dict(),
                        "rngs": (epoch_rng, mask_rng.bit_generator.state),
                        "masks": masks.masks if masks is not None else None,
                        "step": step, "regrown": regrown, "epochs": epoch, "offset": at,
                        "losses": losses[-20:],
                        "elapsed_s": elapsed_s + time.perf_counter() - t0}, tmp)

    desc = f"pretrain {cfg.model}" + (f" sparse {cfg.dst.density:g}" if masks else "")
    bar = tqdm(total=steps, initial=step, desc=desc, disable=not show_progress,
               mininterval=1.0 if sys.stderr.isatty() else 60.0, unit="step",
               nrows=20)  # a terminal that reports no size: tqdm guesses -1 rows, draws nothing
    for epoch in range(done_epochs, epochs):
        epoch_rng = rng.bit_generator.state  # the epoch's draws replay from here
        windows = np.repeat(rng.permutation(len(yw)), per)
        rng.shuffle(windows)
        patches = rng.integers(0, grid * grid, len(windows))
        for i in range(offset, len(windows) - cfg.batch + 1, cfg.batch):
            w, p = windows[i:i + cfg.batch], patches[i:i + cfg.batch]
            xb = batch_inputs(spec, signals, w, p)
            loss = torch.nn.functional.cross_entropy(model(torch.from_numpy(xb)),
                                                     torch.from_numpy(yw[w]))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            step += 1
            if masks is not None:
                masks.apply(opt)
                fraction = schedule.fraction_at(step, steps)
                if fraction > 0:  # scored by this step's dense gradient, as on the device
                    regrown += masks.update(schedule.method, fraction, mask_rng, opt)
            losses.append(loss.item())
            bar.update(1)
            bar.set_postfix(loss=f"{np.mean(losses[-20:]):.3f}", refresh=False)
            signum = stop() if stop is not None else None
            if signum and partial is not None:
                save(epoch, i + cfg.batch, epoch_rng)
                bar.close()
                raise Interrupted(f"pretraining stopped after step {step} of {steps}; its "
                                  f"progress is in {partial}: run the same command again to "
                                  "continue from there", signum)
        offset = 0
        if partial is not None and epoch + 1 < epochs:
            save(epoch + 1, 0, rng.bit_generator.state)
    bar.close()
    out = {"final_loss": float(np.mean(losses[-20:])) if losses else None,
           "pretrain_time_s": round(elapsed_s + time.perf_counter() - t0, 1), "steps": steps}
    if masks is not None:
        out.update(density=round(masks.density(), 4), regrown_weights=regrown)
    return out


def batch_inputs(spec, signals: np.ndarray, windows: np.ndarray, patches: np.ndarray
                 ) -> np.ndarray:
    """Model inputs for a batch: GASF images (or patches) of the windows' signals, or the
    standardised raw windows laid out as the network reads them."""
    if spec.input == "imu_window":
        x = signals[windows]  # [B, T, 6]
        return np.ascontiguousarray(x.transpose(0, 2, 1) if spec.layout == "CT" else x)
    ps = spec.patch_size or spec.image_size
    grid = spec.image_size // ps
    return np.stack([data.gasf_region(signals[a], slice((q // grid) * ps, (q // grid + 1) * ps),
                                      slice((q % grid) * ps, (q % grid + 1) * ps))
                     for a, q in zip(windows, patches)])
