"""edgetrain against PyTorch eager, step for step, measured alternately in one run.

    .venv/bin/python bench/eager_race.py            # ~35 min on 2 cores; continues a stopped run
    .venv/bin/python bench/eager_race.py --report   # the table from saved results

For each stack row's configuration (bench/stack_config.py; exported untrained with
`--epochs 0`: a step's time does not depend on the weights), three rounds, each one
`edgetrain measure --no-select` (the runtime's optimizer step of micro-batch x accumulation)
then bench/torch_peer.py (the same step in PyTorch eager, a fresh process), so both see the
same machine state. Each side runs one warm-up step (its allocator's growth, first-touch
pages, kernel selection) and then TIMED_STEPS timed steps (SHORT_TIMED_STEPS when a step takes
under SHORT_STEP_S: a few-millisecond step needs many to be seen through the noise); a round's
time is the median of its timed steps and the row's time the median of the three rounds.
Nothing else runs meanwhile. Results: bench/results/eager_race.json; table in docs/results.md
(marker `eager-race`).
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from common import ROOT, replace_table, save_results, step_table
from planner import export, measured_step
from stack_config import DENSITY, STACK

RESULTS = ROOT / "bench" / "results" / "eager_race.json"
DOC = ROOT / "docs" / "results.md"
ROUNDS = 3
TIMED_STEPS = 3
SHORT_STEP_S, SHORT_TIMED_STEPS = 0.2, 20


def steady_s(times: list[float]) -> float:
    """The median step after the first (the warm-up)."""
    return statistics.median(times[1:])


def eager_step_s(c, trainable: list[str] | None, steps: int) -> float:
    spec = {"network": c.network, "width": 1.0, "density": DENSITY if c.sparse else 1.0,
            "trainable": trainable, "recompute": c.recompute, "micro_batch": c.micro_batch,
            "accumulation": c.accumulation, "patch": c.network == "patch_mobilenet",
            "steps": steps}
    p = subprocess.run([sys.executable, str(ROOT / "bench" / "torch_peer.py"), json.dumps(spec)],
                       capture_output=True, text=True, cwd=ROOT)
    if p.returncode != 0:
        raise SystemExit(f"torch peer {c.name} failed:\n{p.stderr[-3000:]}")
    return steady_s(json.loads(p.stdout)["step_times_s"])


def race(c, tmp: Path) -> dict:
    from edgetrain.manifest import load_manifest

    update = "head" if c.update.startswith("auto") else c.update
    art = export(tmp / c.name, c.network, c.sparse, c.recompute, c.micro_batch,
                 c.accumulation, update)
    trainable = [t.name for t in load_manifest(art).trainable] if update != "all" else None
    steps, ours, theirs = 1 + TIMED_STEPS, [], []
    while len(ours) < ROUNDS:
        ours.append(steady_s(measured_step(art, c.micro_batch, c.accumulation,
                                           steps)["step_times_s"]))
        if ours[0] < SHORT_STEP_S and steps == 1 + TIMED_STEPS:  # a short step: more steps
            steps, ours = 1 + SHORT_TIMED_STEPS, []
            continue
        theirs.append(eager_step_s(c, trainable, steps))
    row = {"config": c.name, "network": c.network, "update": update,
           "micro_batch": c.micro_batch, "accumulation": c.accumulation,
           "timed_steps": steps - 1, "edgetrain_step_s": ours, "eager_step_s": theirs,
           "edgetrain_median_s": statistics.median(ours),
           "eager_median_s": statistics.median(theirs)}
    row["ratio"] = row["edgetrain_median_s"] / row["eager_median_s"]
    print(json.dumps(row), flush=True)
    return row


def report(rows: list[dict]) -> None:
    replace_table(DOC, step_table(rows, "edgetrain_median_s", "eager_median_s",
                                  ("edgetrain step (median of 3 rounds, warm)",
                                   "PyTorch eager step", "edgetrain ÷ eager")), "eager-race")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--report", action="store_true", help="only rebuild the table")
    args = ap.parse_args()
    rows = json.loads(RESULTS.read_text()) if RESULTS.is_file() else []
    if not args.report:
        done = {r["config"] for r in rows}
        with tempfile.TemporaryDirectory() as tmp:
            for c in (c for c in STACK if c.name not in done):
                rows.append(race(c, Path(tmp)))
                save_results("eager_race", rows)
    report(rows)


if __name__ == "__main__":
    main()
