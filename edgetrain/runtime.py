"""The on-device runtime: one ONNX Runtime training session over a verified artifact.

Lifecycle: open (verify, split the budget, cap the arena, load) -> preflight (one
forward/backward at the real batch shape, so a budget that is too small fails at once and
changes nothing) -> train_micro_batch ... optimizer_step -> eval_logits -> save_checkpoint /
export_inference. Runs in a process without torch (see ort_device.py).
"""
from __future__ import annotations

import ctypes
import errno
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np

from device_sim.cap import BudgetError, BudgetSplit, arena_rounded, budget_error_from, install_arena
from device_sim.faults import fault_point
from edgetrain.atomicfile import atomic_write
from edgetrain.manifest import ArtifactError, Manifest, load_manifest
from edgetrain.masks import UPDATERS, update_layer
from edgetrain.ort_device import onnxruntime, training_api
from edgetrain.ortcheckpoint import zero_moments

_OPENED = False  # the env arena is per process: one runtime per process


def state_bytes_of(manifest: Manifest) -> int:
    """Bytes the checkpoint tensors occupy once loaded: one arena chunk per tensor."""
    return sum(arena_rounded(t.nbytes) for t in manifest.trainable + manifest.frozen)


class DeviceRuntime:
    def __init__(self, folder: str | os.PathLike, budget_bytes: int | None = None,
                 threads: int | None = None, on_phase=None):
        global _OPENED
        if _OPENED:
            raise RuntimeError("one DeviceRuntime per process: the memory cap is process-wide")
        self.folder = Path(folder)
        self.manifest = load_manifest(self.folder)  # verifies sizes and hashes
        m = self.manifest
        self.split = (BudgetSplit.from_budget(budget_bytes, state_bytes_of(m))
                      if budget_bytes is not None else None)
        training_api()  # imported before the arena is installed
        ort = onnxruntime()
        self._ort = ort
        install_arena(ort, self.split.arena_cap_bytes if self.split else None)
        _OPENED = True
        so = ort.SessionOptions()
        so.add_session_config_entry("session.use_env_allocators", "1")
        # ORT's own error lines are suppressed: its errors reach the user translated (e.g. a
        # BudgetError naming the bytes). EDGETRAIN_ORT_LOG_LEVEL=0..3 shows them for debugging.
        so.log_severity_level = int(os.environ.get("EDGETRAIN_ORT_LOG_LEVEL", "4"))
        if threads:
            so.intra_op_num_threads = threads
        self._so = so
        self._files = {role: str(self.folder / e.path) for role, e in m.files.items()}
        # A checkpoint holds at least every tensor's bytes: a shorter file is a failed write.
        self._min_checkpoint_bytes = sum(t.nbytes for t in m.trainable + m.frozen)
        self._load(self._files["checkpoint"], on_phase)
        self.optimizer.set_learning_rate(float(m.optimizer["lr"]))
        self.micro_batch = m.plan.micro_batch
        self._label_dtype = np.int64
        self._infer = None  # (path, InferenceSession) of the last exported inference model
        self._side: dict = {}  # role -> InferenceSession of a side graph (exporters/sidegraphs.py)

    def _load(self, checkpoint: str, on_phase=None) -> None:
        """(Re)build state, module and optimizer from a checkpoint; old ones are freed first."""
        api, files = training_api(), self._files
        phase = on_phase or (lambda name: None)  # measurement marks where bytes go
        self.optimizer = self.module = self.state = None
        try:
            phase("parameters")
            self.state = api.CheckpointState.load_checkpoint(checkpoint)
            self._check_state()
            phase("gradients")
            self.module = api.Module(files["training_model"], self.state, files["eval_model"],
                                     session_options=self._so)
            phase("optimizer_state")
            self.optimizer = api.Optimizer(files["optimizer_model"], self.module)
        except RuntimeError as e:
            raise self._translate(e, "loading the artifact") from e

    def load_checkpoint(self, path: str | os.PathLike) -> None:
        """Continue from a checkpoint this artifact's runtime saved (a resume point). Refuses a
        checkpoint of another artifact or an unreadable one; the learning rate carries on."""
        lr = self.optimizer.get_learning_rate()
        try:
            self._load(str(path))
        except ArtifactError:
            self._load(self._files["checkpoint"])  # leave the runtime usable
            raise
        except RuntimeError as e:
            self._load(self._files["checkpoint"])
            raise ArtifactError(f"checkpoint {path} is unreadable ({str(e).splitlines()[0]}); "
                                "resume from an earlier point or start again") from e
        self.optimizer.set_learning_rate(lr)
        _trim_heap()

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

    def _translate(self, e: RuntimeError, what: str) -> Exception:
        if self.split is not None:
            err = budget_error_from(e, self.split, what)
            if err is not None:
                return err
        return e

    def set_micro_batch(self, b: int) -> None:
        if b <= 0:
            raise ValueError(f"micro-batch must be a positive number of samples, got {b}")
        self.micro_batch = b

    # ---- training ----------------------------------------------------------------------------
    def _run(self, x: np.ndarray, y: np.ndarray, what: str):
        try:
            return self.module(np.ascontiguousarray(x, np.float32),
                               np.ascontiguousarray(y, self._label_dtype))
        except RuntimeError as e:
            raise self._translate(e, what) from e

    def preflight(self, mask_gradients: bool = False, batchnorm_stats: bool = False) -> None:
        """Run one forward/backward at the micro-batch shape on zeros, then undo its effects.

        A budget too small for training fails here, before any data is touched or any
        checkpoint written. Gradients are reset; BatchNorm running statistics, which a
        training-mode forward updates in place, are restored. mask_gradients / batchnorm_stats
        also run those side graphs once, for work that will need them.
        """
        frozen = {t.name: self.state.parameters[t.name].data.copy() for t in self.manifest.frozen}
        b = self.micro_batch
        x = np.zeros((b, *self.manifest.input.sample_shape), np.float32)
        y = np.zeros(b, np.int64)
        self.module.train()
        self._run(x, y, f"a training step at micro-batch {b}")
        self.module.lazy_reset_grad()
        if mask_gradients:
            self.dense_gradients([(x, y)])
        if batchnorm_stats:
            self._side_run("batchnorm_stats_model", {self.manifest.input.name: x},
                           f"BatchNorm statistics at micro-batch {b}")
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
            self.optimizer.step()
        except RuntimeError as e:
            raise self._translate(e, "the optimizer step") from e
        self.module.lazy_reset_grad()

    def set_learning_rate(self, lr: float) -> None:
        self.optimizer.set_learning_rate(float(lr))

    # ---- side graphs -------------------------------------------------------------------------
    def _side_run(self, role: str, feeds: dict, what: str) -> dict[str, np.ndarray]:
        """Run a side graph inside the cap, its parameter inputs fed from the live state."""
        if role not in self._side:
            if role not in self._files:
                raise ArtifactError(f"the artifact has no {role} (manifest files: "
                                    f"{sorted(self._files)}); re-export it with this edgetrain")
            so = self._ort.SessionOptions()
            so.add_session_config_entry("session.use_env_allocators", "1")
            so.log_severity_level = self._so.log_severity_level
            so.intra_op_num_threads = self._so.intra_op_num_threads
            try:
                self._side[role] = self._ort.InferenceSession(
                    self._files[role], so, providers=["CPUExecutionProvider"])
            except RuntimeError as e:
                raise self._translate(e, f"loading the {role}") from e
        sess = self._side[role]
        params = self.state.parameters  # .data is a zero-copy view of the state's tensor
        feeds = {**{i.name: params[i.name].data for i in sess.get_inputs() if i.name in params},
                 **feeds}
        try:
            outs = sess.run(None, feeds)
        except RuntimeError as e:
            raise self._translate(e, what) from e
        return {o.name: v for o, v in zip(sess.get_outputs(), outs)}

    def dense_gradients(self, batches: list[tuple[np.ndarray, np.ndarray]]) -> dict[str, np.ndarray]:
        """Gradient of the loss w.r.t. each masked layer's dense weight, flattened [numel] and
        summed over `batches` of (x, y): what RigL grows by. Changes no state."""
        inp, lab = self.manifest.input.name, self.manifest.input.label_name
        total: dict[str, np.ndarray] = {}
        for x, y in batches:
            outs = self._side_run("mask_grad_model",
                                  {inp: np.ascontiguousarray(x, np.float32),
                                   lab: np.ascontiguousarray(y, self._label_dtype)},
                                  f"the dense gradients at micro-batch {len(x)}")
            for name, g in outs.items():
                total[name] = g if name not in total else total[name] + g
        return {m.weight: total[f"{m.weight}_grad"] for m in self.manifest.masks}

    def update_masks(self, method: str, fraction: float, batches: list, rng: np.random.Generator
                     ) -> int:
        """One mask update (edgetrain/masks.py) of every masked layer; returns regrown count.

        Regrown weights are zero and their AdamW moments are zeroed; the rest of the state,
        the step count and the learning rate carry on. Call between optimizer steps."""
        if method not in UPDATERS:
            raise ValueError(f"unknown mask updater {method!r}; choose one of {sorted(UPDATERS)}")
        if not self.manifest.masks:
            raise ValueError("the artifact has no sparse masks; export it with --density < 1 "
                             "to train it sparse")
        updater = UPDATERS[method]
        grads = self.dense_gradients(batches) if updater.needs_dense_grad else {}
        params, slots = self.state.parameters, {}
        for mask in self.manifest.masks:
            n = int(round(fraction * mask.nnz))
            if n == 0:
                continue
            values, positions = params[mask.values].data, params[mask.positions].data
            new_values, new_positions, regrown = update_layer(
                values, positions.astype(np.int64), mask.numel, n, updater.keep_score(values),
                updater.grow_score(grads.get(mask.weight), mask.numel, rng))
            values[...] = new_values
            positions[...] = new_positions.astype(positions.dtype)
            slots[mask.values] = regrown
        if slots:
            self._reload_with_fresh_moments(slots)
        return sum(len(s) for s in slots.values())

    def _reload_with_fresh_moments(self, slots: dict[str, np.ndarray]) -> None:
        """Zero the AdamW moments of the given elements. ORT exposes no optimizer state, so the
        state goes through a checkpoint file (edgetrain/ortcheckpoint.py) and is loaded again."""
        fd, tmp = tempfile.mkstemp(prefix="edgetrain-mask-update-")
        os.close(fd)
        try:
            training_api().CheckpointState.save_checkpoint(self.state, tmp,
                                                        include_optimizer_state=True)
            buf = bytearray(Path(tmp).read_bytes())
            zero_moments(buf, slots)
            Path(tmp).write_bytes(buf)
            lr = self.optimizer.get_learning_rate()
            self._load(tmp)
            self.optimizer.set_learning_rate(lr)
        finally:
            os.unlink(tmp)
        _trim_heap()

    def reset_batchnorm(self, batches) -> int:
        """RESET (seed 003): set every BatchNorm's running statistics to the mean over `batches`
        (inputs [B, *sample_shape]) of its batch statistics, computed by forward passes only.
        Returns the number of batches used."""
        sums: dict[str, np.ndarray] = {}
        count = 0
        for x in batches:
            outs = self._side_run("batchnorm_stats_model",
                                  {self.manifest.input.name: np.ascontiguousarray(x, np.float32)},
                                  f"BatchNorm statistics at batch {len(x)}")
            for name, v in outs.items():
                if name != "logits":
                    sums[name] = sums.get(name, 0) + v.astype(np.float64)
            count += 1
        if count == 0:
            raise ValueError("BatchNorm RESET needs at least one batch of samples")
        params = self.state.parameters
        for name, s in sums.items():
            target = params[name].data
            assert target.shape == s.shape, (name, target.shape, s.shape)
            target[...] = (s / count).astype(target.dtype)
        return count

    # ---- evaluation --------------------------------------------------------------------------
    def eval_logits(self, x: np.ndarray) -> np.ndarray:
        """Logits for x [N, *sample_shape], run in fixed micro-batches (the last one padded)."""
        self.module.eval()
        labels = np.zeros(self.micro_batch, np.int64)
        return run_padded(lambda xb: self._run(xb, labels, f"an eval step at batch {len(xb)}")[1],
                          x, self.micro_batch, self.manifest.num_classes)

    def inference_logits(self, model_path: str | os.PathLike, x: np.ndarray) -> np.ndarray:
        """Logits of an exported inference model, in a plain InferenceSession inside the cap."""
        ort = self._ort
        if self._infer is None or self._infer[0] != str(model_path):
            so = ort.SessionOptions()
            so.add_session_config_entry("session.use_env_allocators", "1")
            so.log_severity_level = 3
            self._infer = (str(model_path), ort.InferenceSession(
                str(model_path), so, providers=["CPUExecutionProvider"]))
        sess, name = self._infer[1], self.manifest.input.name
        try:
            return run_padded(lambda xb: sess.run(None, {name: xb})[0], x, self.micro_batch,
                              self.manifest.num_classes)
        except RuntimeError as e:
            raise self._translate(e, "the inference model") from e

    # ---- persistence -------------------------------------------------------------------------
    def save_checkpoint(self, path: str | os.PathLike) -> Path:
        """Write parameters and optimizer state atomically: a crash leaves the old file."""
        with atomic_write(path) as tmp:
            try:
                training_api().CheckpointState.save_checkpoint(self.state, str(tmp),
                                                            include_optimizer_state=True)
                written = tmp.stat().st_size if tmp.exists() else 0
                if written < self._min_checkpoint_bytes:
                    raise OSError(errno.ENOSPC, f"only {written} of at least "
                                  f"{self._min_checkpoint_bytes} bytes reached the disk")
            except (OSError, RuntimeError) as e:
                raise CheckpointWriteError(Path(path), e) from e
            fault_point("checkpoint-tmp-written")
            fault_point("checkpoint-torn", tmp)
        return Path(path)

    def export_inference(self, path: str | os.PathLike) -> Path:
        """Write an inference-only ONNX model (input -> logits) with the current weights."""
        with atomic_write(path) as tmp:
            self.module.export_model_for_inferencing(str(tmp), ["logits"])
        return Path(path)


