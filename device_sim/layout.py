"""A fixed address layout for the simulated watch's processes, so that memory is repeatable.

ONNX Runtime's arena breaks ties between equally good free chunks by their address. With the
address space randomised (ASLR), the same training step can fragment differently and peak a
few KB apart from one run to the next (seen on a mixture-of-experts transformer: 416,840 or
429,128 bytes). A watch app's allocator sees one layout; the simulator fixes it too: the
measurement child starts without randomisation, and so do the CLI's device commands, so a
budget equal to a measured peak holds for the run it was measured for. Linux only; elsewhere
nothing changes and peaks may vary by a few KB.
"""
from __future__ import annotations

import ctypes
import os
import sys

ADDR_NO_RANDOMIZE = 0x0040000  # linux/personality.h
ENV = "EDGETRAIN_FIXED_LAYOUT"


def _personality():
    """(libc, this process's personality), or None where Linux's personality(2) is missing."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None)
        return libc, libc.personality(ctypes.c_ulong(0xFFFFFFFF))  # 0xFFFFFFFF: only query
    except (OSError, AttributeError):
        return None


def fix_address_layout() -> bool:
    """Turn address randomisation off for programs this process starts from now on (and
    for itself after an exec). Returns False where that is not possible."""
    got = _personality()
    if got is None:
        return False
    libc, current = got
    return libc.personality(ctypes.c_ulong(current | ADDR_NO_RANDOMIZE)) != -1


def layout_is_fixed() -> bool:
    """Whether this process started without address randomisation (the personality is
    inherited: a parent that fixed it started this process so)."""
    got = _personality()
    return got is not None and bool(got[1] & ADDR_NO_RANDOMIZE)


def reexec_with_fixed_layout() -> None:
    """Start this very command again without address randomisation (once: the environment
    marks the second start). Same pid, arguments and environment. A process its parent
    already started without randomisation (a bench that fixed it for every command it
    runs) goes on as it is: it has the layout a second start would give it."""
    if os.environ.get(ENV) or layout_is_fixed() or not fix_address_layout():
        return
    os.environ[ENV] = "1"
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, sys.orig_argv)
