"""Issue 38: what a newcomer trips on. The README's Python blocks run from the folder above a
clone named edgetrain/ (which a namespace package lookup would mistake for the package)."""
from __future__ import annotations

import os
import re
import subprocess
import sys

from conftest import ROOT


def test_the_readmes_python_runs_from_the_folder_above_a_clone(tmp_path):
    subprocess.run(["git", "clone", "-q", str(ROOT), str(tmp_path / "edgetrain")], check=True)
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    assert len(blocks) >= 2
    (tmp_path / "tour.py").write_text("\n".join(blocks))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # as a user's shell
    p = subprocess.run([sys.executable, "tour.py"], cwd=tmp_path, capture_output=True,
                       text=True, timeout=900, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    assert (tmp_path / "artifacts" / "mine" / "manifest.json").is_file()
