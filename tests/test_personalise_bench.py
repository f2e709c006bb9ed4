"""bench/personalise.py's fold artifacts: exported once per export command and committed
code, shared by the recipes of a tier, never reused across code or from uncommitted code."""
from __future__ import annotations

import sys
from pathlib import Path

from conftest import ROOT

sys.path.insert(0, str(ROOT / "bench"))
import personalise  # noqa: E402


def test_a_fold_is_exported_once_per_code_and_never_kept_from_uncommitted_code(
        tmp_path, monkeypatch):
    exports = []

    def fake_run(*args):
        out = args[args.index("--out") + 1]
        exports.append(out)
        (Path(out)).mkdir(parents=True)
        (Path(out) / "manifest.json").write_text("{}")
        return "{}"

    monkeypatch.setattr(personalise, "run", fake_run)
    monkeypatch.setattr(personalise, "FOLDS", tmp_path / "folds")
    code = ["abc1234"]
    monkeypatch.setattr(personalise, "code_commit", lambda: code[0])
    tier, users = personalise.TIERS["mcu-2mb"], (1, 2, 3)
    first = personalise.fold_artifact("hapt", tier, users, tmp_path / "scratch")
    again = personalise.fold_artifact("hapt", tier, users, tmp_path / "scratch")
    assert first == again and len(exports) == 1 and (first / "manifest.json").is_file()
    assert not [p for p in (tmp_path / "folds").iterdir() if p.name.startswith(".export-")]
    other = personalise.fold_artifact("hapt", personalise.TIERS["mcu-1mb"], users,
                                      tmp_path / "scratch")
    assert other != first and len(exports) == 2  # another tier's plan: its own export
    code[0] = "def5678"  # other code: exported again
    assert personalise.fold_artifact("hapt", tier, users, tmp_path / "scratch") != first
    code[0] = "def5678+changes"  # uncommitted code: into the run's scratch folder, every time
    dirty = personalise.fold_artifact("hapt", tier, users, tmp_path / "scratch")
    assert dirty.parent == tmp_path / "scratch" and len(exports) == 4
