"""Personalise an artifact on one user's data, inside the device's memory budget.

The cycle (the same one `measure` replays, so its peak is the peak of this) is in
edgetrain/trainloop.py: open the runtime under the cap -> preflight -> evaluate before ->
(label-free BatchNorm adaptation) -> for each candidate learning rate, epochs of
micro-batches, `accumulation_steps` of them summed per optimizer step and scaled by 1/k, each
epoch scored on the user's validation slice (keep-best, early stopping) -> the do-no-harm
guard (edgetrain/selection.py) -> the final checkpoint -> evaluate after -> export an inference
model and check it predicts what the runtime's eval predicts. A resume point every
`checkpoint_every` steps and at every epoch end (edgetrain/resume.py: atomic, so a kill at any
moment loses at most the steps since the last one). Sparse artifacts with a mask schedule get
a mask update after every N optimizer steps (edgetrain/masks.py).
"""
from __future__ import annotations

import json
import math
import signal
import threading
import os
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from edgetrain import names, signing, trainloop
from edgetrain.atomicfile import atomic_write_bytes
from edgetrain.interpolation import check_mixes
from edgetrain.masks import MaskSchedule
from edgetrain.arenacapture import ArenaCapture
from edgetrain.ort_device import onnxruntime
from edgetrain.runfolder import RunLock, check_placement
from edgetrain.selection import ADAPTS, check_settings
from edgetrain.trainloop import Interrupted, TrainingDiverged

__all__ = ["Interrupted", "PersonaliseResult", "TrainConfig", "TrainingDiverged", "personalise"]


@dataclass(frozen=True)
class TrainConfig:
    epochs: int = 3
    lr: float | None = None  # None: the artifact's learning rate
    micro_batch: int | None = None  # None: the artifact's plan
    accumulation_steps: int | None = None
    seed: int = 0
    masks: MaskSchedule | None = None  # dynamic sparse training (needs a sparse artifact)
    checkpoint_every: int = 100  # optimizer steps between resume points (0: epoch ends only)
    # On-device selection, used when a validation slice is given (edgetrain/selection.py):
    lrs: tuple[float, ...] | None = None  # candidates (None: the lr and its neighbours x3)
    patience: int = 2  # epochs without a new best validation score before a candidate stops
    guard_margin: int = 1  # validation windows the best must gain over the population model
    adapt: str = "none"  # "bn": BatchNorm statistics from the user's windows first (no labels);
    # "auto": bn where the artifact has BatchNorm layers
    labels_per_class: int | None = None  # train on each class's first N windows only
    adapt_guard: str = "loss"  # the guard's rule for the adapted start (selection.ADAPT_GUARDS)
    # weight interpolation: mixes of the start and the best trained weights scored on the
    # validation slice after training (edgetrain/interpolation.py); () tries none
    mixes: tuple[float, ...] = ()

    def fingerprint(self) -> dict:
        """What a resumed run must share with the run it continues."""
        return {k: v for k, v in asdict(self).items()
                if k != "checkpoint_every" and not (k == "mixes" and not v)}  # as before mixes

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
        check_settings(self.lrs, self.patience, self.guard_margin, self.adapt_guard)
        check_mixes(self.mixes)
        if self.adapt not in ADAPTS:
            raise ValueError(f"unknown adaptation {self.adapt!r}; choose one of {ADAPTS}")
        if self.labels_per_class is not None and self.labels_per_class < 1:
            raise ValueError(f"labels per class must be at least 1, got {self.labels_per_class}")


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
    train_time_s: float  # this process's training (a resumed run: the steps since its resume point)
    torch_loaded: bool  # the device process must never load torch
    mask_method: str | None = None
    mask_updates: int = 0
    regrown_weights: int = 0  # summed over all updates and layers
    resumed_from_step: int | None = None  # the resume point this process started from
    # --resume found only damaged resume points: kept in this folder, the run started again
    damaged_resume_points_moved_to: str | None = None
    select_time_s: float = 0.0  # scoring the population model, adaptation, saving the start
    learning_rates: list | None = None  # the candidates trained
    validation_windows: int | None = None  # size of the validation slice (None: no selection)
    guard: dict | None = None  # the do-no-harm decision and both validation scores
    history: list | None = None  # every epoch's validation score
    mixes: list | None = None  # every mix of start and best scored on validation (interpolation)
    adapt: str = "none"
    labels_per_class: int | None = None
    # which test windows were right before and after, "0"/"1" each in order (paired bootstrap)
    test_correct_before: str | None = None
    test_correct_after: str | None = None
    # the recording (or block) of each test window, for intervals over recordings
    test_recordings: list | None = None
    # the peak bytes of this process's training working set, from ORT's allocator log
    # (edgetrain/arenacapture.py; a resumed run: since it resumed)
    measured_peak_bytes: int | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def personalise(artifact: str | os.PathLike, train: tuple[np.ndarray, np.ndarray],
                test: tuple[np.ndarray, np.ndarray] | None, out: str | os.PathLike,
                budget_bytes: int | None, config: TrainConfig = TrainConfig(),
                progress=None, threads: int | None = None, resume: bool = False,
                val: tuple[np.ndarray, np.ndarray] | None = None,
                test_groups: np.ndarray | None = None,
                trust: str | os.PathLike | None = None) -> PersonaliseResult:
    """Train `artifact` on `train` = (x, y) in a runtime capped at `budget_bytes`
    (edgetrain/trainloop.py), in the run folder `out`, held for this process
    (edgetrain/runfolder.py): never an artifact folder or inside one; a second run on it is
    refused at once. With `val` (the user's validation slice, cut in time from their labelled
    windows), the learning rate, the epoch and the final model are chosen on it and the guard
    keeps the population model when personalising did not help. x and y must already be
    checked against the manifest (edgetrain.data.check_xy). Writes out/checkpoint,
    out/inference.onnx and out/result.json; resume: continue from the newest intact resume
    point in `out` (start afresh if it has none yet). test_groups: the recording of each test
    window, recorded in the result for intervals over recordings (edgetrain/intervals.py).
    trust: an Ed25519 public key file; the artifact must carry its signature (signing.py)."""
    if trust is not None:
        signing.verify(artifact, trust)
    check_placement(out, artifact)
    with RunLock(out), StopRequests() as stop:
        with ArenaCapture(onnxruntime()) as arena:  # the run's own peak, from ORT's log
            fields = trainloop.run(artifact, train, val, test, Path(out), budget_bytes,
                                   config, progress, threads, resume, stop, arena.mark)
        groups = None if test is None or test_groups is None else \
            [int(g) for g in test_groups]
        result = PersonaliseResult(torch_loaded=sys.modules.get("torch") is not None,
                                   measured_peak_bytes=_peak_so_far(Path(out),
                                                                    arena.peak_bytes()),
                                   test_recordings=groups, **fields)
        atomic_write_bytes(Path(out) / names.RUN_RESULT,
                           json.dumps(result.to_dict(), indent=2).encode())
        return result


def _peak_so_far(out: Path, this_process: int | None) -> int | None:
    """The run's peak: this process's, or a finished run's recorded one if larger (resuming a
    finished run trains nothing, and its smaller peak would replace the run's)."""
    path, before = out / names.RUN_RESULT, None
    try:
        if path.is_file() and not path.is_symlink() and path.stat().st_size <= 1 << 20:
            before = json.loads(path.read_bytes()).get("measured_peak_bytes")
    except (OSError, ValueError, AttributeError, RecursionError):
        before = None
    if not isinstance(before, int) or isinstance(before, bool) or this_process is None:
        return this_process
    return max(before, this_process)


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
