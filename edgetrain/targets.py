"""Where an artifact runs: a target names the CPU and the ONNX Runtime kernels it has.

A watch runs an arm64 CPU, whose ONNX Runtime has no NCHWc kernels (MLAS builds them for
x86 only: edgetrain/nchwcprobe.py); a microcontroller tier runs a portable build of ORT's CPU
kernels. An artifact is exported for a target (`edgetrain export --target`, or the
`--device` profile's): `portable` by default, which any ONNX Runtime 1.19.2 CPU build runs;
`host` is this machine's kernels too (the NCHWc blocked convolutions), an explicit choice for
simulator throughput. The runtime checks the operator domains an artifact's graphs use
against the target of the device it is asked to run as, before loading anything, and refuses
an artifact its kernels cannot run, with the fix.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from edgetrain.graphcheck import check_model_file
from edgetrain.names import NCHWC_DOMAIN
from edgetrain.operators import MS_DOMAIN
from edgetrain.specs import ArtifactError

_CPU_DOMAINS = frozenset({"", "ai.onnx", MS_DOMAIN})


@dataclass(frozen=True)
class Target:
    name: str
    description: str
    domains: frozenset  # operator domains its ONNX Runtime has kernels for


TARGETS = {t.name: t for t in [
    Target("portable", "any ONNX Runtime 1.19.2 CPU build (arm64 watches, microcontroller "
                       "ports, x86)", _CPU_DOMAINS),
    Target("arm64", "an arm64 watch or wearable SoC: ORT's CPU kernels, no NCHWc", _CPU_DOMAINS),
    Target("host", "this machine: ORT's CPU kernels and its NCHWc blocked kernels (x86; the "
                   "block is checked when the artifact opens)", _CPU_DOMAINS | {NCHWC_DOMAIN}),
]}
DEFAULT_TARGET = "portable"


def get_target(name: str) -> Target:
    if name not in TARGETS:
        raise ValueError(f"target {name!r} is not one of {sorted(TARGETS)}")
    return TARGETS[name]


def graph_domains(folder: str | Path, files: dict[str, str]) -> set[str]:
    """The operator domains the artifact's graphs use (files: role -> file name)."""
    found: set[str] = set()
    for role, name in files.items():
        if name.endswith(".onnx"):
            found |= {n.domain for n in check_model_file(role, Path(folder) / name).nodes}
    return found


def check_runs_on(folder: str | Path, files: dict[str, str], target: str, where: str) -> None:
    """Refuse (ArtifactError) an artifact whose graphs use kernels `target` lacks; `where`
    names what runs it (e.g. "device watchos-extension")."""
    t = get_target(target)
    missing = sorted(graph_domains(folder, files) - t.domains)
    if missing:
        raise ArtifactError(
            f"{folder} uses operators of {missing} (kernels of the machine that exported it), "
            f"which {where} ({t.name}: {t.description}) does not have. Export it again for "
            f"this device: `edgetrain export ... --target {t.name}` (or --device), or run it "
            "with --budget on the exporting machine")
