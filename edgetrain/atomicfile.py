"""Atomic file writes: a crash at any moment leaves either the old file or the whole new one.

    with atomic_write(path) as tmp:
        write_everything_to(tmp)

The body writes a temporary file beside `path`; on leaving the block the temporary is flushed
to disk (fsync), renamed over `path` (a rename is atomic) and the folder is fsynced so the
rename itself survives a power cut. If the body raises, the temporary is deleted and `path`
is untouched.
"""
from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def temporary_name(path: Path) -> Path:
    """Where the temporary of `path` goes; a kill leaves it behind under this pattern. Per
    process and thread, so two threads writing the same path never share a temporary."""
    return path.with_name(f".{path.name}.tmp-{os.getpid()}-{threading.get_ident()}")


@contextmanager
def atomic_write(path: str | os.PathLike) -> Iterator[Path]:
    path = Path(path)
    tmp = temporary_name(path)
    try:
        yield tmp
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_folder(path.parent)


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    with atomic_write(path) as tmp:
        tmp.write_bytes(data)


def fsync_folder(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
