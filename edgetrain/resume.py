"""Resume points: a personalisation's checkpoint and its position, safe against power loss.

A resume point is two files in the run folder's `resume/` directory:
  ckpt-<steps>        ORT checkpoint: parameters, AdamW moments and step count, mask positions
  state-<steps>.json  ResumeState below: the step counters, where in the data the run is, both
                      random generators' states, and the checkpoint's size and sha256
Each is written to a temporary file, flushed to disk, then renamed (a rename is atomic), the
checkpoint first. A state file therefore only ever names a checkpoint that is complete, and
its hash proves it. A crash at any moment leaves the previous resume point whole: `latest`
takes the newest state whose checkpoint checks out, skipping anything torn. The two newest
points are kept; older ones are deleted once a newer one is committed.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edgetrain.faultpoints import fault_point
from edgetrain.atomicfile import atomic_write
from edgetrain.manifest import MANIFEST_NAME, sha256_file
from edgetrain.samples import blocks

RESUME_DIR = "resume"
SCHEMA = 2  # 2: the data order is edgetrain/shuffle.py's
KEEP = 2  # resume points kept on disk
# a state file is a few kilobytes (settings, hashes, generator states, one character a test
# window): a larger one is not read (a damaged or hostile one would be parsed whole)
MAX_STATE_BYTES = 4 << 20
_STATE = re.compile(r"^state-(\d{8})\.json$")


class ResumeError(ValueError):
    """A run folder cannot be resumed (none, another artifact or data, unreadable)."""


class NoIntactPoint(ResumeError):
    """Resume points exist, but every one is damaged."""


@dataclass(frozen=True)
class ResumeState:
    schema: int
    artifact_manifest_sha256: str  # which artifact trained this checkpoint
    run_sha256: str  # the training config and the user's data, hashed (run_fingerprint)
    steps: int  # optimizer steps done
    total_steps: int
    epoch: int  # the epoch the next step belongs to
    step_in_epoch: int  # steps of that epoch already done
    epoch_rng_state: dict  # data-order generator at the start of `epoch` (draws its order)
    mask_rng_state: dict  # mask-update generator now
    mask_updates: int
    regrown_weights: int
    accuracy_before: float | None  # measured when the run started
    checkpoint: str  # file name in resume/
    checkpoint_bytes: int
    checkpoint_sha256: str
    # on-device selection (edgetrain/trainloop.py): the candidate being trained, the scores,
    # the best so far, and the sha256 of select/start and select/best; None without selection
    selection: dict | None = None
    run_settings: dict | None = None  # what run_sha256 hashes, readable (run_settings)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def problem(self) -> str | None:
        """What makes the state unusable whatever its hashes say (a damaged or hostile file:
        a negative epoch would loop for ever), or None. Kinds and ranges of what is read."""
        counts = {k: getattr(self, k) for k in ("schema", "steps", "total_steps", "epoch",
                                                 "step_in_epoch", "mask_updates",
                                                 "regrown_weights", "checkpoint_bytes")}
        for k, v in counts.items():
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                return f"{k} is {repr(v)[:40]}, not a whole number >= 0"
        if self.steps > self.total_steps or self.epoch > self.total_steps + 1:
            return f"steps {self.steps} / epoch {self.epoch} lie beyond its {self.total_steps}"
        if self.accuracy_before is not None and not (
                isinstance(self.accuracy_before, (int, float))
                and not isinstance(self.accuracy_before, bool)
                and 0.0 <= self.accuracy_before <= 1.0):
            return f"accuracy_before is {repr(self.accuracy_before)[:40]}, not in [0, 1]"
        for k in ("epoch_rng_state", "mask_rng_state", "selection", "run_settings"):
            v = getattr(self, k)
            if not isinstance(v, dict) and not (v is None and k in ("selection", "run_settings")):
                return f"{k} is not an object"
        for k in ("artifact_manifest_sha256", "run_sha256", "checkpoint", "checkpoint_sha256"):
            if not isinstance(getattr(self, k), str):
                return f"{k} is not a string"
        return None if self.selection is None else selection_problem(self.selection)


def selection_problem(sel: dict) -> str | None:
    """What is wrong with a resume point's selection state (edgetrain/trainloop.py), or None:
    the counters whole numbers, the scores (population, start, best) all there together, each
    with whole-number counts and a numeric loss."""
    for k in ("candidate", "since_best"):
        if not isinstance(sel.get(k), int) or isinstance(sel.get(k), bool) or sel[k] < 0:
            return f"selection.{k} is {repr(sel.get(k))[:40]}, not a whole number >= 0"
    if not isinstance(sel.get("history"), list):
        return "selection.history is not a list"
    scores = [k for k in ("population", "start", "best") if k in sel]
    if scores and len(scores) != 3:
        return f"selection holds {scores} of its three scores (population, start, best)"
    for k in scores:
        v = sel[k]
        if not (isinstance(v, dict) and all(isinstance(v.get(f), int) and not isinstance(
                v.get(f), bool) for f in ("correct", "windows")) and isinstance(
                v.get("loss"), (int, float)) and not isinstance(v.get("loss"), bool)):
            return f"selection.{k} is not a score (correct, windows, loss)"
    return None


def artifact_sha256(artifact: str | os.PathLike) -> str:
    return sha256_file(Path(artifact) / MANIFEST_NAME)


def data_sha256(*arrays) -> str:
    """sha256 of arrays (or SampleArrays), dtype, shape and bytes, a block at a time."""
    h = hashlib.sha256()
    for a in arrays:
        h.update(str((np.dtype(a.dtype), tuple(a.shape))).encode())
        for _, block in blocks(a):
            h.update(np.ascontiguousarray(block).tobytes())
    return h.hexdigest()


def run_settings(config: dict, x, y, checked: tuple = ()) -> dict:
    """What determines a run besides the artifact, readable: the options (with the thread
    count, which changes ORT's sums), and the sha256 of the training data and of the data it
    is checked on (validation and test), byte for byte."""
    return {"options": json.loads(json.dumps(config, sort_keys=True, default=str)),
            "training data": data_sha256(x, y), "validation and test data": data_sha256(*checked)}


def run_fingerprint(settings: dict) -> str:
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()


def differences(before: dict | None, now: dict) -> str:
    """What differs between the settings a run started with and these, in words."""
    if before is None:
        return "the run folder is from an older edgetrain, which did not record its settings"
    said = [f"--{k.replace('_', '-')}: {before['options'].get(k)!r} then, {v!r} now"
            for k, v in now["options"].items() if before["options"].get(k) != v]
    said += [f"{k} (another file)" for k in ("training data", "validation and test data")
             if before.get(k) != now[k]]
    return "; ".join(said) or "nothing recorded differs"


def has_progress(run: str | os.PathLike) -> bool:
    d = Path(run) / RESUME_DIR
    return d.is_dir() and any(_STATE.match(p.name) for p in d.iterdir())


def commit(run: str | os.PathLike, save_checkpoint, state: dict) -> ResumeState:
    """Write a resume point: save_checkpoint(path) writes the checkpoint atomically, then the
    state naming it (with its size and hash) is written atomically; old points are pruned."""
    d = Path(run) / RESUME_DIR
    d.mkdir(parents=True, exist_ok=True)
    name = f"ckpt-{state['steps']:08d}"
    ckpt = Path(save_checkpoint(d / name))
    fault_point("checkpoint-renamed")
    rs = ResumeState(schema=SCHEMA, checkpoint=name, checkpoint_bytes=ckpt.stat().st_size,
                     checkpoint_sha256=sha256_file(ckpt), **state)
    with atomic_write(d / f"state-{rs.steps:08d}.json") as tmp:
        tmp.write_bytes(json.dumps(rs.to_dict(), indent=1).encode())
        fault_point("state-tmp-written")
    fault_point("state-committed")
    _prune(d)
    return rs


def _prune(d: Path) -> None:
    steps = sorted((int(m.group(1)) for p in d.iterdir() if (m := _STATE.match(p.name))),
                   reverse=True)
    for s in steps[KEEP:]:
        (d / f"state-{s:08d}.json").unlink(missing_ok=True)  # the state first: never a
        (d / f"ckpt-{s:08d}").unlink(missing_ok=True)  # state without its checkpoint
    for p in d.iterdir():  # checkpoints no state names (a crash between the two writes)
        if p.name.startswith("ckpt-") and not (d / f"state-{p.name[5:]}.json").exists():
            p.unlink(missing_ok=True)


def clean_temporaries(run: str | os.PathLike) -> list[str]:
    """Delete half-written temporary files a killed run left behind (atomicfile's
    `.<name>.tmp-<pid>-<thread>`, in the run folder, resume/ and select/); returns their names.
    Called with the run folder's lock held, so no live writer owns them."""
    gone = []
    for d in (Path(run), Path(run) / RESUME_DIR, Path(run) / "select"):
        if d.is_dir():
            for p in d.iterdir():
                if p.name.startswith(".") and ".tmp-" in p.name and p.is_file():
                    p.unlink(missing_ok=True)
                    gone.append(p.name)
    return gone


def set_aside_damaged(run: str | os.PathLike) -> Path:
    """Move every resume point of a folder where none is intact into resume/damaged-<n>/
    (kept, never deleted), so the run can start again; returns that folder."""
    d = Path(run) / RESUME_DIR
    n = 1 + sum(1 for p in d.iterdir() if p.name.startswith("damaged-"))
    aside = d / f"damaged-{n}"
    aside.mkdir()
    for p in d.iterdir():
        if p.is_file() or p.is_symlink():
            p.rename(aside / p.name)
    return aside


def latest(run: str | os.PathLike) -> tuple[ResumeState, Path, list[str]]:
    """The newest intact resume point: (state, checkpoint path, reasons others were skipped)."""
    d = Path(run) / RESUME_DIR
    if not d.is_dir():
        raise ResumeError(f"{run} has no resume points ({d} does not exist); start the run "
                          "without --resume")
    skipped = []
    names = sorted((p.name for p in d.iterdir() if _STATE.match(p.name)), reverse=True)
    for name in names:
        state = d / name
        if state.is_symlink() or not state.is_file():
            skipped.append(f"{name}: not a regular file of the run folder")
            continue
        if state.stat().st_size > MAX_STATE_BYTES:
            skipped.append(f"{name}: {state.stat().st_size:,} bytes, more than a resume "
                           f"point's {MAX_STATE_BYTES:,}")
            continue
        try:
            rs = ResumeState(**json.loads(state.read_bytes()[:MAX_STATE_BYTES]))
        except (ValueError, TypeError, RecursionError) as e:
            skipped.append(f"{name}: unreadable ({str(e)[:200]})")
            continue
        ckpt = d / str(rs.checkpoint)
        if rs.problem():
            skipped.append(f"{name}: {rs.problem()}")
        elif rs.schema != SCHEMA:
            skipped.append(f"{name}: schema {rs.schema}, this runtime reads {SCHEMA}")
        elif (os.path.basename(str(rs.checkpoint)) != rs.checkpoint
              or rs.checkpoint in ("", ".", "..") or ckpt.is_symlink()):
            skipped.append(f"{name}: its checkpoint {rs.checkpoint!r} is not a file of "
                           "the run folder")
        elif os.path.lexists(ckpt.with_name(ckpt.name + ".data")):
            skipped.append(f"{name}: {rs.checkpoint}.data beside it is not covered by its hash")
        elif not ckpt.is_file():
            skipped.append(f"{name}: its checkpoint {rs.checkpoint} is missing")
        elif ckpt.stat().st_size != rs.checkpoint_bytes:
            skipped.append(f"{name}: {rs.checkpoint} is {ckpt.stat().st_size} bytes, "
                           f"expected {rs.checkpoint_bytes}")
        elif sha256_file(ckpt) != rs.checkpoint_sha256:
            skipped.append(f"{name}: {rs.checkpoint} does not match its sha256")
        else:
            return rs, ckpt, skipped
    raise NoIntactPoint(f"no intact resume point in {d} "
                        f"({'; '.join(skipped) or 'none written'})")
