"""`edgetrain` commands forked from a warm process, for callers that run thousands of short
device commands (the personalisation benches: about 2,000 runs of one to three seconds).

A command run as `python -m edgetrain.cli` spends about 0.6 s importing numpy, ONNX Runtime's
training API, the CLI and the command's modules before it does anything. Here each calling
thread keeps a fork server (device_sim/fleetproc.py: it imports those once and never opens a
session, allocator or checkpoint) and each command runs in a fresh child forked from it: its
own process, its own capped arena (ORT's shared arena is set once per process), the CLI's own
code from its arguments on, its stdout and stderr captured, its exit status returned. The
server starts without address randomisation (device_sim/layout.py), so its children have the
fixed layout the CLI would re-execute itself to get.
"""
from __future__ import annotations

import os
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

import edgetrain.personalise  # noqa: F401  - what `personalise` imports when it runs
import edgetrain.userdata  # noqa: F401
from device_sim.fleetproc import fork_run, start_server
from device_sim.layout import fix_address_layout
from edgetrain.cli import main

# The server unpickles `command` by importing this module: from its first command on, it
# holds the CLI and the modules above, and every child starts with them.

_servers = threading.local()


@dataclass(frozen=True)
class Finished:
    returncode: int
    stdout: str
    stderr: str


def command(argv: list[str], out: str, err: str) -> None:
    """In the forked child: `edgetrain ARGV` with stdout and stderr to the files `out` and
    `err`; the process ends with the command's exit status."""
    for fd, path in ((1, out), (2, err)):
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), fd)
    try:
        main(args=list(argv), prog_name="edgetrain")
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def server_pid() -> int | None:
    """This thread's fork server's pid (None before the thread's first command)."""
    s = getattr(_servers, "server", None)
    return None if s is None else s.pid


def run(*argv: str) -> Finished:
    """Run `edgetrain ARGV` in a child of this thread's fork server (started at the thread's
    first command, and again if it died), from the current directory."""
    s = getattr(_servers, "server", None)
    if s is None or s.poll() is not None:
        fix_address_layout()  # for the server and every child it forks
        s = _servers.server = start_server()
    with tempfile.TemporaryDirectory(prefix="warmcli-") as tmp:
        out, err = Path(tmp) / "stdout", Path(tmp) / "stderr"
        _, code = fork_run(command, (list(argv), str(out), str(err)), via=s)
        read = (lambda p: p.read_text() if p.is_file() else "")
        return Finished(code, read(out), read(err))
