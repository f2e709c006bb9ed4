"""The peak bytes of this very run, from ONNX Runtime's allocator (`personalise` reports it).

ONNX Runtime 1.19 has no allocator-statistics API for Python (one came in 1.22), but its
arena logs every growth at INFO level on the process's stderr (edgetrain/arenalog.py reads
such a log). While a run lasts, file descriptor 2 is a nameless temporary file (on disk, not
in memory; gone when the process ends, even when killed); Python's own stderr (progress bars,
messages) is pointed at the real stderr for that time, so it is never captured. Phase marks
are written to the file, after whatever ORT wrote before them. At the end the file's arena
lines give the peak (the same figure `edgetrain measure` gives, for the run as it happened),
and ORT's error lines, and any line that is not ORT's, are passed on to the real stderr: its
info and warning lines are not, as outside a capture (the default logger's severity is ERROR
there). The eval session's graph optimiser warns of every constant it folds away, about 30
lines a run on the patch MobileNet, which reached the demo's output.

Not a pipe read by a thread: ORT writes its log while the calling Python thread holds the
GIL, so a reader thread could never drain a full pipe (a deadlock, seen on the patch
MobileNet's runs).
"""
from __future__ import annotations

import os
import sys
import tempfile

from edgetrain.arenalog import MARK, ArenaLogParser

_KEEP = ("bfc_arena.cc",)  # ORT's arena lines: growth, totals, reservations
_QUIET = ("[V:onnxruntime", "[I:onnxruntime", "[W:onnxruntime")  # below ERROR


def passed_on(line: str) -> bool:
    """Whether a line written to fd 2 during a capture (not an arena line) reaches the real
    stderr: ORT's errors and anything not ORT's do; its verbose, info and warning lines not."""
    return bool(line.strip()) and not any(q in line for q in _QUIET)


class ArenaCapture:
    def __init__(self, ort):
        self._ort = ort
        self._parser = ArenaLogParser()  # fed line by line: the log is never held whole
        self._log = None
        self._lost = False  # a write to the log failed: no peak is claimed

    def mark(self, phase: str) -> None:
        """Start of a phase of the run (what the bytes after it are attributed to)."""
        if self._log is not None and not self._lost:
            try:
                os.write(2, f"\n{MARK}{phase}\n".encode())
            except OSError:  # a full disk: the log is incomplete, the run goes on without it
                self._lost = True

    def peak_bytes(self) -> int | None:
        """The training working set's peak (env arena high-water + outside chunks); after
        the capture has ended."""
        if not self._parser.lines or self._lost:
            return None
        arena, outside, _ = self._parser.result()
        return arena + outside

    def __enter__(self) -> "ArenaCapture":
        sys.stderr.flush()
        self._real = os.dup(2)
        self._py_stderr = sys.stderr
        sys.stderr = os.fdopen(os.dup(self._real), "w", buffering=1, encoding="utf-8",
                               errors="replace")
        self._log = tempfile.TemporaryFile()
        os.dup2(self._log.fileno(), 2)
        self._ort.set_default_logger_severity(1)  # INFO: the arena's growth lines
        return self

    def __exit__(self, *exc) -> None:
        self._ort.set_default_logger_severity(3)
        sys.stderr.flush()
        os.dup2(self._real, 2)
        sys.stderr.close()
        sys.stderr = self._py_stderr
        os.close(self._real)
        log, self._log = self._log, None
        log.seek(0)
        with log:
            for raw in log:
                line = raw.decode("utf-8", "replace").rstrip("\n")
                if line.startswith(MARK) or any(k in line for k in _KEEP):
                    self._parser.feed(line)
                elif passed_on(line):
                    sys.stderr.write(line + "\n")  # ORT's errors still show
