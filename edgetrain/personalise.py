"""Personalise an artifact on one user's data, inside the device's memory budget.

The cycle (the same one `measure` replays, so its peak is the peak of this): open the runtime
under the cap -> preflight at the micro-batch shape -> evaluate before -> epochs of
micro-batches, `accumulation_steps` of them summed per optimizer step and scaled by 1/k so
the update uses their mean gradient -> (sparse artifacts with a mask schedule: a mask update
after every N optimizer steps, edgetrain/masks.py) -> a resume point every
`checkpoint_every` steps and at every epoch end (edgetrain/resume.py: atomic, so a kill at any
moment loses at most the steps since the last one) -> the final checkpoint -> evaluate after
-> export an inference model and check it predicts what the runtime's eval predicts.
"""
from __future__ import annotations

import json
import math
import signal
import threading
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from edgetrain import resume as resume_points
from edgetrain.runfolder import RunLock, check_placement
from edgetrain import names
from edgetrain.feed import Feed
from edgetrain.faultpoints import fault_point
from edgetrain.atomicfile import atomic_write_bytes
from edgetrain.masks import UPDATERS, MaskSchedule
from edgetrain.runtime import DeviceRuntime
from edgetrain.shuffle import Shuffle


@dataclass(frozen=True)
class TrainConfig:
    epochs: int = 3
    lr: float | None = None  # None: the artifact's learning rate
    micro_batch: int | None = None  # None: the artifact's plan
    accumulation_steps: int | None = None
    seed: int = 0
    masks: MaskSchedule | None = None  # dynamic sparse training (needs a sparse artifact)
    checkpoint_every: int = 100  # optimizer steps between resume points (0: epoch ends only)

    def fingerprint(self) -> dict:
        """What a resumed run must share with the run it continues."""
        return {k: v for k, v in asdict(self).items() if k != "checkpoint_every"}

    def __post_init__(self):
        if self.epochs < 0:
            raise ValueError(f"epochs must be >= 0, got {self.epochs}")
        if self.micro_batch is not None and self.micro_batch <= 0:
            raise ValueError(f"micro-batch must be positive, got {self.micro_batch}")
        if self.accumulation_steps is not None and self.accumulation_steps <= 0:
            raise ValueError(f"accumulation steps must be positive, got {self.accumulation_steps}")
        if self.checkpoint_every < 0:
            raise ValueError(f"checkpoint interval must be >= 0 steps, got {self.checkpoint_every}")
        if self.lr is not None and not (math.isfinite(self.lr) and self.lr > 0):
            raise ValueError(f"learning rate must be a finite number above 0, got {self.lr}")


class TrainingDiverged(RuntimeError):
    """The loss became NaN or infinite: the weights can no longer improve."""


class Interrupted(RuntimeError):
    """SIGTERM or SIGINT arrived: a resume point was written at the current step."""

    def __init__(self, message: str, signum: int):
        super().__init__(message)
        self.signum = signum


@dataclass(frozen=True)
class PersonaliseResult:
    budget_bytes: int | None
    micro_batch: int
    accumulation_steps: int
    optimizer_steps: int
    train_items: int
    accuracy_before: float | None
    accuracy_after: float | None
    inference_agreement: float | None  # fraction of test samples where both predict the same
    checkpoint: str
    inference_model: str
    train_time_s: float
    torch_loaded: bool  # the device process must never load torch
    mask_method: str | None = None
    mask_updates: int = 0
    regrown_weights: int = 0  # summed over all updates and layers
    resumed_from_step: int | None = None  # the resume point this process started from
    # --resume found only damaged resume points: kept in this folder, the run started again
    damaged_resume_points_moved_to: str | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def accuracy(logits: np.ndarray, y) -> float:
    """y: labels as an array or a SampleArray (edgetrain/samples.py)."""
    return float((logits.argmax(-1) == np.asarray(y[:])).mean())


def evaluate(logits_fn, feed: Feed, batch: int) -> np.ndarray:
    """Per-sample logits (patch logits averaged per sample); inputs made a batch at a time."""
    return feed.sample_logits(logits_fn, batch)


def personalise(artifact: str | os.PathLike, train: tuple[np.ndarray, np.ndarray],
                test: tuple[np.ndarray, np.ndarray] | None, out: str | os.PathLike,
                budget_bytes: int | None, config: TrainConfig = TrainConfig(),
                progress=None, threads: int | None = None, resume: bool = False
                ) -> PersonaliseResult:
    """_personalise in the run folder `out`, held for this process (edgetrain/runfolder.py):
    never an artifact folder or inside one; a second run on it is refused at once."""
    check_placement(out, artifact)
    with RunLock(out), StopRequests() as stop:
        return _personalise(artifact, train, test, out, budget_bytes, config, progress,
                            threads, resume, stop)


