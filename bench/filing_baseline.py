"""C6's one-patch plan as edgetrain ran it when the planner issue was filed, beside today's
runtime and the planner's plans, measured alternately on this machine.

    .venv/bin/python bench/filing_baseline.py     # about 37 minutes on 2 cores

A fixed old commit's speed is a baseline, not a figure of today's code: `make results` runs
this only with `--full` (bench/all.py), and the table says which commit measured it.

The issue ("the fastest plan that fits") gave "today's micro-batch-1 plan" as 40.3 s a step
(2026-11-22, measured with the stack bench). Machines and days differ, so this re-measures it:
a git worktree at FILING_COMMIT (the last commit before the issue's work) exports C6 as it
did then (`--recompute sqrt --micro-batch 1 --accumulate 1568`, untrained) and measures its
step with its own code; the current code exports and measures the same configuration, and
the plans in bench/results/planner.json are measured again at their micro-batch, and so is what
`export --plan auto --device D` builds for each device (its whole search: the variants, the
artifact rebuilt at its micro-batch, the budget-recompute twins at larger ones). Each is
ROUNDS rounds of `measure --steps 3` (the median step; the filing-day code reports no
more), in turn. Results:
bench/results/filing_baseline.json; table in docs/results.md (marker `filing-baseline`).
"""
from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from common import ROOT, load_results, measure_or_report, replace_table

FILING_COMMIT = "93b3d07"  # d72bdcd^: the runtime before `edgetrain plan` and its work
ROUNDS = 3
PLAN_AUTO_DEVICES = ("watchos-extension", "watch-app-low")
C6 = ["--model", "patch_mobilenet", "--width", "1.0", "--epochs", "0", "--density", "0.1",
      "--recompute", "sqrt", "--micro-batch", "1", "--accumulate", "1568"]


def cli(root: Path, *args: str) -> str:
    p = subprocess.run([sys.executable, "-m", "edgetrain.cli", *args], capture_output=True,
                       text=True, cwd=root, env={"PYTHONPATH": str(root), "PATH": "/usr/bin"})
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed in {root}:\n{p.stderr[-2000:]}")
    return p.stdout


def step_s(root: Path, art: Path, batch: int, accumulation: int) -> float:
    d = json.loads(cli(root, "measure", str(art), "--batch", str(batch), "--accumulate",
                       str(accumulation), "--steps", "3", "--no-select", "--json"))
    return d["step_time_s"]  # the median of 3 steps (the first warms allocator and kernels)


def measure() -> list[dict]:
    planned = [r for r in load_results("planner")
               if r["kind"] == "planner" and r["chosen"]]
    with tempfile.TemporaryDirectory() as tmp:
        old = Path(tmp) / "filing"
        subprocess.run(["git", "worktree", "add", "--detach", str(old), FILING_COMMIT],
                       cwd=ROOT, check=True, capture_output=True)
        try:
            cli(old, "export", *C6, "--out", str(Path(tmp) / "c6-filing"))
            cli(ROOT, "export", *C6, "--out", str(Path(tmp) / "c6-today"))
            cases = {"filing-day code, 1 x 1568": (old, Path(tmp) / "c6-filing", 1, 1568),
                     "today's code, 1 x 1568": (ROOT, Path(tmp) / "c6-today", 1, 1568)}
            for r in planned:
                c = r["chosen"]
                cases[f"{r['device']} plan, {c['micro_batch']} x {c['accumulation_steps']}"] = (
                    ROOT, Path(tmp) / "c6-today", c["micro_batch"], c["accumulation_steps"])
            for device in PLAN_AUTO_DEVICES:  # the whole search: variants, recompute twins
                art = Path(tmp) / f"c6-auto-{device}"
                cli(ROOT, "export", *C6, "--plan", "auto", "--device", device, "--out", str(art))
                plan = json.loads((art / "manifest.json").read_text())["plan"]
                b, acc = plan["micro_batch"], plan["accumulation_steps"]
                cases[f"{device}, export --plan auto: {b} x {acc}, recompute "
                      f"{plan['recompute']} ({len(plan['checkpoints'])} checkpoints)"] = (
                    ROOT, art, b, acc)
            times = {k: [] for k in cases}
            for _ in range(ROUNDS):
                for k, (root, art, b, acc) in cases.items():
                    times[k].append(step_s(root, art, b, acc))
                    print(k, round(times[k][-1], 2), flush=True)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(old)], cwd=ROOT,
                           capture_output=True)
    rows = [{"case": k, "step_times_s": v, "median_s": statistics.median(v)}
            for k, v in times.items()]
    return rows


def report(rows: list[dict]) -> None:
    base = rows[0]["median_s"]
    lines = ["Measured by `make results ARGS=--full` only (a default run keeps this table): it "
             "re-measures the filing-day code, a fixed baseline.", "",
             "| C6, 32 windows a step | step (median of 3) | windows/s | vs filing-day code |",
             "|---|---:|---:|---:|"]
    lines += [f"| {r['case']} | {r['median_s']:.2f} s | {32 / r['median_s']:.2f} | "
              f"{base / r['median_s']:.1f}× |" for r in rows]
    replace_table(ROOT / "docs" / "results.md", lines, "filing-baseline",
                  sources=["filing_baseline"])
    print("\n".join(lines))


if __name__ == "__main__":
    measure_or_report("filing_baseline", measure, report, __doc__.splitlines()[0])
