"""A watchdog over every call into ONNX Runtime: a call that runs past its bound stops the run.

A native ORT call cannot be interrupted, and the training Module holds Python's GIL while it
runs (measured: a Python thread ticked once in a 48 ms step), so no Python thread or signal
handler of the process itself can act while a step hangs. The watchdog is therefore a small
process of its own, started when a device run enables it: each training step, optimizer step,
side graph and inference call runs inside `guard(what)`, which sends the call's deadline and
name down a pipe to the watchdog. A call still running past its deadline makes the
watchdog write one error line (the call, the bound, what to do) to the run's stderr and kill
the run (SIGKILL: shell status 137, EXIT_STALLED). Resume points are written atomically, so
the work saved before the stall is kept and `--resume` continues from it; the run folder's
lock is an flock, released with the process. The watchdog exits when the run does.

The bound comes from the export's predicted cost of one training step (manifest
`predicted.step_flops`, exporters/predictor/cost.py) at a deliberately slow SECONDS_PER_FLOP, never
below FLOOR_S (a first call also pays for ORT's lazy set-up) and never above CEILING_S (the
manifest is not hashed: a hostile one cannot switch the watchdog off). EDGETRAIN_WATCHDOG_S
sets the bound directly (debugging, tests). The Python API arms no watchdog unless the
process asks (`enable`): stopping means ending the process.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from contextlib import contextmanager

ENV = "EDGETRAIN_WATCHDOG_S"
EXIT_STALLED = 128 + 9  # the shell's status of a process killed by SIGKILL
SECONDS_PER_FLOP = 1e-7  # 10 MFLOP/s: 100x slower than a watch core's float throughput
FLOOR_S, CEILING_S = 60.0, 3600.0
_MAX_NAME = 400  # bytes of a call's name sent to the watchdog


class StalledError(RuntimeError):
    """A device call ran past the watchdog's bound (raised where a parent process learns of a
    child the watchdog stopped, e.g. `measure`)."""


def bound_s(step_flops: int | None, batch_ratio: float = 1.0) -> float:
    """The watchdog's bound for one call: the predicted step at SECONDS_PER_FLOP, within
    [FLOOR_S, CEILING_S]; EDGETRAIN_WATCHDOG_S, if set, instead."""
    if os.environ.get(ENV):
        return float(os.environ[ENV])
    predicted = (step_flops or 0) * max(batch_ratio, 1.0) * SECONDS_PER_FLOP
    return min(CEILING_S, max(FLOOR_S, predicted))


STALLED = "ran for more than"  # how a stall's error line reads (device_sim/measure.py)


def stall_message(what: str, bound: float) -> str:
    return (f"error: {what} {STALLED} {bound:,.3g} s, the watchdog's bound "
            f"({SECONDS_PER_FLOP:g} s per predicted FLOP of a step, at least {FLOOR_S:.0f} s): "
            "the graph does far more work than the export predicted, or the device is "
            f"starved. The run was stopped (status {EXIT_STALLED}); resume points already "
            "saved are kept (run again with --resume)\n")


_WATCH = f"""
import os, select, sys, time
sys.path.insert(0, {os.path.dirname(os.path.dirname(os.path.abspath(__file__)))!r})
from edgetrain.watchdog import stall_message
parent, commands, err = (int(a) for a in sys.argv[1:4])
deadline, bound, what, buf = None, 0.0, "", b""
while os.getppid() == parent:
    wait = 1.0 if deadline is None else min(1.0, max(0.0, deadline - time.monotonic()))
    if select.select([commands], [], [], wait)[0]:
        chunk = os.read(commands, 1 << 16)
        if not chunk:  # the run ended
            break
        *lines, buf = (buf + chunk).split(b"\\n")
        for line in lines:  # "A <deadline> <bound> <name>" arms, "D" disarms
            if line.startswith(b"A "):
                d, b, name = line[2:].split(b" ", 2)
                deadline, bound, what = float(d), float(b), name.decode("utf-8", "replace")
            else:
                deadline = None
    elif deadline is not None and time.monotonic() > deadline:
        os.write(err, stall_message(what, bound).encode())
        os.kill(parent, 9)
        break
"""


class Watchdog:
    """The watchdog process and the pipe that tells it each call; `guard` arms it for one
    call (two short writes to a pipe: no file, so a full disk or a file-size limit cannot
    stop it)."""

    def __init__(self, bound: float):
        self.bound_s = float(bound)
        read, self._write = os.pipe()
        try:  # where the run's own messages go (fd 2 may be capturing ORT's arena log)
            err = sys.stderr.fileno()
        except (AttributeError, ValueError, OSError):
            err = 2
        self._process = subprocess.Popen(
            [sys.executable, "-c", _WATCH, str(os.getpid()), str(read), str(err)],
            pass_fds=(read, err), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        os.close(read)

    def _tell(self, line: bytes) -> None:
        try:
            os.write(self._write, line)
        except OSError:  # the watchdog is gone (killed from outside): the run goes on
            pass

    @contextmanager
    def guard(self, what: str):
        name = what.replace("\n", " ").encode("utf-8")[:_MAX_NAME]
        deadline = time.monotonic() + self.bound_s
        self._tell(f"A {deadline!r} {self.bound_s!r} ".encode() + name + b"\n")
        try:
            yield
        finally:
            self._tell(b"D\n")


_ENABLED = False
_ARMED: Watchdog | None = None


def enable() -> None:
    """Let the watchdog end this process (the CLI's device runs and measurement children)."""
    global _ENABLED
    _ENABLED = True


def set_bound(bound: float) -> None:
    """Arm the watchdog with this bound, if the process enabled it; else do nothing."""
    global _ARMED
    if not _ENABLED:
        return
    if _ARMED is None:
        _ARMED = Watchdog(bound)
    _ARMED.bound_s = float(bound)


@contextmanager
def guard(what: str):
    """Run the body under the armed watchdog (no watchdog armed: just run it)."""
    if _ARMED is None:
        yield
        return
    with _ARMED.guard(what):
        yield
