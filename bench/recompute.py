"""Recompute plans vs none: measured peak, activation bytes and step time at batch 8.

    .venv/bin/python bench/recompute.py        # about 10 minutes on 2 cores

Exports each seed network twice (recompute none and sqrt, no pretraining: weights do not
change memory or time), then measures the two alternately, twice each, 5 timed steps per
measurement, in one run; step time is the median over both rounds. Writes
bench/results/recompute.json and the table in docs/recompute.md.
"""
from __future__ import annotations

import json
import statistics
import tempfile
from pathlib import Path

from predictor import ROOT, run  # bench/predictor.py: the CLI runner

NETWORKS = ["mobilenet_v1", "patch_mobilenet", "resnet50"]
PLANNERS = ["none", "sqrt"]
BATCH, ROUNDS, STEPS = 8, 2, 5


def main() -> None:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for net in NETWORKS:
            arts, results = {}, {p: [] for p in PLANNERS}
            for planner in PLANNERS:
                arts[planner] = Path(tmp) / f"{net}-{planner}"
                run("export", "--model", net, "--epochs", "0", "--no-cache",
                    "--recompute", planner, "--out", str(arts[planner]))
            for _ in range(ROUNDS):
                for planner in PLANNERS:
                    results[planner].append(json.loads(run(
                        "measure", str(arts[planner]), "--batch", str(BATCH),
                        "--steps", str(STEPS), "--json")))
            manifest = {p: json.loads((arts[p] / "manifest.json").read_text()) for p in PLANNERS}
            base = results["none"][0]
            base_time = statistics.median(r["step_time_s"] for r in results["none"])
            for planner in PLANNERS:
                r = results[planner][0]
                t = statistics.median(x["step_time_s"] for x in results[planner])
                rows.append({
                    "network": net, "planner": planner, "batch": BATCH,
                    "recomputed_tensors": len(manifest[planner]["plan"]["recomputed"]),
                    "peak_bytes": r["peak_bytes"],
                    "activation_bytes": r["breakdown"]["activations"],
                    "predicted_activation_bytes": r["predicted_breakdown"]["activations"],
                    "activation_cut_ratio": round(base["breakdown"]["activations"]
                                                  / r["breakdown"]["activations"], 3),
                    "step_time_s": round(t, 4), "time_ratio": round(t / base_time, 3)})
                print(json.dumps(rows[-1]), flush=True)
    out = ROOT / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / "recompute.json").write_text(json.dumps(rows, indent=2))
    lines = ["| network | plan | recomputed tensors | measured peak | measured activations "
             "| predicted activations | activations cut | step time | time vs none |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['network']} | {r['planner']} | {r['recomputed_tensors']} | "
                     f"{r['peak_bytes']:,} | {r['activation_bytes']:,} | "
                     f"{r['predicted_activation_bytes']:,} | {r['activation_cut_ratio']:.2f}x | "
                     f"{r['step_time_s'] * 1e3:.0f} ms | {r['time_ratio']:.2f}x |")
    doc = ROOT / "docs" / "recompute.md"
    text = doc.read_text()
    head, _, rest = text.partition("<!-- table -->")
    _, _, tail = rest.partition("<!-- /table -->")
    doc.write_text(head + "<!-- table -->\n" + "\n".join(lines) + "\n<!-- /table -->" + tail)


if __name__ == "__main__":
    main()
