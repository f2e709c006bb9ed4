"""Named points in the runtime where a simulator may inject a fault (a power cut, a kill).

The runtime only names its points and calls `fault_point(name)` there; it knows nothing of
what a fault is. A simulator (device_sim/faults.py) installs a hook with `install_hook`; with
none installed, as on a device, a point is one global lookup.
"""
from __future__ import annotations

import os
from typing import Callable

FAULT_POINTS = (
    "step",  # after an optimizer step, before any resume point of it
    "checkpoint-tmp-written",  # the temporary checkpoint is written; not yet renamed
    "checkpoint-torn",  # the same moment; the hook receives the temporary file's path
    "checkpoint-renamed",  # the checkpoint is in place; its state file is not written yet
    "state-tmp-written",  # the state file's temporary is written; not yet renamed
    "state-committed",  # the resume point is complete; older points not yet pruned
    "state-rewritten",  # a mask update's temporary state is written, not yet read back
    "file-written",  # any atomic write's temporary is written, not yet renamed; the hook
    # receives the final path (edgetrain/atomicfile.py)
)

Hook = Callable[[str, "os.PathLike | None"], None]
_hook: Hook | None = None


def install_hook(hook: Hook | None) -> None:
    """Call hook(name, path) at every fault point from now on (None: remove it)."""
    global _hook
    _hook = hook


def fault_point(name: str, path: str | os.PathLike | None = None) -> None:
    """A named moment of the runtime; `path` is the file being written there, if any."""
    assert name in FAULT_POINTS, name
    if _hook is not None:
        _hook(name, path)
