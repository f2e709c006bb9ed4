"""The demo's run, measured as `make demo` runs it, for the README's default and each tier.

    .venv/bin/python bench/demo.py            # every tier that ships a plan (~6 min on 2 cores)
    .venv/bin/python bench/demo.py --report   # the table from saved results

For each device of DEVICES, as the Makefile's demo does on HAPT: the plan the product ships
there (`edgetrain devices --json`), exported with user USER held out of the population model,
`edgetrain personalise --user USER --device D --adapt auto` (session 1 → session 2, capped),
then `edgetrain measure --adapt auto` (the allocator's peak and breakdown, and the predictor's
for the same cycle). Writes bench/results/demo.json and block `demo` of docs/results.md.
"""
from __future__ import annotations

import json
import tempfile
from pathlib import Path

from common import ROOT, measure_or_report, replace_table, run
from edgetrain.intervals import UserTest, gain_interval

USER = 30
DEVICES = ("watchos-extension", "mcu-2mb", "mcu-1mb", "mcu-256kb")
DOC = ROOT / "docs" / "results.md"


def demo(tmp: Path, device: str) -> dict:
    ships = json.loads(run("devices", "--json"))[device]["ships"]
    art, out = tmp / f"art-{device}", tmp / f"run-{device}"
    run("export", *ships["export_args"], "--dataset", "hapt", "--holdout-user", str(USER),
        "--out", str(art))
    b = str(ships["micro_batch"])
    r = json.loads(run("personalise", str(art), "--user", str(USER), "--device", device,
                       "--micro-batch", b, "--adapt", "auto", "--out", str(out), "--json"))
    m = json.loads(run("measure", str(art), "--batch", b, "--device", device, "--adapt", "auto",
                       "--json"))
    g = gain_interval([UserTest.of(r["test_correct_before"], r["test_correct_after"],
                                   r["test_recordings"])])
    guard = r.get("guard") or {}
    row = {"device": device, "user": USER, "plan": " ".join(ships["export_args"]),
           "micro_batch": ships["micro_batch"], "budget_bytes": r["budget_bytes"],
           "accuracy_before": r["accuracy_before"], "accuracy_after": r["accuracy_after"],
           "gain": g.to_dict(), "test_windows": len(r["test_correct_after"]),
           "guard_kept_population": guard.get("kept_population"),
           "guard_message": guard.get("message"),
           "inference_agreement": r["inference_agreement"],
           "run_peak_bytes": r["measured_peak_bytes"], "peak_bytes": m["peak_bytes"],
           "predicted_peak_bytes": (m["predicted_peak_bytes"] if m.get("predicted_complete")
                                    else None),
           "breakdown": m["breakdown"], "predicted_breakdown": m.get("predicted_breakdown")}
    print(json.dumps({k: row[k] for k in ("device", "accuracy_before", "accuracy_after",
                                          "peak_bytes")}), flush=True)
    return row


def measure() -> list[dict]:
    with tempfile.TemporaryDirectory() as tmp:
        return [demo(Path(tmp), d) for d in DEVICES]


def report(rows: list[dict]) -> None:
    lines = ["| device (budget) | plan it ships | session-2 accuracy, before → after | gain, "
             "points [95%, test recordings] | guard | inference model agrees | measured peak "
             "(run; `measure`) | predicted (`measure`) |", "|---|---|---|---|---|---:|---|---:|"]
    for r in rows:
        g = r["gain"]
        kept = {True: "kept the population model", False: "kept the personalised model",
                None: "–"}[r["guard_kept_population"]]
        pred = r["predicted_peak_bytes"]
        lines.append(
            f"| `{r['device']}` ({r['budget_bytes']:,} B) | `{r['plan']}` | "
            f"{r['accuracy_before']:.3f} → {r['accuracy_after']:.3f} ({r['test_windows']} "
            f"windows) | {g['gain_points']:+.1f} [{g['low_points']:+.1f}, {g['high_points']:+.1f}]"
            f", {g['recordings']} | {kept} | {r['inference_agreement']:.0%} | "
            f"{r['run_peak_bytes']:,}; {r['peak_bytes']:,} | "
            + (f"{pred:,} ({pred / r['peak_bytes'] - 1:+.2%})" if pred else "no claim") + " |")
    replace_table(DOC, lines, "demo", sources=["demo"])


if __name__ == "__main__":
    measure_or_report("demo", measure, report, __doc__.splitlines()[0])
