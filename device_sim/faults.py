"""Fault injection: a watch loses power, or the OS kills the app, at the worst moment.

Two ways to kill a personalisation, both with SIGKILL (no cleanup, no flush, nothing after it
runs, as a power cut):
  * at a named point in the runtime: EDGETRAIN_FAULT="<point>:<n>" in the environment makes
    the n-th arrival at fault_point(<point>) kill the process. The points sit inside the
    checkpoint and resume-point writes (FAULT_POINTS). Unset, as on a device, a point costs
    one environment lookup.
  * at a random moment from outside: run_until(cmd, delay_s) kills the child after a delay.
"""
from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

ENV = "EDGETRAIN_FAULT"
FAULT_POINTS = (
    "step",  # after an optimizer step, before any resume point of it
    "checkpoint-tmp-written",  # ORT wrote the temporary checkpoint; not yet renamed
    "checkpoint-torn",  # as above, with the temporary file cut to half its bytes first
    "checkpoint-renamed",  # the checkpoint is in place; its state file is not written yet
    "state-tmp-written",  # the state file's temporary is written; not yet renamed
    "state-committed",  # the resume point is complete; older points not yet pruned
)
_arrivals: dict[str, int] = {}


def fault_point(name: str, path: str | os.PathLike | None = None) -> None:
    """Kill this process here if EDGETRAIN_FAULT asks for the current arrival at `name`."""
    spec = os.environ.get(ENV)
    if not spec:
        return
    point, _, nth = spec.partition(":")
    if point != name:
        return
    _arrivals[name] = _arrivals.get(name, 0) + 1
    if _arrivals[name] != int(nth or 1):
        return
    if name == "checkpoint-torn" and path is not None:
        p = Path(path)
        with open(p, "rb+") as f:
            f.truncate(p.stat().st_size // 2)
    os.kill(os.getpid(), signal.SIGKILL)


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
