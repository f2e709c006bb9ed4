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
import mmap
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import numpy as np

from edgetrain.atomicfile import WriteError, atomic_write
from edgetrain.faultpoints import fault_point
from edgetrain.ort_device import onnxruntime
from edgetrain.specs import ArtifactError

_FLOAT = 1  # onnx TensorProto.FLOAT, as the checkpoint records data types
TENSOR_OVERHEAD_BYTES = 4096  # per tensor record: name, dims, table (generous)


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


@contextmanager
def trainable_weights(path: Path, manifest) -> Iterator[dict[str, np.ndarray]]:
    """Read-only float32 views of the trainable tensors of a checkpoint of this artifact,
    shaped as the manifest says, by name: the file is mapped, not copied into memory. Refuses
    (ArtifactError) a checkpoint that is not this artifact's (refuse_odd_checkpoint). Use the
    views inside the `with` block only."""
    refuse_odd_checkpoint(path, manifest, f"checkpoint {path}")
    f = open(path, "rb")
    buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    try:
        state = _checkpoint(buf).ModuleState()
        raw = {state.RequiresGradParams(i).Name().decode(): state.RequiresGradParams(i)
               for i in range(state.RequiresGradParamsLength())}
        views = {}
        for spec in manifest.trainable:
            if raw[spec.name].DataType() != _FLOAT:
                raise ArtifactError(f"checkpoint {path} is refused: {spec.name!r} is not float32")
            views[spec.name] = raw[spec.name].RawDataAsNumpy().view(np.float32).reshape(spec.shape)
        raw.clear()
        yield views
    finally:
        views = raw = state = None
        try:
            buf.close()
        except BufferError:  # a view outlived the block: the mapping closes with it
            pass
        f.close()


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


def max_checkpoint_bytes(trainable, frozen) -> int:
    """The most a checkpoint of these TensorSpecs can hold: every tensor, two AdamW moments per
    trainable one, and a record each. A larger file carries something else (properties, extra
    tensors) that would load outside the memory cap."""
    nbytes = 3 * sum(t.nbytes for t in trainable) + sum(t.nbytes for t in frozen)
    return nbytes + TENSOR_OVERHEAD_BYTES * (3 * len(trainable) + len(frozen) + 4)


def check_checkpoint(path: Path, trainable, frozen) -> str | None:
    """Why the checkpoint at `path` is not one of these tensors (None if it is): too large,
    properties (ORT loads them outside any cap), external data, tensors the manifest does not
    list, or a tensor or moment of another size. Reads only the structure (mmap)."""
    size, most = Path(path).stat().st_size, max_checkpoint_bytes(trainable, frozen)
    if size > most:
        return f"it is {size:,} bytes, more than its tensors can take ({most:,})"
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        try:
            return _structure_problem(_checkpoint(buf), trainable, frozen)
        except (IndexError, ValueError, TypeError, UnicodeDecodeError) as e:  # damaged buffer
            return f"its structure is unreadable ({type(e).__name__})"


def refuse_odd_checkpoint(path, manifest, what: str) -> None:
    """Before ORT reads a checkpoint: ArtifactError unless it holds the manifest's tensors
    and nothing else (check_checkpoint)."""
    why = check_checkpoint(Path(path), manifest.trainable, manifest.frozen)
    if why:
        raise ArtifactError(f"{what} is refused: {why}. It belongs to another artifact or was "
                            "altered; re-export, or resume from another point")


def _structure_problem(ckpt, trainable, frozen) -> str | None:
    bag = ckpt.PropertyBag()
    if bag is not None and bag.IntsLength() + bag.FloatsLength() + bag.StringsLength():
        return "it carries properties (ORT would load them outside the memory cap)"
    state = ckpt.ModuleState()
    if state is None or state.HasExternalData():
        return "its tensors are missing or kept in an external file"
    want = {t.name: t.nbytes for t in trainable}
    for group, count, get in ((want, state.RequiresGradParamsLength(), state.RequiresGradParams),
                              ({t.name: t.nbytes for t in frozen}, state.FrozenParamsLength(),
                               state.FrozenParams)):
        got = {get(i).Name().decode(): get(i).RawDataLength() for i in range(count)}
        if got != group:
            extra = sorted(set(got) - set(group)) or sorted(n for n in got if got[n] != group.get(n))
            return f"its tensors differ from the manifest's (e.g. {(extra or sorted(group))[:3]})"
    if ckpt.OptimizerGroupsLength() > 1:
        return "it holds more than one optimizer group"
    for g in range(ckpt.OptimizerGroupsLength()):
        opt = ckpt.OptimizerGroups(g)
        for i in range(opt.OptimizerStatesLength()):
            st = opt.OptimizerStates(i)
            name = st.ParamName().decode()
            if name not in want or st.MomentumsLength() > 2 or any(
                    st.Momentums(j).RawDataLength() != want[name]
                    for j in range(st.MomentumsLength())):
                return f"its optimizer state for {name!r} does not fit the manifest's tensors"
    return None


class CheckpointWriteError(WriteError):
    """A checkpoint could not be written whole (disk full, file too large, I/O error)."""

    def __init__(self, path: Path, cause: BaseException):
        super().__init__(path, cause, "The previous checkpoint and resume point are intact. "
                         "Free space on the disk, then run again with --resume.",
                         what="checkpoint ")


def save_state(api, state, path: Path, min_bytes: int, optimizer_state: bool = True) -> Path:
    """Write a CheckpointState (parameters and optimizer state) to `path` atomically: a crash
    leaves the old file. A file shorter than min_bytes (every tensor's bytes) is a failed
    write: ORT does not always report a full disk. Raises CheckpointWriteError."""
    with atomic_write(path) as tmp:
        try:
            api.CheckpointState.save_checkpoint(state, str(tmp),
                                                include_optimizer_state=optimizer_state)
            written = tmp.stat().st_size if tmp.exists() else 0
            if written < min_bytes:
                raise OSError(errno.ENOSPC, f"only {written} of at least {min_bytes} bytes "
                              "reached the disk")
        except (OSError, RuntimeError) as e:
            raise CheckpointWriteError(Path(path), e) from e
        fault_point("checkpoint-tmp-written")
        fault_point("checkpoint-torn", tmp)
    return Path(path)
