"""ONNX Runtime's checkpoint file: written whole or not at all (save_state), and surgery on
it, the one place the optimizer state can be reached.

onnxruntime-training 1.19 keeps AdamW's moments inside its CheckpointState and exposes no
Python handle to them; they are only written into the checkpoint, a flatbuffer
(onnxruntime/core/flatbuffers/schema/ort_training_checkpoint.fbs, whose generated readers ship
in the wheel). Each moment's raw bytes sit in the buffer, so zeroing some elements is an
in-place write that changes no size or offset.
"""
from __future__ import annotations

import errno
import shutil
from pathlib import Path

import numpy as np

from edgetrain.atomicfile import atomic_write
from edgetrain.faultpoints import fault_point
from edgetrain.ort_device import onnxruntime

_FLOAT = 1  # onnx TensorProto.FLOAT, as the checkpoint records data types


def _checkpoint(buf: bytearray):
    """The flatbuffer reader of a checkpoint held in `buf` (views into it, no copy)."""
    onnxruntime()  # imports ORT with the torch guard in place
    from onnxruntime.tools.ort_format_model.ort_flatbuffers_py.fbs import Checkpoint

    return Checkpoint.Checkpoint.GetRootAs(buf, 0)


def _moments(buf: bytearray) -> dict[str, list[np.ndarray]]:
    """Writable float32 views into `buf` of each parameter's moments, by parameter name."""
    ckpt = _checkpoint(buf)
    out: dict[str, list[np.ndarray]] = {}
    for g in range(ckpt.OptimizerGroupsLength()):
        group = ckpt.OptimizerGroups(g)
        for s in range(group.OptimizerStatesLength()):
            state = group.OptimizerStates(s)
            views = []
            for j in range(state.MomentumsLength()):
                t = state.Momentums(j)
                if t.DataType() != _FLOAT:
                    raise ValueError(f"moment {j} of {state.ParamName().decode()!r} has data type "
                                     f"{t.DataType()}, not float32")
                views.append(t.RawDataAsNumpy().view(np.float32))
            out.setdefault(state.ParamName().decode(), []).extend(views)
    return out


def optimizer_moments(buf: bytes | bytearray) -> dict[str, list[np.ndarray]]:
    """Copies of every parameter's optimizer moments (flattened), by parameter name."""
    return {name: [v.copy() for v in views] for name, views in _moments(bytearray(buf)).items()}


def zero_moments(buf: bytearray, elements: dict[str, np.ndarray]) -> None:
    """Set the moments of the given flat elements of each named parameter to zero, in `buf`.

    A fresh AdamW state for those elements: their next update starts from their own gradient
    alone. Raises ValueError if the checkpoint has no optimizer state for a parameter."""
    moments = _moments(buf)
    for name, idx in elements.items():
        if name not in moments:
            raise ValueError(f"the checkpoint holds no optimizer state for {name!r}; save it "
                             "with include_optimizer_state=True")
        for view in moments[name]:
            view[idx] = 0.0


def optimizer_step_count(buf: bytes | bytearray) -> int:
    """The optimizer's step count (AdamW's bias correction) saved in the checkpoint."""
    ckpt = _checkpoint(bytearray(buf))
    if ckpt.OptimizerGroupsLength() == 0:
        raise ValueError("the checkpoint holds no optimizer state")
    return int(ckpt.OptimizerGroups(0).Step())


class CheckpointWriteError(OSError):
    """A checkpoint could not be written whole (disk full, file too large, I/O error)."""

    def __init__(self, path: Path, cause: BaseException):
        free = free_bytes(path.parent)
        why = str(cause).splitlines()[0]
        if "error:" in why:  # ORT's message ends "... error:No space left on device errno:28"
            why = why.rsplit("error:", 1)[1].strip()
        super().__init__(
            f"could not write checkpoint {path}: {why}"
            + (f" ({free:,} bytes free on that disk)" if free is not None else "")
            + ". Nothing already saved was changed: the previous checkpoint and resume point "
            "are intact. Free space on the disk, then run again with --resume.")


def free_bytes(folder: Path) -> int | None:
    try:
        return shutil.disk_usage(folder).free
    except OSError:
        return None


def save_state(api, state, path: Path, min_bytes: int) -> Path:
    """Write a CheckpointState (parameters and optimizer state) to `path` atomically: a crash
    leaves the old file. A file shorter than min_bytes (every tensor's bytes) is a failed
    write: ORT does not always report a full disk. Raises CheckpointWriteError."""
    with atomic_write(path) as tmp:
        try:
            api.CheckpointState.save_checkpoint(state, str(tmp), include_optimizer_state=True)
            written = tmp.stat().st_size if tmp.exists() else 0
            if written < min_bytes:
                raise OSError(errno.ENOSPC, f"only {written} of at least {min_bytes} bytes "
                              "reached the disk")
        except (OSError, RuntimeError) as e:
            raise CheckpointWriteError(Path(path), e) from e
        fault_point("checkpoint-tmp-written")
        fault_point("checkpoint-torn", tmp)
    return Path(path)
