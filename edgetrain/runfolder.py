"""A run folder (`--out` of personalise and reset-bn): never an artifact, one run at a time.

  * placement: a run writes `checkpoint` and `inference.onnx` into its folder, so the folder
    may not be an artifact folder, sit inside one, or hold one: that would overwrite or mix
    with the artifact's own files.
  * an exclusive lock: `fcntl.flock` on `<out>/.lock`, taken before the folder's progress is
    looked at and held until the run ends. The kernel releases it when the holder dies (even
    by SIGKILL), so a crashed run never leaves the folder locked; while held, the file keeps
    the holder's process id for the refusal message (emptied at release). A folder this run
    created and left empty (a run refused before it wrote anything) is removed again.
"""
from __future__ import annotations

import errno
import fcntl
import os
import time
from pathlib import Path

from edgetrain import names

LOCK_NAME = ".lock"


class RunFolderError(ValueError):
    """The run folder cannot be used (misplaced, or in use by another run)."""


def check_placement(out: str | os.PathLike, artifact: str | os.PathLike) -> None:
    """Refuse a run folder that is, or is inside, an artifact folder (or holds a manifest)."""
    o, a = Path(out).resolve(), Path(artifact).resolve()
    where = (f"is the artifact folder {artifact}" if o == a else
             f"is inside the artifact folder {artifact}" if a in o.parents else
             "holds an artifact (manifest.json)" if (o / names.MANIFEST_NAME).exists() else "")
    if where:
        raise RunFolderError(
            f"--out {out} {where}; a run writes its checkpoint and inference model there and "
            "would overwrite or mix with the artifact's files. Choose another --out folder; "
            "nothing was written")


def refuse_finished(out: str | os.PathLike, what: str) -> None:
    """Refuse a folder that already holds a run's outputs (they would be replaced)."""
    held = [n for n in (names.RUN_CHECKPOINT, names.RUN_INFERENCE_MODEL, names.RUN_RESULT)
            if (Path(out) / n).exists()]
    if held:
        raise RunFolderError(f"--out {out} already holds a run's outputs ({', '.join(held)}); "
                             f"{what} would replace them. Choose another --out folder; nothing "
                             "was changed")


def _holder(fd: int) -> str:
    """The process id the lock file names, once it names a live process: the holder writes
    it just after taking the lock, so a run refused in that instant waits a moment for it."""
    text = ""
    for _ in range(50):
        text = os.pread(fd, 32, 0).decode(errors="replace").strip()
        if text.isdigit():
            try:
                os.kill(int(text), 0)
                return text
            except ProcessLookupError:  # a killed holder's id, about to be replaced
                pass
            except PermissionError:  # alive, another user's
                return text
        time.sleep(0.02)
    return text or "unknown"


class RunLock:
    """`with RunLock(out):` holds the run folder for this process (see the module docstring)."""

    def __init__(self, out: str | os.PathLike):
        self.out = Path(out)
        self._fd: int | None = None
        self._created = False

    def __enter__(self) -> "RunLock":
        self._created = not self.out.exists()
        try:
            self.out.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.out / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise RunFolderError(f"cannot use --out {self.out}: {e.strerror or e}; choose a "
                                 "writable folder") from e
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            holder = _holder(fd)
            os.close(fd)
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise RunFolderError(f"cannot lock --out {self.out}: {e.strerror}") from e
            raise RunFolderError(
                f"--out {self.out} is in use by another run (process {holder}); wait for it "
                "to finish, or choose another --out folder. Nothing was changed") from e
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd
        return self

    def __exit__(self, *exc) -> None:
        fd, self._fd = self._fd, None
        if fd is None:
            return
        leftover = [p.name for p in self.out.iterdir()] if self.out.is_dir() else []
        if self._created and leftover == [LOCK_NAME]:  # refused before writing anything
            os.unlink(self.out / LOCK_NAME)
            self.out.rmdir()
        else:
            os.ftruncate(fd, 0)  # no holder any more; the folder's bytes stay the same
        os.close(fd)  # releases the lock
