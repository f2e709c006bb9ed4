"""A built-in data set's recordings, decoded once and kept on disk as plain arrays.

    recs = cached_recordings("hapt", hapt.hapt_file(), hapt.load)

Decoding HAPT's shipped file (a 20 MB gzip pickle, read through a restricted unpickler) takes
about 2 s, and every `edgetrain personalise --dataset hapt` process paid it; the decoded
arrays load in tens of milliseconds. The cache is one `.npz` per data set in
`$EDGETRAIN_DATA_CACHE` (default `$XDG_CACHE_HOME/edgetrain/data`, else
`~/.cache/edgetrain/data`; `off` turns it off), named by what the recordings are made from:
the source file's path, size and modification time, and the bytes of the reader's module. A
new wheel or a changed reader decodes afresh.

A cache file is read without pickle and checked for what it holds (array names, dtypes, shapes,
offsets that cut the samples into recordings, finite samples, labels within the classes);
anything else is decoded afresh from the source and written again. A cache that cannot be
written (a read-only home) is skipped: the recordings are still returned.
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
import zipfile
from pathlib import Path
from typing import Callable

import numpy as np

from edgetrain.atomicfile import WriteError, atomic_write
from edgetrain.data import Recordings

CACHE_ENV = "EDGETRAIN_DATA_CACHE"
FORMAT = 1
ARRAYS = ("samples", "offsets", "y", "subject", "side", "session", "classes")


def cache_dir() -> Path | None:
    """Where decoded recordings are kept; None when the environment turns the cache off."""
    env = os.environ.get(CACHE_ENV)
    if env is not None:
        return None if env.strip().lower() in ("", "off", "0", "none") else Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "edgetrain" / "data"


def cache_key(name: str, source: Path, reader: Callable) -> str:
    """What the recordings are made from: the source file as it is on disk and the reader."""
    st = source.stat()
    module = sys.modules.get(reader.__module__)
    code = Path(module.__file__).read_bytes() if module and module.__file__ else b""
    facts = [FORMAT, name, str(source.resolve()), st.st_size, st.st_mtime_ns,
             hashlib.sha256(code).hexdigest()]
    return hashlib.sha256(json.dumps(facts).encode()).hexdigest()[:16]


def to_arrays(recs: Recordings) -> dict[str, np.ndarray]:
    lengths = [len(x) for x in recs.x]
    samples = (np.concatenate(recs.x).astype(np.float64) if recs.x
               else np.zeros((0, 6), np.float64))
    return {"samples": samples,
            "offsets": np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
            "y": np.asarray(recs.y, np.int64), "subject": np.asarray(recs.subject, np.int64),
            "side": np.asarray(recs.side, np.int64),
            "session": np.asarray(recs.session if recs.session is not None else [], np.int64),
            "classes": np.asarray(recs.classes, dtype=np.str_)}


def from_arrays(a: dict[str, np.ndarray]) -> Recordings | None:
    """The recordings the arrays hold, or None unless they are what to_arrays writes."""
    if set(a) != set(ARRAYS):
        return None
    samples, offsets, classes = a["samples"], a["offsets"], a["classes"]
    n = len(a["y"])
    if (samples.dtype != np.float64 or samples.ndim != 2 or samples.shape[1] != 6
            or offsets.dtype != np.int64 or offsets.shape != (n + 1,)
            or classes.ndim != 1 or classes.dtype.kind != "U" or len(classes) == 0):
        return None
    if offsets[0] != 0 or offsets[-1] != len(samples) or np.any(np.diff(offsets) < 0):
        return None
    ints = [a[k] for k in ("y", "subject", "side")]
    if any(v.dtype != np.int64 or v.shape != (n,) for v in ints):
        return None
    session = a["session"]
    if session.dtype != np.int64 or session.shape not in ((0,), (n,)):
        return None
    if n and (a["y"].min() < 0 or a["y"].max() >= len(classes)):
        return None
    if not np.isfinite(samples).all():
        return None
    x = [samples[offsets[i]:offsets[i + 1]] for i in range(n)]
    return Recordings(x=x, y=a["y"], subject=a["subject"], side=a["side"],
                      classes=tuple(str(c) for c in classes),
                      session=session if session.shape == (n,) else None)


def read_cache(path: Path) -> Recordings | None:
    try:
        with np.load(path, allow_pickle=False) as z:
            return from_arrays({k: z[k] for k in z.files})
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, KeyError):
        return None


def write_cache(path: Path, recs: Recordings) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_write(path) as tmp, open(tmp, "wb") as f:
            np.savez(f, **to_arrays(recs))
        for old in path.parent.glob(f"{path.name.rsplit('-', 1)[0]}-*.npz"):
            if old != path:  # made from another source file or reader: never read again
                old.unlink(missing_ok=True)
    except (OSError, WriteError):
        pass  # a cache is an optimisation: the recordings are returned all the same


def cached_recordings(name: str, source: Path, reader: Callable[[], Recordings]) -> Recordings:
    """Data set `name`'s recordings: from the cache when it holds them for `source` as it is
    and for this `reader`, else `reader()` (then kept for the next process)."""
    folder = cache_dir()
    if folder is None:
        return reader()
    path = folder / f"{name}-{cache_key(name, source, reader)}.npz"
    recs = read_cache(path) if path.is_file() else None
    if recs is None:
        recs = reader()
        write_cache(path, recs)
    return recs
