"""Every command block of README.md and docs/quickstart.md runs as written, in order, each doc
in its own fresh clone of this repository (a new user's journey), with the quick settings the README documents (QUICK below).
A command fails the test if it exits other than the doc says (0 unless `# exits N`).

What the harness does itself: the clone (quickstart's `git clone <this repo> && cd edgetrain`
line), and the clone's `.venv` is a link to the venv running the tests, which `make setup`
then finds installed (its stamp is pyproject.toml's hash), so nothing is downloaded.
`make check-readme` runs this test alone."""
from __future__ import annotations

import hashlib
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT
from docblocks import blocks, commands

DOCS = ("README.md", "docs/quickstart.md")
# The quick settings (documented in the README): pretraining skipped (untrained weights),
# one personalisation epoch at one learning rate, and `make test` only collects (it is the
# command running this test).
QUICK = {"EDGETRAIN_EXPORT_EPOCHS": "0", "EDGETRAIN_PERSONALISE_EPOCHS": "1",
         "EDGETRAIN_PERSONALISE_LR_GRID": "3e-4",
         "PYTEST_ADDOPTS": "--collect-only -q"}
HARNESS_STEPS = ("git clone ",)  # done by the harness: it is the fresh clone
TIMEOUT_S = 1500
FAIL = 97  # the script's exit status when a command exits unexpectedly


def script(doc: str) -> tuple[str, list[str]]:
    """One bash script running every block of `doc` in order, and the commands it runs."""
    lines, shown = ["set -u"], []
    for block in blocks(ROOT / doc):
        where = f"{doc}:{block.line}"
        if block.lang == "python":
            shown.append(f"{where} python block")
            lines += [_announce(shown[-1]), ".venv/bin/python - <<'EDGETRAIN_DOCS_PY'",
                      block.text.rstrip(), "EDGETRAIN_DOCS_PY", _check(0, shown[-1])]
        elif block.is_shell:
            for cmd in commands(block):
                if cmd.line.startswith(HARNESS_STEPS):
                    continue
                shown.append(f"{where} $ {cmd.line}")
                lines += [_announce(shown[-1]), cmd.line, _check(cmd.expected_exit, shown[-1])]
    return "\n".join(lines) + "\n", shown


def _announce(shown: str) -> str:
    return f"printf '%s  [at %d s]\\n' {shlex.quote('>>> ' + shown)} \"$SECONDS\""


def _check(expected: int, shown: str) -> str:
    return (f'rc=$?; if [ $rc -ne {expected} ]; then echo "EXITED $rc (expected {expected}): "'
            f"{shlex.quote(shown)}; exit {FAIL}; fi")


def test_docs_name_their_quick_settings():
    readme = (ROOT / "README.md").read_text()
    for name, value in QUICK.items():
        assert f"{name}={value}" in readme or f"{name}='{value}'" in readme, name


@pytest.mark.slow
@pytest.mark.parametrize("doc", DOCS)
def test_every_block_runs_in_a_fresh_clone(tmp_path, doc):
    venv = Path(sys.prefix)
    stamp = venv / ".installed"
    if not stamp.is_file():
        pytest.skip(f"the tests run outside a venv made by `make setup` ({venv})")
    want = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()
    assert stamp.read_text().strip() == want, "pyproject.toml changed since `make setup`: run it"
    clone = tmp_path / "edgetrain"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    (clone / ".venv").symlink_to(venv)
    text, shown = script(doc)
    assert len(shown) >= 5
    path = [p for p in os.environ.get("PATH", "").split(os.pathsep)
            if Path(p).resolve() != (venv / "bin").resolve()]  # the docs must activate it
    env = {**{k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}, **QUICK,
           "PATH": os.pathsep.join(path)}
    t0 = time.monotonic()
    proc = subprocess.run(["bash", "-c", text], cwd=clone, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=TIMEOUT_S)
    out = proc.stdout
    assert proc.returncode == 0, (
        f"exit {proc.returncode} after {time.monotonic() - t0:.0f} s:\n{out[-6000:]}")
    ran = [s for s in shown if f">>> {s}" in proc.stdout]
    assert ran == shown, f"not every command ran: {set(shown) - set(ran)}"
