"""Static predictor vs the runtime's allocator: 3 networks x batch 1, 8, 32.

    .venv/bin/python bench/predictor.py            # about 10 minutes on 2 cores

Exports the seed networks (without pretraining: weights do not change memory), measures each
with `edgetrain measure --json` (a fresh torch-free process per case) and writes
bench/results/predictor.json and the table in docs/predictor.md.
"""
from __future__ import annotations

import json
import tempfile
from pathlib import Path

from common import ROOT, replace_table, run, save_results

NETWORKS = ["mobilenet_v1", "patch_mobilenet", "resnet50"]
BATCHES = [1, 8, 32]


def main() -> None:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for net in NETWORKS:
            art = Path(tmp) / net
            run("export", "--model", net, "--epochs", "0", "--no-cache", "--out", str(art))
            for b in BATCHES:
                d = json.loads(run("measure", str(art), "--batch", str(b), "--steps", "2",
                                   "--json"))
                err = (d["predicted_peak_bytes"] - d["peak_bytes"]) / d["peak_bytes"]
                rows.append({"network": net, "batch": b, "peak_bytes": d["peak_bytes"],
                             "predicted_peak_bytes": d["predicted_peak_bytes"],
                             "error_ratio": round(err, 4), "breakdown": d["breakdown"],
                             "predicted_breakdown": d["predicted_breakdown"],
                             "step_time_s": d["step_time_s"]})
                print(f"{net:16s} batch {b:2d}: measured {d['peak_bytes']:>14,} predicted "
                      f"{d['predicted_peak_bytes']:>14,} ({err:+.1%})", flush=True)
    save_results("predictor", rows)
    write_table(rows)


def write_table(rows: list[dict]) -> None:
    lines = ["| network | batch | measured peak | predicted peak | error | measured activations "
             "| predicted activations |", "|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['network']} | {r['batch']} | {r['peak_bytes']:,} | "
                     f"{r['predicted_peak_bytes']:,} | {r['error_ratio']:+.1%} | "
                     f"{r['breakdown']['activations']:,} | "
                     f"{r['predicted_breakdown']['activations']:,} |")
    replace_table(ROOT / "docs" / "predictor.md", lines)


if __name__ == "__main__":
    main()
