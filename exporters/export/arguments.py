"""export_artifact's arguments, checked before any work: each refusal says what was given,
the value, and what to pass instead (the CLI checks its own options; these reach the Python
API as they are)."""
from __future__ import annotations

import glob
import math
import os
import shutil
import tempfile
from pathlib import Path

import torch

from edgetrain import names
from edgetrain.atomicfile import pid_alive
from edgetrain.targets import DEFAULT_TARGET, get_target
from edgetrain.manifest import ArtifactError, load_manifest

LAYOUT_LETTERS = "CHWTF"  # channels, image rows and columns, time, features (docs/byom.md)


def check_export_arguments(example_input, out: Path, classes, lr, layout: str | None) -> None:
    if not isinstance(example_input, torch.Tensor):
        raise TypeError(f"example_input is a {type(example_input).__name__}; pass a torch "
                        "tensor of one batch, [B, *sample_shape], e.g. torch.zeros(2, 6, 200)")
    if example_input.dtype != torch.float32 or example_input.dim() < 2:
        raise ValueError(f"example_input is {example_input.dtype} of shape "
                         f"{list(example_input.shape)}; pass float32 [B, *sample_shape] (the "
                         "device feeds float32 samples): e.g. torch.zeros(2, 6, 200)")
    if isinstance(classes, (str, bytes)) or not all(isinstance(c, str) and c for c in classes):
        raise ValueError(f"classes is {classes!r}; pass a list of class names, one non-empty "
                         "string per logit, e.g. ['rest', 'walk', 'run']")
    repeated = sorted({c for c in classes if list(classes).count(c) > 1})
    if repeated:
        raise ValueError(f"class names {repeated} are given more than once; each logit needs "
                         "its own name")
    if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not math.isfinite(lr) \
            or lr <= 0:
        raise ValueError(f"lr is {lr!r}; the on-device learning rate must be a finite number "
                         "above 0, e.g. 1e-3")
    if layout and (set(layout) - set(LAYOUT_LETTERS) or len(set(layout)) != len(layout)):
        raise ValueError(f"layout {layout!r} must name each axis of a sample once, with the "
                         f"letters {', '.join(LAYOUT_LETTERS)} (channels, image rows, columns, "
                         "time, features): e.g. 'CT' for [channels, time]")
    if layout and len(layout) != example_input.dim() - 1:
        raise ValueError(f"layout {layout!r} names {len(layout)} axes; a sample of "
                         f"example_input is {list(example_input.shape[1:])}, "
                         f"{example_input.dim() - 1} axes: name each once")
    if out.exists() and not out.is_dir():
        raise ValueError(f"{out} exists and is a file; choose another out folder (nothing was "
                         "written)")
    if out.is_dir() and any(out.iterdir()):  # checked again when the export replaces it
        check_replaceable(out)


def check_replaceable(out: Path) -> None:
    """ValueError unless `out` is an edgetrain artifact an export may replace: its manifest
    parses as ours and the folder holds exactly the manifest's files, nothing else, so a
    replacement deletes nothing it did not write."""
    try:
        m = load_manifest(out, verify=False)
    except ArtifactError as e:
        raise ValueError(f"{out} exists and is not an edgetrain artifact ({e}); choose another "
                         "--out folder, or empty it yourself (nothing was written)") from None
    ours = {names.MANIFEST_NAME, names.SIGNATURE_NAME, *(f.path for f in m.files.values())}
    others = sorted(p.name for p in out.iterdir() if p.name not in ours)
    if others:
        raise ValueError(f"{out} holds files an export did not write ({', '.join(others[:5])}"
                         f"{' ...' if len(others) > 5 else ''}); replacing it would delete them. "
                         "Choose another --out folder (nothing was written)")


def replace_folder(work: Path, out: Path) -> None:
    """Put the finished `work` folder at `out`, replacing an older artifact there."""
    if not out.exists():
        os.rename(work, out)
        return
    if any(out.iterdir()):
        check_replaceable(out)
    old = out.with_name(f".{out.name}.old-{os.getpid()}")
    os.rename(out, old)
    os.rename(work, out)
    shutil.rmtree(old, ignore_errors=True)


def work_folder(out: Path) -> Path:
    """A fresh temporary folder beside `out` for an export to fill, named with this process's
    id (`.<out>.tmp-<pid>-<random>`), after removing those a killed export left there: the
    same pattern with a process id no longer running (sweep_exports)."""
    sweep_exports(out)
    return Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-{os.getpid()}-", dir=out.parent))


def sweep_exports(out: Path) -> list[str]:
    """Delete the work folders and replaced artifacts (`.<out>.old-<pid>`) of exports to `out`
    whose process is gone; a live export's are left alone. Returns the names removed."""
    gone = []
    for p in out.parent.glob(f".{glob.escape(out.name)}.*-*"):
        kind, _, rest = p.name[len(out.name) + 2:].partition("-")
        pid = rest.split("-")[0]
        if kind in ("tmp", "old") and pid.isdigit() and p.is_dir() and not p.is_symlink() \
                and not pid_alive(int(pid)):
            shutil.rmtree(p, ignore_errors=True)
            gone.append(p.name)
    return gone


def resolve_target(target: str | None, nchwc: bool | None) -> tuple[str, bool]:
    """(the target, whether the training graph uses this machine's NCHWc kernels): portable
    unless asked (edgetrain/targets.py); NCHWc kernels only for the host target, where they
    are the default; nchwc=True alone asks for the host target."""
    if nchwc and target not in (None, "host"):
        raise ValueError(f"NCHWc kernels are this machine's (x86 MLAS); target {target!r} has "
                         "none. Drop nchwc (--nchwc), or export with target 'host' (--target "
                         "host) for this machine only")
    target = target or ("host" if nchwc else DEFAULT_TARGET)
    get_target(target)
    return target, target == "host" if nchwc is None else bool(nchwc)

