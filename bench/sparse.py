"""Trainable-state bytes of the patch MobileNet at several mask densities, measured.

    .venv/bin/python bench/sparse.py        # about 2 minutes

Exports the patch MobileNet (no pretraining: weights do not change bytes) at each density
with ERK allocation, measures one step at batch 8 with ORT's allocator, and reports
parameters + gradients + optimizer state against the dense figure. Writes
bench/results/sparse.json and the table in docs/sparse.md.
"""
from __future__ import annotations

import json
import tempfile
from pathlib import Path

from edgetrain.names import MANIFEST_NAME
from common import ROOT, measure_or_report, replace_table, run

DENSITIES = (1.0, 0.5, 0.2, 0.1)
NETWORK, BATCH = "patch_mobilenet", 8


def measure() -> list[dict]:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for density in DENSITIES:
            art = Path(tmp) / f"d{density}"
            run("export", "--model", NETWORK, "--epochs", "0", "--no-cache", "--density",
                str(density), "--out", str(art))
            manifest = json.loads((art / MANIFEST_NAME).read_text())
            r = json.loads(run("measure", str(art), "--batch", str(BATCH), "--json"))
            b = r["breakdown"]
            rows.append({
                "network": NETWORK, "density": density, "batch": BATCH,
                "masked_weights": len(manifest["masks"]),
                "kept_values": sum(m["nnz"] for m in manifest["masks"]),
                "parameters_bytes": b["parameters"], "gradients_bytes": b["gradients"],
                "optimizer_state_bytes": b["optimizer_state"],
                "state_bytes": b["parameters"] + b["gradients"] + b["optimizer_state"],
                "activation_bytes": b["activations"], "peak_bytes": r["peak_bytes"]})
    dense = rows[0]["state_bytes"]
    for r in rows:
        r["state_ratio"] = round(r["state_bytes"] / dense, 4)
        print(json.dumps(r), flush=True)
    return rows


def report(rows: list[dict]) -> None:
    lines = ["| density | masked weights | kept values | parameters | gradients "
             "| optimizer state | sum | vs dense | activations | peak |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['density']} | {r['masked_weights']} | {r['kept_values']:,} | "
                     f"{r['parameters_bytes']:,} | {r['gradients_bytes']:,} | "
                     f"{r['optimizer_state_bytes']:,} | {r['state_bytes']:,} | "
                     f"{r['state_ratio']:.3f} | {r['activation_bytes']:,} | {r['peak_bytes']:,} |")
    replace_table(ROOT / "docs" / "sparse.md", lines, sources=["sparse"])


if __name__ == "__main__":
    measure_or_report("sparse", measure, report, __doc__.splitlines()[0])
