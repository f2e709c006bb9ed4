"""BatchNorm RESET on device (seed 003): after pruning, re-estimate the running statistics.

Pruning shrinks activations layer after layer, so statistics measured on the dense model no
longer fit ("variance collapse"). RESET runs forward passes only, with every BatchNorm
normalising by its batch statistics, over at most `samples` of the user's samples, and sets
each running mean / variance to the average of its batch estimates (torch's training mode
with momentum=None). No gradients, no optimizer: it fits wherever inference at the
micro-batch does, and runs inside the same memory cap as training.
"""
from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from edgetrain import names, signing
from edgetrain.feed import Feed
from edgetrain.shuffle import Shuffle
from edgetrain.atomicfile import atomic_write_bytes
from edgetrain.selection import test_accuracy
from edgetrain import resume as resume_points
from edgetrain.runfolder import RunFolderError, RunLock, check_placement, refuse_finished
from edgetrain.runtime import DeviceRuntime

DEFAULT_SAMPLES = 256


@dataclass(frozen=True)
class ResetResult:
    budget_bytes: int | None
    samples: int  # user samples whose items fed the statistics
    batches: int  # forward passes of `micro_batch` items
    micro_batch: int
    accuracy_before: float | None  # as exported (pruned, dense statistics)
    accuracy_after: float | None  # after RESET
    checkpoint: str
    inference_model: str
    torch_loaded: bool

    def to_dict(self) -> dict:
        return asdict(self)


def reset_batchnorm(artifact: str | os.PathLike, train: tuple[np.ndarray, np.ndarray],
                    test: tuple[np.ndarray, np.ndarray] | None, out: str | os.PathLike,
                    budget_bytes: int | None, samples: int = DEFAULT_SAMPLES, seed: int = 0,
                    micro_batch: int | None = None, threads: int | None = None,
                    trust: str | os.PathLike | None = None) -> ResetResult:
    """RESET the artifact's BatchNorm statistics on `samples` random samples of `train`.

    Writes out/checkpoint (the artifact's state with the new statistics), out/inference.onnx
    and out/result.json. x and y must be checked against the manifest (data.check_xy).
    trust: an Ed25519 public key file; the artifact must carry its signature (signing.py)."""
    if trust is not None:
        signing.verify(artifact, trust)
    if samples < 1:
        raise ValueError(f"RESET needs at least 1 sample, got {samples}")
    check_placement(out, artifact)
    with RunLock(out):
        refuse_finished(out, "reset-bn")
        if resume_points.has_progress(Path(out)):
            raise RunFolderError(f"--out {out} holds a personalisation run's progress; "
                                 "reset-bn would mix with it. Choose another --out folder")
        return _reset(artifact, train, test, Path(out), budget_bytes, samples, seed,
                      micro_batch, threads)


def _reset(artifact, train, test, out: Path, budget_bytes, samples: int, seed: int,
           micro_batch, threads) -> ResetResult:
    rt = DeviceRuntime(artifact, budget_bytes=budget_bytes, threads=threads)
    b = micro_batch or rt.manifest.plan.micro_batch
    rt.set_micro_batch(b)
    rt.preflight(batchnorm_stats=True)  # a budget too small fails here
    feed = Feed(*train, rt.manifest)
    chosen = np.sort(Shuffle(feed.num_samples, seed)(np.arange(min(samples, feed.num_samples))))
    items = (chosen[:, None] * feed.per_sample + np.arange(feed.per_sample)).reshape(-1)
    full = len(items) // b  # whole micro-batches only: every estimate from b items
    if full == 0:
        raise ValueError(f"{len(chosen)} samples give {len(items)} items, fewer than one "
                         f"micro-batch of {b}; use more --samples or a smaller --micro-batch")
    items = np.random.default_rng(seed + 1).permutation(items)[:full * b]
    out.mkdir(parents=True, exist_ok=True)
    test_feed = Feed(*test, rt.manifest) if test is not None else None
    before = (test_accuracy(test_feed.sample_logits(rt.eval_logits, b), test[1])[0]
              if test_feed else None)
    n = rt.reset_batchnorm(lambda: (feed.inputs(items[i * b:(i + 1) * b]) for i in range(full)))
    after = (test_accuracy(test_feed.sample_logits(rt.eval_logits, b), test[1])[0]
             if test_feed else None)
    ckpt = rt.save_checkpoint(out / names.RUN_CHECKPOINT)
    infer = rt.export_inference(out / names.RUN_INFERENCE_MODEL)
    result = ResetResult(budget_bytes=budget_bytes, samples=len(chosen), batches=n,
                         micro_batch=b, accuracy_before=before, accuracy_after=after,
                         checkpoint=str(ckpt), inference_model=str(infer),
                         torch_loaded=sys.modules.get("torch") is not None)
    atomic_write_bytes(out / names.RUN_RESULT, json.dumps(result.to_dict(), indent=2).encode())
    return result
