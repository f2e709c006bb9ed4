"""Where a fleet task's capped runtime lives: a process of its own, forked per run.

The runtime's memory cap belongs to a process (edgetrain/budget.py: ORT's shared arena is set
once per process), so every personalisation needs a fresh process. Starting a fresh Python
(or a fresh Ray worker, Ray's `max_calls=1`) per run costs more than a short run itself:
about 0.5 CPU-s for Ray's worker start and 0.2 s of imports and data loading, against 0.3 s
of training (bench/fleet.py). So a Ray worker is kept (it never holds a runtime) and each run
is forked from a fork server that the worker starts once (`python -m device_sim.fleetproc`):
  * the server imports numpy, ONNX Runtime's training API and edgetrain, and reads the
    built-in recordings (fleetwarm.py); it never opens a session, allocator or checkpoint,
    so every child starts from a process with no runtime in it;
  * per request (a pickled (target, args) on its stdin) it forks a child that runs
    target(*args) and exits, waits for it, and answers (pid, exit status);
  * the child is the run's process: it registers its own capped arena, trains one user on one
    device, writes the record (with its own pid) and exits;
  * the server dies with its Ray worker, and each child with its server (PR_SET_PDEATHSIG;
    the server also ends at its stdin's end); a child holds its run folder's lock while it
    runs, so a retried task never trains beside an orphan of a killed attempt.
Python's multiprocessing fork server would re-run the parent's main module in every child (a
Ray worker's main: 0.13 s and Ray imported in a run); this one runs nothing but the target.
A child that ends without writing its record (killed, crashed) raises RunProcessDied in the
Ray task, which Ray retries (fleet.py); the retry resumes from the run's resume point.
"""
from __future__ import annotations

import ctypes
import fcntl
import os
import pickle
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path

LOCK = "run.lock"
PR_SET_PDEATHSIG = 1
_server: subprocess.Popen | None = None


class RunProcessDied(RuntimeError):
    """A run's process ended without its record (killed, or crashed): Ray retries the task."""


def die_with_parent() -> None:
    """SIGKILL this process when the process (thread) that started it ends (Linux prctl); if
    it has ended already, end now."""
    parent = os.getppid()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent or parent == 1:
        os._exit(1)


def start_server() -> subprocess.Popen:
    """A new fork server (it serves one run at a time: a caller with runs side by side
    starts one per thread)."""
    return subprocess.Popen([sys.executable, "-m", "device_sim.fleetproc"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)


def server() -> subprocess.Popen:
    """This process's fork server, started at the first run (and again if it died)."""
    global _server
    if _server is None or _server.poll() is not None:
        _server = start_server()
    return _server


def fork_run(target, args: tuple, lock: str | os.PathLike | None = None,
             via: subprocess.Popen | None = None) -> tuple[int, int]:
    """Run target(*args) in a child of the fork server `via` (default: this process's),
    holding the file lock `lock` if given; (the child's pid, its exit status: negative for a
    signal)."""
    s = via or server()
    try:
        pickle.dump((target, args, None if lock is None else str(lock)), s.stdin)
        s.stdin.flush()
        return pickle.load(s.stdout)
    except (BrokenPipeError, EOFError) as e:
        s.kill()
        raise RunProcessDied(f"the fork server {s.pid} ended: {e}") from None


def run_in_child(target, args: tuple, run: str | os.PathLike, done: str | os.PathLike) -> float:
    """Run target(*args) in a fresh child process holding `run`'s lock; its wall time. Raise
    RunProcessDied if it ends without `done` (the record file it writes)."""
    t0 = time.perf_counter()
    Path(run).mkdir(parents=True, exist_ok=True)
    pid, code = fork_run(target, args, Path(run) / LOCK)
    if not Path(done).is_file():
        how = f"killed by signal {-code}" if code < 0 else f"exit status {code}"
        raise RunProcessDied(f"the run's process {pid} ended without a record ({how})")
    return time.perf_counter() - t0


def _child(target, args: tuple, lock: str | None) -> None:
    die_with_parent()
    if lock is None:
        target(*args)
        return
    with open(lock, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)  # an orphan of a killed attempt: wait for its end
        target(*args)


def serve() -> None:
    """The fork server's loop (this module run as a program)."""
    die_with_parent()
    answers = os.fdopen(os.dup(1), "wb")  # the protocol's; prints of runs go to stderr
    os.dup2(2, 1)
    requests = sys.stdin.buffer
    import device_sim.fleetwarm  # noqa: F401  - everything a run needs, loaded once

    while True:
        try:
            target, args, lock = pickle.load(requests)
        except EOFError:  # the worker is gone
            return
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                answers.close()
                _child(target, args, lock)
            except BaseException:  # noqa: BLE001 - reported on stderr; the exit status says
                traceback.print_exc()
                code = 1
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        pickle.dump((pid, os.waitstatus_to_exitcode(status)), answers)
        answers.flush()


if __name__ == "__main__":
    serve()
