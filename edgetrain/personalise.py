"""Personalise an artifact on one user's data, inside the device's memory budget.

The cycle (the same one `measure` replays, so its peak is the peak of this): open the runtime
under the cap -> preflight at the micro-batch shape -> evaluate before -> epochs of
micro-batches, `accumulation_steps` of them summed per optimizer step and scaled by 1/k so
the update uses their mean gradient -> (sparse artifacts with a mask schedule: a mask update
after every N optimizer steps, edgetrain/masks.py) -> checkpoint after every epoch (atomic) ->
evaluate after -> export an inference model and check it predicts what the runtime's eval
predicts.
"""
from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from edgetrain.feed import Feed
from edgetrain.manifest import atomic_write_bytes
from edgetrain.masks import UPDATERS, MaskSchedule
from edgetrain.runtime import DeviceRuntime


@dataclass(frozen=True)
class TrainConfig:
    epochs: int = 3
    lr: float | None = None  # None: the artifact's learning rate
    micro_batch: int | None = None  # None: the artifact's plan
    accumulation_steps: int | None = None
    seed: int = 0
    masks: MaskSchedule | None = None  # dynamic sparse training (needs a sparse artifact)

    def __post_init__(self):
        if self.epochs < 0:
            raise ValueError(f"epochs must be >= 0, got {self.epochs}")
        if self.micro_batch is not None and self.micro_batch <= 0:
            raise ValueError(f"micro-batch must be positive, got {self.micro_batch}")
        if self.accumulation_steps is not None and self.accumulation_steps <= 0:
            raise ValueError(f"accumulation steps must be positive, got {self.accumulation_steps}")
        if self.lr is not None and not self.lr > 0:
            raise ValueError(f"learning rate must be positive, got {self.lr}")


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

    def to_dict(self) -> dict:
        return asdict(self)


def accuracy(logits: np.ndarray, y: np.ndarray) -> float:
    return float((logits.argmax(-1) == y).mean())


def evaluate(logits_fn, feed: Feed, batch: int) -> np.ndarray:
    """Per-sample logits (patch logits averaged per sample); inputs made a batch at a time."""
    items = np.arange(len(feed))
    logits = np.concatenate([logits_fn(feed.inputs(items[i:i + batch]))
                             for i in range(0, len(items), batch)])
    return feed.sample_logits(logits)


def personalise(artifact: str | os.PathLike, train: tuple[np.ndarray, np.ndarray],
                test: tuple[np.ndarray, np.ndarray] | None, out: str | os.PathLike,
                budget_bytes: int | None, config: TrainConfig = TrainConfig(),
                progress=None, threads: int | None = None) -> PersonaliseResult:
    """Train `artifact` on `train` = (x, y) in a runtime capped at `budget_bytes`.

    x and y must already be checked against the manifest (edgetrain.data.check_xy).
    Writes out/checkpoint, out/inference.onnx and out/result.json.
    """
    out = Path(out)
    rt = DeviceRuntime(artifact, budget_bytes=budget_bytes, threads=threads)
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
    # A budget too small fails here, before anything is read or written.
    rt.preflight(mask_gradients=schedule is not None and UPDATERS[schedule.method].needs_dense_grad)
    out.mkdir(parents=True, exist_ok=True)

    feed = Feed(*train, m)
    test_feed = Feed(*test, m) if test is not None else None
    before = accuracy(evaluate(rt.eval_logits, test_feed, b), test[1]) if test_feed else None

    rng = np.random.default_rng(config.seed)
    per_step = b * k
    steps_per_epoch = len(feed) // per_step
    if config.epochs > 0 and steps_per_epoch == 0:
        raise ValueError(f"the data gives {len(feed)} training items, fewer than one optimizer "
                         f"step needs (micro-batch {b} x {k} accumulation steps); use a smaller "
                         "--micro-batch or --accumulate, or supply more samples")
    ckpt = out / "checkpoint"
    total = config.epochs * steps_per_epoch
    steps = mask_updates = regrown = 0
    mask_rng = np.random.default_rng([config.seed, 1])
    t0 = time.perf_counter()
    for _epoch in range(config.epochs):
        order = rng.permutation(len(feed))[:steps_per_epoch * per_step]
        for s in range(steps_per_epoch):
            for j in range(k):
                idx = order[(s * k + j) * b:(s * k + j + 1) * b]
                rt.train_micro_batch(feed.inputs(idx), feed.labels(idx))
            rt.optimizer_step(grad_scale=1.0 / k)
            steps += 1
            fraction = schedule.fraction_at(steps, total) if schedule else 0.0
            if fraction > 0:  # RigL scores by the gradient on this step's micro-batches
                idx = [order[(s * k + j) * b:(s * k + j + 1) * b] for j in range(k)]
                batches = ([(feed.inputs(i), feed.labels(i)) for i in idx]
                           if UPDATERS[schedule.method].needs_dense_grad else [])
                regrown += rt.update_masks(schedule.method, fraction, batches, mask_rng)
                mask_updates += 1
            if progress:
                progress(steps, total)
        rt.save_checkpoint(ckpt)
    train_time = time.perf_counter() - t0
    if config.epochs == 0:
        rt.save_checkpoint(ckpt)

    after = agreement = None
    infer_path = rt.export_inference(out / "inference.onnx")
    if test_feed is not None:
        logits = evaluate(rt.eval_logits, test_feed, b)
        after = accuracy(logits, test[1])
        infer = evaluate(lambda xb: rt.inference_logits(infer_path, xb), test_feed, b)
        agreement = float((infer.argmax(-1) == logits.argmax(-1)).mean())
    result = PersonaliseResult(
        budget_bytes=budget_bytes, micro_batch=b, accumulation_steps=k, optimizer_steps=steps,
        train_items=len(feed), accuracy_before=before, accuracy_after=after,
        inference_agreement=agreement, checkpoint=str(ckpt), inference_model=str(infer_path),
        train_time_s=round(train_time, 3), torch_loaded=sys.modules.get("torch") is not None,
        mask_method=schedule.method if schedule else None, mask_updates=mask_updates,
        regrown_weights=regrown)
    atomic_write_bytes(out / "result.json", json.dumps(result.to_dict(), indent=2).encode())
    return result
