"""The on-device runtime: one ONNX Runtime training session over a verified artifact.

Lifecycle: open (verify, split the budget, cap the arena, load) -> preflight (one
forward/backward at the real batch shape, so a budget that is too small fails at once and
changes nothing) -> train_micro_batch ... optimizer_step -> eval_logits -> save_checkpoint /
export_inference. Runs in a process without torch (see ort_device.py). Side graphs live in
edgetrain/sidegraphs.py, the mask update in edgetrain/maskupdate.py, checkpoint files in
edgetrain/ortcheckpoint.py.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from edgetrain import names
from edgetrain.atomicfile import WriteError, atomic_write
from edgetrain.artifactbytes import inference_bytes_of, module_constants_bytes, state_bytes_of
from edgetrain.budget import (BudgetError, BudgetSplit, budget_error_from, fixes, install_arena,
                             with_prediction)
from edgetrain.manifest import ArtifactError, Manifest, load_manifest
from edgetrain.specs import check_logits
from edgetrain.maskupdate import update_masks
from edgetrain.nchwcprobe import check_block
from edgetrain.selection import checked_lr
from edgetrain.inference import check_stored_weights, one_at_a_time, open_bound_session
from edgetrain.ort_device import onnxruntime, training_api
from edgetrain.ortcheckpoint import CheckpointWriteError, refuse_odd_checkpoint, save_state
from edgetrain.sessions import run_padded, session_options, trim_heap
from edgetrain.sidegraphs import SideGraphs
from edgetrain.watchdog import bound_s, guard
from edgetrain.watchdog import set_bound as set_watchdog

_OPENED = False  # the env arena is per process: one runtime per process


def runtime_threads(manifest: Manifest, threads: int | None = None) -> int:
    """The intra-op thread count a runtime uses: the caller's, else (None) the plan's. A
    count of 0 is the caller's too, and session_options refuses it."""
    return manifest.plan.threads if threads is None else threads


