"""The selection's saved weights in the run folder (select/): the start every candidate
trains from, the best so far (keep-best, under a new name each time so a committed resume
point never names an overwritten file) and a chosen mix (edgetrain/interpolation.py); each
named in the selection state with its sha256, and checked against it on resume.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from edgetrain import resume as resume_points
from edgetrain.manifest import sha256_file
from edgetrain.selection import Score, record_epoch

SELECT_DIR = "select"  # in the run folder: start (the candidates' weights), best-*, mix


def save_weights(rt, path: Path) -> str:
    """Weights only: a candidate restarts with fresh AdamW moments, made inside the cap."""
    return sha256_file(rt.save_checkpoint(path, optimizer_state=False))


def score_epoch(rt, sel: dict, s: Score, lr: float, epoch: int, path: Path) -> None:
    """Record an epoch's validation score; a new best is saved (keep-best) under a new name,
    so the best a committed resume point names is never overwritten."""
    if record_epoch(sel, s, lr, epoch):
        sel.update(best_file=path.name, best_sha256=save_weights(rt, path))


def prune_best(out: Path, sel_dir: Path) -> None:
    """Delete saved bests that no kept resume point names (resume/ keeps its two newest)."""
    named = set()
    for state in (out / resume_points.RESUME_DIR).glob("state-*.json"):
        try:
            named.add((json.loads(state.read_text()).get("selection") or {}).get("best_file"))
        except ValueError:
            return  # an unreadable state: keep everything
    for p in sel_dir.glob("best-*"):
        if p.name not in named:
            p.unlink(missing_ok=True)


def check_select_files(sel_dir: Path, sel: dict) -> None:
    for name, key in ((sel.get("best_file"), "best_sha256"), ("start", "start_sha256")):
        want = sel.get(key)
        path = sel_dir / str(name)
        if want and (os.path.basename(str(name)) != name or not path.is_file()
                     or path.is_symlink() or sha256_file(path) != want):
            raise resume_points.ResumeError(
                f"{path} is missing or does not match its sha256 in the resume point; the "
                "selection cannot continue. Start the run again in another --out folder")