class CheckpointWriteError(OSError):
    """A checkpoint could not be written whole (disk full, file too large, I/O error)."""

    def __init__(self, path: Path, cause: BaseException):
        free = _free_bytes(path.parent)
        why = str(cause).splitlines()[0]
        if "error:" in why:  # ORT's message ends "... error:No space left on device errno:28"
            why = why.rsplit("error:", 1)[1].strip()
        super().__init__(
            f"could not write checkpoint {path}: {why}"
            + (f" ({free:,} bytes free on that disk)" if free is not None else "")
            + ". Nothing already saved was changed: the previous checkpoint and resume point "
            "are intact. Free space on the disk, then run again with --resume.")


def _free_bytes(folder: Path) -> int | None:
    try:
        return shutil.disk_usage(folder).free
    except OSError:
        return None


def run_padded(fn, x: np.ndarray, batch: int, num_classes: int) -> np.ndarray:
    """Apply fn to x in batches of exactly `batch` rows (the last padded with zeros).

    A fixed shape keeps the runtime's memory plan, and so its peak, the same for every call.
    """
    out = []
    for i in range(0, len(x), batch):
        chunk = np.ascontiguousarray(x[i:i + batch], np.float32)
        n = len(chunk)
        if n < batch:
            chunk = np.concatenate([chunk, np.zeros((batch - n, *chunk.shape[1:]), np.float32)])
        out.append(np.array(fn(chunk)[:n]))
    return np.concatenate(out) if out else np.zeros((0, num_classes), np.float32)


def _trim_heap() -> None:
    """Hand freed heap pages back to the OS. glibc keeps them otherwise: rebuilding the
    sessions at every mask update grew the process by about 1 MB of freed-but-held heap per
    update (patch MobileNet: 106 -> 243 MB RSS over 120 updates; flat at 102 MB with this)."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to do
        pass


__all__ = ["DeviceRuntime", "BudgetError", "CheckpointWriteError", "state_bytes_of"]
