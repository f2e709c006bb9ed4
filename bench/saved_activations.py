"""What holding the saved activations in 8 bits buys, measured: the peak and its breakdown.

    .venv/bin/python bench/saved_activations.py            # ~10 min on 2 cores
    .venv/bin/python bench/saved_activations.py --report   # the table from saved results

For each network of NETWORKS (population model of held-out user 10, as bench/update_plans.py)
and each update plan of PLANS, at micro-batch 8 and 2 threads: exported with
`--saved-activations fp32` and `int8`, then `edgetrain measure` (the personalisation cycle,
selection included). The activations column is the allocator's; "predicted" is the static
predictor's error on the peak. Results: bench/results/saved_activations.json; the table in
docs/update-plans.md (block `saved-activations`).
"""
from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from common import ROOT, replace_table, run, save_results, stamp

NETWORKS = ("imu_cnn", "imu_transformer", "patch_mobilenet")
PLANS = ("all", "bias", "bias-only")
BATCHES = (8, 32)
RESULTS = ROOT / "bench" / "results" / "saved_activations.json"
DOC = ROOT / "docs" / "update-plans.md"


def measure(tmp: Path, model: str, update: str, saved: str, batch: int) -> dict:
    out = tmp / f"{model}-{update}-{saved}-{batch}"
    m = json.loads(run("export", "--model", model, "--update", update, "--micro-batch",
                       str(batch), "--threads", "2", "--saved-activations", saved, "--out",
                       str(out), "--json"))
    meas = json.loads(run("measure", str(out), "--batch", str(batch), "--threads", "2",
                          "--json"))
    return {"model": model, "update": update, "saved_activations": saved, "batch": batch,
            "rounded_tensors": m["provenance"].get("passes", {}).get("int8_saved_activations",
                                                                      0),
            "predicted_peak_bytes": meas["predicted_peak_bytes"],
            "predicted_complete": meas["predicted_complete"], "peak_bytes": meas["peak_bytes"],
            "breakdown": meas["breakdown"]}


def main() -> None:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for model in NETWORKS:
            for update in PLANS:
                for batch in BATCHES:
                    for saved in ("fp32", "int8"):
                        rows.append(measure(Path(tmp), model, update, saved, batch))
                        print(json.dumps({k: rows[-1][k] for k in (
                            "model", "update", "batch", "saved_activations", "peak_bytes")}),
                            flush=True)
    save_results("saved_activations", [{**stamp(), "rows": rows}])
    report()


def report() -> None:
    saved = json.loads(RESULTS.read_text())[0]
    rows = saved["rows"]
    lines = [f"Measured at commit `{saved['commit']}`, {saved['date']}, {saved['machine']}; "
             "`bench/saved_activations.py` (2 threads).", "",
             "| network | plan | micro-batch | saved activations | tensors in 8 bits | "
             "measured peak | predicted | activations | × fewer activation bytes |",
             "|---|---|---:|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        base = next(a for a in rows if a["saved_activations"] == "fp32" and all(
            a[k] == r[k] for k in ("model", "update", "batch")))
        act = r["breakdown"]["activations"]
        pred = (f"{100 * (r['predicted_peak_bytes'] / r['peak_bytes'] - 1):+.1f}%"
                if r["predicted_complete"] else "no claim")
        lines.append(f"| {r['model']} | `{r['update']}` | {r['batch']} | "
                     f"{r['saved_activations']} | {r['rounded_tensors']} | "
                     f"{r['peak_bytes']:,} | {pred} | {act:,} | "
                     f"{base['breakdown']['activations'] / act:.2f}× |")
    replace_table(DOC, lines, "saved-activations")
    print("\n".join(lines))


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--report", action="store_true")
    report() if ap.parse_args().report else main()
