"""Atomic file writes: a crash at any moment leaves either the old file or the whole new one.

    with atomic_write(path) as tmp:
        write_everything_to(tmp)

The body writes a temporary file beside `path`; on leaving the block the temporary is flushed
to disk (fsync), renamed over `path` (a rename is atomic) and the folder is fsynced so the
rename itself survives a power cut. If the body raises, the temporary is deleted and `path`
is untouched. Any OSError on the way (disk full, read-only folder, I/O error) becomes a
WriteError naming the file, the cause and the free space: the CLI's exit status 4.
"""
from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from edgetrain.faultpoints import fault_point


class WriteError(OSError):
    """A file could not be written whole (disk full, read-only folder, I/O error); what was
    saved before is unchanged."""

    def __init__(self, path: Path, cause: BaseException, fix: str = "", what: str = ""):
        free = free_bytes(Path(path).parent)
        why = str(cause).splitlines()[0] if str(cause) else type(cause).__name__
        if isinstance(cause, OSError) and cause.strerror:
            why = cause.strerror
        elif "error:" in why:  # ORT's message ends "... error:No space left on device errno:28"
            why = why.rsplit("error:", 1)[1].split(" errno:")[0].strip()
        super().__init__(
            f"could not write {what}{path}: {why}"
            + (f" ({free:,} bytes free on that disk)" if free is not None else "")
            + ". Nothing already saved was changed. "
            + (fix or "Free space on the disk (or make the folder writable), then run again "
               "with --resume."))
        self.path = Path(path)


def free_bytes(folder: Path) -> int | None:
    try:
        return shutil.disk_usage(folder).free
    except OSError:
        return None


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
        fault_point("file-written", path)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_folder(path.parent)
    except BaseException as e:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass
        if isinstance(e, OSError) and not isinstance(e, WriteError):
            raise WriteError(path, e) from e
        raise


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    with atomic_write(path) as tmp:
        tmp.write_bytes(data)


def fsync_folder(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def pid_alive(pid: int) -> bool:
    """Whether process `pid` runs (a temporary's writer, an export's)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


def remove_stale_temporaries(folder: str | os.PathLike) -> list[str]:
    """Delete the temporaries in `folder` (not below it) whose writing process is gone: what a
    killed process left (temporary_name's `.<name>.tmp-<pid>-<thread>`). A temporary of a live
    process is left alone, so this needs no lock. Returns the names removed."""
    gone = []
    try:
        entries = list(Path(folder).iterdir())
    except OSError:
        return gone
    for p in entries:
        head, sep, tail = p.name.rpartition(".tmp-")
        pid = tail.split("-")[0]
        if (p.name.startswith(".") and sep and pid.isdigit() and p.is_file()
                and not p.is_symlink() and not pid_alive(int(pid))):
            p.unlink(missing_ok=True)
            gone.append(p.name)
    return gone
