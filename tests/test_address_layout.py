"""A device command re-executes itself without address randomisation, unless its parent
already started it so (bench/all.py fixes the layout once for every command it runs)."""
from __future__ import annotations

import sys

import pytest

from conftest import device_python

CHILD = ("import json, os, device_sim.layout as l; l.reexec_with_fixed_layout(); "
         "print(json.dumps([os.environ.get(l.ENV), l.layout_is_fixed()]))")


def started(parent_fixes: bool) -> list:
    return device_python(f"""
import ctypes, subprocess, sys
from device_sim.layout import ADDR_NO_RANDOMIZE, fix_address_layout
if {parent_fixes!r}:
    assert fix_address_layout()
else:  # randomisation on, whatever this test process was started with
    libc = ctypes.CDLL(None)
    now = libc.personality(ctypes.c_ulong(0xFFFFFFFF))
    libc.personality(ctypes.c_ulong(now & ~ADDR_NO_RANDOMIZE))
p = subprocess.run([sys.executable, "-c", {CHILD!r}], capture_output=True, text=True)
print(p.stdout.strip().splitlines()[-1])
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="personality(2) is Linux's")
def test_a_command_re_executes_only_when_its_parent_left_randomisation_on():
    assert started(parent_fixes=False) == ["1", True]  # started again, fixed
    assert started(parent_fixes=True) == [None, True]  # fixed from the start: no second start
