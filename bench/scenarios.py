"""Seed 004's scenarios on one network: the cap at the measured peak and below it, the largest
batch under each budget, and what a step costs.

    .venv/bin/python bench/scenarios.py            # ~10 min on 2 cores
    .venv/bin/python bench/scenarios.py --report   # the tables from saved results

The patch MobileNet with user USER held out of its population model (`edgetrain export
--model patch_mobilenet --holdout-user 10`, the README's tour):

1. **The cap.** `edgetrain personalise --user 10 --epochs 1` inside `watchos-extension`
   gives the run's own measured peak P; the same run again with `--budget P` must complete
   and stay within P, and with `--budget P - 64 KiB` must be refused (exit status 3) before
   any training, with nothing written to its run folder.
2. **Largest batch under a budget** (`edgetrain fit --device D --json` for D in FIT_DEVICES):
   the predictor's proposal, the batch capped runs confirm, the peak there and the error one
   more sample gives; the throughput is this machine's.
3. **A step's cost** (`edgetrain measure --batch 8 --device watchos-extension --json`): FLOPs
   and bytes moved counted from the graph, the roofline time on the profile (a lower bound, a
   prediction) and the step measured here.

Writes bench/results/scenarios.json and blocks `cap`, `fit` and `step-cost` of docs/results.md.
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from common import CLI, ROOT, measure_or_report, replace_table, run

USER = 10
FIT_DEVICES = ("watchos-extension", "mcu-8mb", "mcu-2mb")
DOC = ROOT / "docs" / "results.md"
BELOW_BYTES = 64 * 1024


def personalise(art: Path, out: Path, *budget: str) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, "personalise", str(art), "--user", str(USER), "--epochs", "1",
                           "--out", str(out), "--json", *budget], capture_output=True,
                          text=True, cwd=ROOT)


def cap(tmp: Path, art: Path) -> dict:
    first = personalise(art, tmp / "first", "--device", "watchos-extension")
    if first.returncode != 0:
        raise SystemExit(f"personalise failed:\n{first.stderr[-2000:]}")
    peak = json.loads(first.stdout)["measured_peak_bytes"]
    at = personalise(art, tmp / "at", "--budget", str(peak))
    below_out = tmp / "below"
    below = personalise(art, below_out, "--budget", str(peak - BELOW_BYTES))
    at_doc = json.loads(at.stdout) if at.returncode == 0 else {}
    return {"peak_bytes": peak, "at_exit": at.returncode,
            "at_run_peak_bytes": at_doc.get("measured_peak_bytes"),
            "at_accuracy": [at_doc.get("accuracy_before"), at_doc.get("accuracy_after")],
            "below_budget_bytes": peak - BELOW_BYTES, "below_exit": below.returncode,
            "below_message": below.stderr.strip().splitlines()[-1] if below.stderr else "",
            "below_files_written": sorted(str(p.relative_to(below_out))
                                          for p in below_out.rglob("*") if p.is_file())
            if below_out.exists() else []}


def measure() -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        art = Path(tmp) / "pm"
        run("export", "--model", "patch_mobilenet", "--holdout-user", str(USER), "--out",
            str(art))
        fits = [{"device": d, **json.loads(run("fit", str(art), "--device", d, "--json"))}
                for d in FIT_DEVICES]
        cost = json.loads(run("measure", str(art), "--batch", "8", "--device",
                              "watchos-extension", "--json"))
        target = json.loads((art / "manifest.json").read_text())["plan"]["target"]
        results = {"target": target, "cap": cap(Path(tmp), art), "fit": fits,
                   "step_cost": {k: cost[k] for k in (
                       "batch", "step_flops", "step_bytes_moved", "predicted_device_step_time_s",
                       "step_time_s", "threads", "peak_bytes")}}
    print(json.dumps(results["cap"]), file=sys.stderr)
    return results


def short(message: str) -> str:
    """The refusal's first clause and the bytes it says the run needs."""
    need = re.search(r"It needs at least \d+ bytes", message)
    return message.split(" (budget")[0] + (f" … {need.group(0)}" if need else "")


def report(results: dict) -> None:
    c = results["cap"]
    held = c["at_run_peak_bytes"]
    cap_lines = [
        "| budget | exit status | what happened |", "|---|---:|---|",
        f"| {c['peak_bytes']:,} B (the run's measured peak) | {c['at_exit']} | "
        + (f"completed, measured peak {held:,} B; accuracy {c['at_accuracy'][0]:.3f} → "
           f"{c['at_accuracy'][1]:.3f}" if c["at_exit"] == 0 else "**failed**") + " |",
        f"| {c['below_budget_bytes']:,} B (64 KiB less) | {c['below_exit']} | "
        f"{'refused' if c['below_exit'] == 3 else '**not refused as documented**'}; files "
        f"written: {len(c['below_files_written'])}; \"{short(c['below_message'])}\" |"]
    replace_table(DOC, cap_lines, "cap", sources=["scenarios"])
    target = results.get("target", "not recorded")
    fit_lines = ["| device | budget | predicted largest batch | confirmed | measured peak there | "
                 f"throughput there (this machine, {target} artifact) |",
                 "|---|---:|---:|---:|---:|---:|"]
    for f in results["fit"]:
        peak = f"{f['peak_bytes']:,}" if f["peak_bytes"] else "–"
        tput = (f"{f['throughput_samples_per_s']:.0f} samples/s"
                if f["throughput_samples_per_s"] else "–")
        fit_lines.append(f"| `{f['device']}` | {f['budget_bytes']:,} | "
                         f"{f['predicted_max_batch']} | **{f['max_batch']}** | {peak} | {tput} |")
    replace_table(DOC, fit_lines, "fit", sources=["scenarios"])
    s = results["step_cost"]
    cost_lines = [
        "| batch | FLOPs a step (counted) | bytes moved (counted) | roofline time on "
        f"`watchos-extension` (prediction, a lower bound) | measured here ({target} "
        "artifact) | threads |",
        "|---:|---:|---:|---:|---:|---:|",
        f"| {s['batch']} | {s['step_flops'] / 1e9:.3f} G | {s['step_bytes_moved'] / 1e6:.0f} MB | "
        f"{s['predicted_device_step_time_s'] * 1e3:.1f} ms | {s['step_time_s'] * 1e3:.1f} ms | "
        f"{s['threads']} |"]
    replace_table(DOC, cost_lines, "step-cost", sources=["scenarios"])


if __name__ == "__main__":
    measure_or_report("scenarios", measure, report, __doc__.splitlines()[0])
