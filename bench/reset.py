"""One-shot magnitude pruning of the pretrained patch MobileNet, without and with RESET.

    .venv/bin/python bench/reset.py        # about 8 minutes on 2 cores

Prunes the population model (user 10 held out) by magnitude to 0/50/80/90/95% sparsity, with
three per-layer allocations: uniform (layerwise magnitude pruning), global (one threshold
over all layers: global magnitude pruning; seed 003 uses both) and ERK, then runs `edgetrain
reset-bn` on device: BatchNorm statistics re-estimated from forward passes over at most 256 of
user 10's personalisation samples, inside the watchos-extension budget. Accuracy on user 10's
test arm before and after. The exports skip their host-side masking check
(`--no-masking-check`): this bench measures RESET on the device. Writes
bench/results/reset.json and the table in docs/sparse.md.
"""
from __future__ import annotations

import json
import tempfile
from pathlib import Path

from common import ROOT, measure_or_report, replace_table, run

SPARSITIES = (0.0, 0.5, 0.8, 0.9, 0.95)
ALLOCATIONS = ("uniform", "global", "erk")
DEVICE, USER, SAMPLES = "watchos-extension", 10, 256


def measure() -> list[dict]:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for allocation in ALLOCATIONS:
            for sparsity in SPARSITIES:
                if sparsity == 0 and allocation != ALLOCATIONS[0]:
                    continue  # dense is dense
                art = Path(tmp) / f"{allocation}-{sparsity}"
                run("export", "--model", "patch_mobilenet", "--holdout-user", str(USER),
                    "--density", str(round(1 - sparsity, 4)), "--mask-allocation", allocation,
                    "--mask-init", "magnitude", "--no-masking-check", "--out", str(art))
                r = json.loads(run("reset-bn", str(art), "--user", str(USER), "--device",
                                   DEVICE, "--samples", str(SAMPLES), "--out",
                                   str(Path(tmp) / f"run-{allocation}-{sparsity}"), "--json"))
                row = {"allocation": allocation, "sparsity": sparsity, **r}
                rows.append(row)
                print(json.dumps({k: row[k] for k in ("allocation", "sparsity", "samples",
                                                      "accuracy_before", "accuracy_after")}),
                      flush=True)
    return rows


def report(rows: list[dict]) -> None:
    lines = ["| sparsity | allocation | samples | accuracy without RESET | with RESET |",
             "|---:|---|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['sparsity']:.0%} | {r['allocation'] if r['sparsity'] else '-'} | "
                     f"{r['samples']} | {r['accuracy_before']:.3f} | {r['accuracy_after']:.3f} |")
    replace_table(ROOT / "docs" / "sparse.md", lines, "reset-table", sources=["reset"])


if __name__ == "__main__":
    measure_or_report("reset", measure, report, __doc__.splitlines()[0])
