"""Fault injection: a watch loses power, or the OS kills the app, at the worst moment.

Two ways to kill a personalisation, both with SIGKILL (no cleanup, no flush, nothing after it
runs, as a power cut):
  * at a named point of the runtime (edgetrain.faultpoints.FAULT_POINTS):
    EDGETRAIN_FAULT="<point>:<n>" in the environment of an `edgetrain` process makes the n-th
    arrival at that point kill the process. The CLI installs `kill_at` as the runtime's
    fault hook when the variable is set; the runtime itself never reads it.
    At "checkpoint-torn" the temporary checkpoint is first cut to half its bytes.
  * at a random moment from outside: run_until(cmd, delay_s) kills the child after a delay.
"<point>:<n>:TERM" (or INT) sends SIGTERM (SIGINT) there instead: the OS asking the app to stop.
"<point>:<n>:ENOSPC" (or EROFS, EIO, EACCES) makes the write at that point fail with that
error instead: a full disk, a read-only folder. "file-written=<name>" counts only the atomic
writes of files called <name> (e.g. "file-written=inference.onnx:1:ENOSPC").
"""
from __future__ import annotations

import errno
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from edgetrain.faultpoints import FAULT_POINTS, install_hook

ENV = "EDGETRAIN_FAULT"
IO_ERRORS = ("ENOSPC", "EROFS", "EIO", "EACCES")
__all__ = ["ENV", "FAULT_POINTS", "install_from_env", "kill_at", "run_until", "RunOutcome"]


def kill_at(spec: str, pid: int | None = None, then_wait_s: float = 0.0):
    """A fault hook that SIGKILLs this process at the n-th arrival at a point ("point:n"), or
    sends it another signal there ("point:n:TERM", "point:n:INT": the OS asking it to stop).
    pid: signal that process instead (its parent, say), then wait up to then_wait_s for this
    one to be taken down with it."""
    point, _, rest = spec.partition(":")
    point, _, only = point.partition("=")
    nth, _, signame = rest.partition(":")
    error = getattr(errno, signame, None) if signame in IO_ERRORS else None
    sig = getattr(signal, f"SIG{signame}", None) if signame else signal.SIGKILL
    if sig is None and error is None:
        raise ValueError(f"{ENV}={spec!r} names no signal or error {signame!r}; use TERM, INT "
                         f"or one of {IO_ERRORS}")
    if point not in FAULT_POINTS:
        raise ValueError(f"{ENV}={spec!r} names no fault point; choose one of {FAULT_POINTS}")
    target, arrivals = int(nth or 1), 0

    def hook(name: str, path) -> None:
        nonlocal arrivals
        if name != point or (only and (path is None or Path(path).name != only)):
            return
        arrivals += 1
        if arrivals != target:
            return
        if error is not None:
            raise OSError(error, os.strerror(error))
        if name == "checkpoint-torn" and path is not None:
            p = Path(path)
            with open(p, "rb+") as f:
                f.truncate(p.stat().st_size // 2)
        os.kill(os.getpid() if pid is None else pid, sig)
        if pid is not None:
            time.sleep(then_wait_s)
    return hook


def install_from_env(environ=os.environ) -> bool:
    """Install kill_at(EDGETRAIN_FAULT) as the runtime's fault hook if the variable is set."""
    spec = environ.get(ENV)
    if spec:
        install_hook(kill_at(spec))
    return bool(spec)


@dataclass(frozen=True)
class RunOutcome:
    returncode: int  # -9 when killed
    killed: bool
    stdout: str
    stderr: str


def run_until(cmd: list[str], delay_s: float | None, env: dict | None = None,
              cwd: str | None = None, timeout_s: float = 300) -> RunOutcome:
    """Run cmd; SIGKILL it after delay_s seconds if it is still running (None: never)."""
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=env, cwd=cwd)
    killed = False
    if delay_s is not None:
        deadline = time.monotonic() + delay_s
        while p.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        if p.poll() is None:
            p.send_signal(signal.SIGKILL)
            killed = True
    out, err = p.communicate(timeout=timeout_s)
    return RunOutcome(p.returncode, killed or p.returncode == -signal.SIGKILL, out, err)
