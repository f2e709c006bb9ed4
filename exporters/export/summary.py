"""What an export made, in a few lines a person reads: what trains, the prediction (labelled
as one), and what to run next. `edgetrain export` prints it; from Python,
`print(export_summary(manifest, out))` after `export_artifact`."""
from __future__ import annotations

from pathlib import Path

from edgetrain.manifest import Manifest


def _mib(n: int) -> str:
    return f"{n:,} bytes ({n / 2 ** 20:.2f} MiB)"


def export_summary(m: Manifest, out: str | Path) -> str:
    lines = [f"exported {m.model} to {out}: {len(m.trainable)} trainable tensors "
             f"({m.trainable_bytes:,} bytes, update plan {m.plan.update!r}), {len(m.frozen)} "
             f"frozen, {m.num_classes} classes; sample {list(m.input.sample_shape)}"
             + (f" ({m.input.layout})" if m.input.layout else "")
             + (f", preprocessing {m.input.preprocess}" if m.input.preprocess != "none" else "")]
    if m.predicted.get("complete", True):
        lines.append(f"predicted peak at micro-batch {m.predicted['batch']} with "
                     f"{m.plan.threads} threads (a prediction): {_mib(m.predicted['peak_bytes'])}")
    else:
        lines.append(f"predictor: {m.predicted['caveat']}; `edgetrain measure` gives the peak")
    if m.plan.saved_activations == "int8":
        rounded = m.provenance.get("passes", {}).get("int8_saved_activations", 0)
        lines.append(f"saved activations in 8 bits: {rounded} tensors" if rounded else
                     "saved activations stay float: the predictor finds no lower peak with "
                     "them in 8 bits (or cannot size the step); --saved-activations int8 "
                     "changed nothing")
    data = ("--user N" if m.input.preprocess in ("imu_window", "imu_gasf")
            else "--data your.npz")
    lines.append(f"next: edgetrain measure {out} --batch {m.plan.micro_batch} --device "
                 f"watchos-extension   (the allocator's peak and its breakdown)")
    lines.append(f"      edgetrain personalise {out} {data} --device watchos-extension "
                 "--out runs/mine")
    return "\n".join(lines)