class StopRequests:
    """SIGTERM and SIGINT (a watch OS asking the app to stop, Ctrl-C) are noted, not fatal:
    the training loop writes a resume point at the end of the current step and stops."""

    def __init__(self):
        self.signum: int | None = None
        self._old: dict = {}

    def __enter__(self) -> "StopRequests":
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._old[sig] = signal.signal(sig, self._note)
        return self

    def _note(self, signum, frame) -> None:
        self.signum = signum

    def __exit__(self, *exc) -> None:
        for sig, handler in self._old.items():
            signal.signal(sig, handler)


def _personalise(artifact: str | os.PathLike, train: tuple[np.ndarray, np.ndarray],
                 test: tuple[np.ndarray, np.ndarray] | None, out: str | os.PathLike,
                 budget_bytes: int | None, config: TrainConfig, progress,
                 threads: int | None, resume: bool, stop: StopRequests) -> PersonaliseResult:
    """Train `artifact` on `train` = (x, y) in a runtime capped at `budget_bytes`.

    x and y must already be checked against the manifest (edgetrain.data.check_xy).
    Writes a resume point every `config.checkpoint_every` optimizer steps and at the end of
    every epoch (edgetrain/resume.py), and out/checkpoint, out/inference.onnx and
    out/result.json at the end. resume: continue from the newest intact resume point in
    `out` (start afresh if it has none yet); the run then ends with the weights an
    uninterrupted run ends with.
    """
    out = Path(out)
    rt = DeviceRuntime(artifact, budget_bytes=budget_bytes, threads=threads)
    # The artifact is verified (hashes, graphs) before a run folder is trusted with it.
    fingerprint = resume_points.run_fingerprint({**config.fingerprint(), "threads": rt.threads},
                                                *train, test)
    point = set_aside = None
    if resume and resume_points.has_progress(out):  # else there is nothing yet: start fresh
        try:
            point, point_ckpt, _skipped = resume_points.latest(out)
        except resume_points.NoIntactPoint:  # kept aside, not lost; the run starts again
            set_aside = str(resume_points.set_aside_damaged(out))
    if point is not None:
        if point.artifact_manifest_sha256 != resume_points.artifact_sha256(artifact):
            raise resume_points.ResumeError(
                f"{out} was trained from another artifact (manifest sha256 "
                f"{point.artifact_manifest_sha256[:16]}…, {artifact} has "
                f"{resume_points.artifact_sha256(artifact)[:16]}…); resume with the artifact "
                "that started the run, or start a new run in another --out folder")
        if point.run_sha256 != fingerprint:
            raise resume_points.ResumeError(
                f"{out} was started with other settings or other data; resume with the same "
                "user data, test data and options (epochs, micro-batch, accumulation, seed, "
                "learning rate, mask schedule, threads), or start a new run in another --out "
                "folder")
    elif not resume and resume_points.has_progress(out):
        raise resume_points.ResumeError(
            f"{out} already holds the progress of a personalisation run; pass --resume to "
            "continue it, or choose another --out folder (nothing was changed)")
    m = rt.manifest
    b = config.micro_batch or m.plan.micro_batch
    k = config.accumulation_steps or m.plan.accumulation_steps
    rt.set_micro_batch(b)
    if config.lr is not None:
        rt.set_learning_rate(config.lr)
    schedule = config.masks
    if schedule is not None and not m.masks:
        raise ValueError(f"mask updates ({schedule.method}) need a sparse artifact; {artifact} "
                         "is dense: export it with --density below 1")
    if point is not None:
        rt.load_checkpoint(point_ckpt)
    feed = Feed(*train, m)
    test_feed = Feed(*test, m) if test is not None else None
    per_step = b * k
    steps_per_epoch = len(feed) // per_step
    if config.epochs > 0 and steps_per_epoch == 0:
        raise ValueError(f"the data gives {len(feed)} training items, fewer than one optimizer "
                         f"step needs (micro-batch {b} x {k} accumulation steps); use a smaller "
                         "--micro-batch or --accumulate, or supply more samples")
    # A budget too small fails here, before anything is read or written.
    rt.preflight(mask_gradients=schedule is not None and UPDATERS[schedule.method].needs_dense_grad)
    out.mkdir(parents=True, exist_ok=True)
    resume_points.clean_temporaries(out)
    rt.scratch_dir = str(out)  # mask updates' temporary state: nameless, in the run folder

    if point is not None:
        before = point.accuracy_before
    else:
        before = accuracy(evaluate(rt.eval_logits, test_feed, b), test[1]) if test_feed else None

    rng = np.random.default_rng(config.seed)
    total = config.epochs * steps_per_epoch
    steps = mask_updates = regrown = start_epoch = start_step = 0
    mask_rng = np.random.default_rng([config.seed, 1])
    if point is not None:
        steps, mask_updates, regrown = point.steps, point.mask_updates, point.regrown_weights
        start_epoch, start_step = point.epoch, point.step_in_epoch
        rng.bit_generator.state = point.epoch_rng_state
        mask_rng.bit_generator.state = point.mask_rng_state
    artifact_sha = resume_points.artifact_sha256(artifact)

    def commit(epoch: int, done_in_epoch: int, epoch_rng_state: dict) -> None:
        if done_in_epoch == steps_per_epoch:  # the next step starts the next epoch
            epoch, done_in_epoch, epoch_rng_state = epoch + 1, 0, rng.bit_generator.state
        resume_points.commit(out, rt.save_checkpoint, {
            "artifact_manifest_sha256": artifact_sha, "run_sha256": fingerprint,
            "steps": steps, "total_steps": total, "epoch": epoch,
            "step_in_epoch": done_in_epoch, "epoch_rng_state": epoch_rng_state,
            "mask_rng_state": mask_rng.bit_generator.state, "mask_updates": mask_updates,
            "regrown_weights": regrown, "accuracy_before": before})

    t0 = time.perf_counter()
    for epoch in range(start_epoch, config.epochs):
        epoch_rng_state = rng.bit_generator.state
        order = Shuffle(len(feed), int(rng.integers(2**63)))  # the epoch's order, computed

        def at(i: int) -> np.ndarray:  # the items of the epoch's micro-batch i
            return order(np.arange(i * b, (i + 1) * b))
        for s in range(start_step if epoch == start_epoch else 0, steps_per_epoch):
            for j in range(k):
                idx = at(s * k + j)
                loss = rt.train_micro_batch(feed.inputs(idx), feed.labels(idx))
                if not math.isfinite(loss):  # before the step that would spread it
                    raise TrainingDiverged(
                        f"training diverged: the loss is {loss} at optimizer step {steps + 1}; "
                        f"{out} keeps its last good resume point (nothing after it was "
                        "saved). Lower the learning rate (--lr) and --resume, or start again")
            rt.optimizer_step(grad_scale=1.0 / k)
            steps += 1
            fault_point("step")
            fraction = schedule.fraction_at(steps, total) if schedule else 0.0
            if fraction > 0:  # RigL scores by the gradient on this step's micro-batches
                idx = [at(s * k + j) for j in range(k)]
                batches = ([(feed.inputs(i), feed.labels(i)) for i in idx]
                           if UPDATERS[schedule.method].needs_dense_grad else [])
                regrown += rt.update_masks(schedule.method, fraction, batches, mask_rng)
                mask_updates += 1
            if (s + 1 == steps_per_epoch or stop.signum is not None
                    or (config.checkpoint_every and steps % config.checkpoint_every == 0)):
                commit(epoch, s + 1, epoch_rng_state)
            if stop.signum is not None:
                name = signal.Signals(stop.signum).name
                raise Interrupted(f"stopped by {name} after optimizer step {steps}; a resume "
                                  f"point was written there: rerun with --resume to finish "
                                  f"({out})", stop.signum)
            if progress:
                progress(steps, total)
    train_time = time.perf_counter() - t0
    ckpt = rt.save_checkpoint(out / names.RUN_CHECKPOINT)

    after = agreement = None
    infer_path = rt.export_inference(out / names.RUN_INFERENCE_MODEL)
    if test_feed is not None:
        logits = evaluate(rt.eval_logits, test_feed, b)
        after = accuracy(logits, test[1])
        rt.release_training()  # the inference check's weights go where training's were
        infer = evaluate(lambda xb: rt.inference_logits(infer_path, xb), test_feed, b)
        agreement = float((infer.argmax(-1) == logits.argmax(-1)).mean())
    result = PersonaliseResult(
        budget_bytes=budget_bytes, micro_batch=b, accumulation_steps=k, optimizer_steps=steps,
        train_items=len(feed), accuracy_before=before, accuracy_after=after,
        inference_agreement=agreement, checkpoint=str(ckpt), inference_model=str(infer_path),
        train_time_s=round(train_time, 3), torch_loaded=sys.modules.get("torch") is not None,
        mask_method=schedule.method if schedule else None, mask_updates=mask_updates,
        regrown_weights=regrown, resumed_from_step=point.steps if point else None,
        damaged_resume_points_moved_to=set_aside)
    atomic_write_bytes(out / names.RUN_RESULT, json.dumps(result.to_dict(), indent=2).encode())
    return result