class DeviceRuntime:
    def __init__(self, folder: str | os.PathLike, budget_bytes: int | None = None,
                 threads: int | None = None, on_phase=None):
        global _OPENED
        if _OPENED:
            raise RuntimeError("one DeviceRuntime per process: the memory cap is process-wide")
        self.folder = Path(folder)
        self.manifest = m = load_manifest(self.folder)  # verifies sizes and hashes
        self.inference_bytes = inference_bytes_of(self.folder, m)
        self.split = (BudgetSplit.from_budget(budget_bytes, state_bytes_of(m),
                                              module_constants_bytes(self.folder, m), fixes(m))
                      if budget_bytes is not None else None)
        training_api()  # imported before the arena is installed
        self._ort = onnxruntime()
        self._phase = on_phase or (lambda name: None)  # measurement marks where bytes go
        check_block(m.plan.nchwc_block, self._ort, self._phase)  # before the cap
        install_arena(self._ort, self.split.arena_cap_bytes if self.split else None)
        _OPENED = True
        self.threads = runtime_threads(m, threads)
        self._files = {role: str(self.folder / e.path) for role, e in m.files.items()}
        # A checkpoint holds at least every tensor's bytes: a shorter file is a failed write.
        self.min_checkpoint_bytes = sum(t.nbytes for t in m.trainable + m.frozen)
        refuse_odd_checkpoint(self._files[names.CHECKPOINT], m, "the artifact's checkpoint")
        self.micro_batch = m.plan.micro_batch  # before loading: a budget error names it
        set_watchdog(bound_s(m.predicted.get("step_flops")))  # edgetrain/watchdog.py
        self._load(self._files[names.CHECKPOINT], self._phase)
        self.optimizer.set_learning_rate(checked_lr(m.optimizer["lr"], "the manifest's lr"))
        self._infer = None  # (path, InferenceSession) of the last exported inference model
        self.scratch_dir: str | None = None  # where mask updates rewrite the state (maskupdate)
        self.side = SideGraphs(self._ort, self._files, m, self._late_session_options,
                               lambda: self.state.parameters, self._translate)

    def _session_options(self):
        """Fresh options for each session: ORT's training Module changes the options object it
        is given, and an inference session opened with that object kept 1.5 KB more outside
        the capped arena (measured)."""
        return session_options(self._ort, self.threads)

    def _late_session_options(self):
        """Sessions opened once training has grown the arena: no memory pattern (sessions.py)."""
        return session_options(self._ort, self.threads, memory_pattern=False)

    def _load(self, checkpoint: str, phase=lambda name: None) -> None:
        """(Re)build state, module and optimizer from a checkpoint; old ones are freed first."""
        api, files = training_api(), self._files
        self.optimizer = self.module = self.state = None
        try:
            phase("parameters")
            self.state = api.CheckpointState.load_checkpoint(checkpoint)
            self._check_state()
            phase("gradients")
            self.module = api.Module(files[names.TRAINING_MODEL], self.state,
                                     files[names.EVAL_MODEL],
                                     session_options=self._session_options())
            phase("optimizer_state")
            self.optimizer = api.Optimizer(files[names.OPTIMIZER_MODEL], self.module)
        except RuntimeError as e:
            raise self._translate(e, "loading the artifact") from e

    def load_checkpoint(self, path: str | os.PathLike) -> None:
        """Continue from a checkpoint this artifact's runtime saved (a resume point). Refuses a
        checkpoint of another artifact or an unreadable one; the learning rate carries on."""
        lr = self.optimizer.get_learning_rate()
        refuse_odd_checkpoint(path, self.manifest, f"checkpoint {path}")
        self._phase("reload")  # its tensors replace those freed (edgetrain/arenalog.py)
        try:
            self._load(str(path))
        except ArtifactError:
            self._load(self._files[names.CHECKPOINT])  # leave the runtime usable
            raise
        except RuntimeError as e:
            self._load(self._files[names.CHECKPOINT])
            raise ArtifactError(f"checkpoint {path} is unreadable ({str(e).splitlines()[0]}); "
                                "resume from an earlier point or start again") from e
        self._phase("other")
        self.optimizer.set_learning_rate(lr)
        trim_heap()

    # ---- checks ------------------------------------------------------------------------------
    def _check_state(self) -> None:
        params = self.state.parameters
        for spec in self.manifest.trainable + self.manifest.frozen:
            if spec.name not in params:
                raise ArtifactError(f"checkpoint has no tensor {spec.name!r} that the manifest "
                                    "lists; the checkpoint belongs to another artifact")
            arr = params[spec.name].data
            if tuple(arr.shape) != spec.shape or str(arr.dtype) != spec.dtype:
                raise ArtifactError(
                    f"checkpoint tensor {spec.name!r} is {arr.dtype}{list(arr.shape)}, the "
                    f"manifest says {spec.dtype}{list(spec.shape)}; the checkpoint belongs to "
                    "another artifact")

    def _translate(self, e: BaseException, what: str) -> BaseException:
        if self.split is not None:
            err = budget_error_from(e, self.split, what, fixes(self.manifest, self.micro_batch),
                                    self.micro_batch, self.threads)
            if err is not None:
                return with_prediction(err, self.manifest.predicted, self.micro_batch)
        return e

    def set_micro_batch(self, b: int) -> None:
        """Samples per forward call. Its inputs, and the one whole sample they are cut from,
        live outside the cap (numpy arrays ORT reads in place): more than the budget is refused."""
        if not isinstance(b, (int, np.integer)) or b <= 0:
            raise ValueError(f"micro-batch must be a positive number of samples, got {b!r}")
        inp = self.manifest.input
        outside = (int(b) * int(np.prod(inp.sample_shape, dtype=object))
                   + int(np.prod(inp.image_shape, dtype=object))) * 4
        if self.split is not None and outside > self.split.budget_bytes:
            raise BudgetError(f"a micro-batch of {b} samples is {outside:,} bytes of inputs "
                              f"alone, more than the whole budget ({self.split.budget_bytes:,}"
                              " bytes); use a smaller --micro-batch", self.split.budget_bytes,
                              None)
        self.micro_batch = int(b)
        set_watchdog(bound_s(self.manifest.predicted.get("step_flops"),
                             b / self.manifest.plan.micro_batch))

    # ---- training ----------------------------------------------------------------------------
    def _run(self, x: np.ndarray, y: np.ndarray, what: str):
        try:
            with guard(what):
                return self.module(np.ascontiguousarray(x, np.float32),
                                   np.ascontiguousarray(y, np.int64))
        except RuntimeError as e:
            raise self._translate(e, what) from e

    def preflight(self, mask_gradients: bool = False, batchnorm_stats: bool = False,
                  batchnorm_group: int = 1) -> None:
        """Run one forward/backward at the micro-batch shape on zeros, then undo its effects:
        a budget too small fails here, before any data is touched or checkpoint written, and
        so do logits narrower than the manifest's classes. Gradients are reset; BatchNorm
        running statistics (a training-mode forward updates them) restored. mask_gradients /
        batchnorm_stats also run those side graphs once, the statistics (reset_batchnorm's,
        group given) before or after the step as Plan.preflight_order says."""
        frozen = {t.name: self.state.parameters[t.name].data.copy() for t in self.manifest.frozen}
        b = self.micro_batch
        x = np.zeros((b, *self.manifest.input.sample_shape), np.float32)
        y = np.zeros(b, np.int64)
        step_first = self.manifest.plan.preflight_order == "step-first"
        if batchnorm_stats and not step_first:
            self.side.probe_batchnorm(x, batchnorm_group)
        self.module.train()  # labels 0 are safe; of the step's outputs only the logits' shape
        # is kept (ORT's arrays of them hold arena chunks the statistics pass could take)
        check_logits(np.shape(self._run(x, y, f"a training step at micro-batch {b}")[1]), b,
                     self.manifest.num_classes)
        self.module.lazy_reset_grad()
        if batchnorm_stats and step_first:
            self.side.probe_batchnorm(x, batchnorm_group)
        if mask_gradients:
            self.side.dense_gradients([(x, y)])
        for name, value in frozen.items():
            self.state.parameters[name].data[...] = value

    def train_micro_batch(self, x: np.ndarray, y: np.ndarray) -> float:
        """Forward and backward on one micro-batch; gradients add to those already held."""
        self.module.train()
        loss, _ = self._run(x, y, f"a training step at micro-batch {len(x)}")
        return float(loss)

    def optimizer_step(self, grad_scale: float = 1.0) -> None:
        """Apply the summed gradients (times grad_scale), then start a fresh accumulation."""
        if grad_scale != 1.0:
            for t in self.manifest.trainable:
                g = self.state.parameters[t.name].grad  # zero-copy view of ORT's buffer
                g *= np.float32(grad_scale)
        try:
            with guard("the optimizer step"):
                self.optimizer.step()
        except RuntimeError as e:
            raise self._translate(e, "the optimizer step") from e
        self.module.lazy_reset_grad()

    def set_learning_rate(self, lr: float) -> None:
        self.optimizer.set_learning_rate(checked_lr(lr, "the learning rate"))

    # ---- work through the side graphs --------------------------------------------------------
    def dense_gradients(self, batches) -> dict[str, np.ndarray]:
        """The dense gradient of each masked weight, summed over (x, y) batches (SideGraphs)."""
        return self.side.dense_gradients(batches)

    def update_masks(self, method: str, fraction: float, batches: list,
                     rng: np.random.Generator) -> int:
        """One mask update of every masked layer (edgetrain/maskupdate.py); regrown count."""
        return update_masks(self, method, fraction, batches, rng)

    def reset_batchnorm(self, batches, group: int = 1) -> int:
        """Re-estimate every BatchNorm's statistics as the plan says (SideGraphs). batches():
        a fresh iterator of inputs [B, *sample_shape] per call (the exact estimate reads it
        once per layer); `group` micro-batches make one RESET batch (a step's accumulation)."""
        return self.side.reset_batchnorm(batches, group)

    # ---- evaluation --------------------------------------------------------------------------
    def eval_logits(self, x: np.ndarray) -> np.ndarray:
        """Logits for x [N, *sample_shape], run in fixed micro-batches (the last one padded)."""
        self.module.eval()
        labels = np.zeros(self.micro_batch, np.int64)
        return run_padded(lambda xb: self._run(xb, labels, f"an eval step at batch {len(xb)}")[1],
                          x, self.micro_batch, self.manifest.num_classes)

    def open_inference(self, model_path: str | os.PathLike):
        """An InferenceSession on an exported inference model, kept open: the file's stored
        weights checked against the checkpoint's, the checkpoint's buffers bound as its
        initializers, no graph optimisation (edgetrain/inference.py: no weight copies)."""
        if self._infer is None or self._infer[0] != str(model_path):
            self._infer = None
            tensors = [t.name for t in self.manifest.trainable + self.manifest.frozen]
            check_stored_weights(Path(model_path), self.state.parameters, tensors,
                                 self.inference_bytes)  # ValueError (MalformedOnnx is one)
            try:
                self._infer = (str(model_path), *open_bound_session(
                    self._ort, Path(model_path), self._late_session_options(),
                    self.state.parameters, tensors))
            except Exception as e:  # ORT's InferenceSession errors are not RuntimeErrors
                raise self._translate(e, "loading the inference model") from e
        return self._infer[1]

    def inference_logits(self, model_path: str | os.PathLike, x: np.ndarray) -> np.ndarray:
        """Logits of an exported inference model (open_inference), one sample at a time."""
        sess, name = self.open_inference(model_path), self.manifest.input.name
        try:
            with guard("the inference model"):
                return one_at_a_time(lambda xb: sess.run(None, {name: xb})[0], x)
        except Exception as e:  # ORT's InferenceSession errors are not RuntimeErrors
            raise self._translate(e, "the inference model") from e

    # ---- persistence -------------------------------------------------------------------------
    def save_checkpoint(self, path: str | os.PathLike, optimizer_state: bool = True) -> Path:
        """Write parameters (and optimizer state) atomically: a crash leaves the old file.
        Loading a checkpoint without optimizer state gives fresh AdamW moments, made in the
        capped arena as at the first load; with it, ORT loads the moments beside the cap."""
        return save_state(training_api(), self.state, Path(path), self.min_checkpoint_bytes,
                          optimizer_state)

    def export_inference(self, path: str | os.PathLike) -> Path:
        """Write an inference-only ONNX model (input -> logits) with the current weights."""
        with atomic_write(path) as tmp:
            try:
                self.module.export_model_for_inferencing(str(tmp), [names.LOGITS_NAME])
            except RuntimeError as e:  # ORT reports a failed write as a RuntimeError
                raise WriteError(Path(path), e, what="inference model ") from e
        return Path(path)

    def release_training(self) -> None:
        """Free the training Module and optimizer (their gradients, moments and activations
        return to the arena's free space, where an inference session's weights then fit).
        Afterwards only inference_logits and save_checkpoint work."""
        self.optimizer = self.module = self.side = None
        trim_heap()


__all__ = ["DeviceRuntime", "BudgetError", "CheckpointWriteError", "runtime_threads"]
