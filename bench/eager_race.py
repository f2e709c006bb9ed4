"""edgetrain against PyTorch eager, step for step, measured alternately in one run.

    .venv/bin/python bench/eager_race.py            # C5-C8; continues a stopped run
    .venv/bin/python bench/eager_race.py --heavy    # C1-C4 (ResNet-50; bench/heavy.py)
    .venv/bin/python bench/eager_race.py --report   # the table from saved results

For each stack row's configuration (bench/stack_config.py; exported untrained with
`--epochs 0`: a step's time does not depend on the weights) two artifacts: `--target portable`
(what a watch runs: ORT's CPU kernels only) and `--target host` (this machine's NCHWc kernels
too, the simulator's). Three rounds, each one `edgetrain measure --no-select` of each
artifact (the runtime's optimizer step of micro-batch x accumulation) then
bench/torch_peer.py (the same step in PyTorch eager, a fresh process), so all three see the
same machine state. Each side runs one warm-up step (its allocator's growth, first-touch
pages, kernel selection), but in a step of WARM_IN_STEP micro-batches or more (C6, C7: 1,568),
whose first micro-batch warms up within it, and then timed steps, as many as the step's time
asks (timed_steps: a few-millisecond step needs many to be seen through the noise, a step of
five seconds or more one, the rounds giving its spread); the first round's portable step,
timed once, sets the count, and the round is run again with it unless that count is one. A
round's time is the median of its timed steps and the row's time the median of the three
rounds. Nothing else runs meanwhile. Results: bench/results/eager_race.json; table in docs/results.md
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

from common import ROOT, WARM_IN_STEP, load_results, replace_table, save_results, stamp
from heavy import HEAVY_HELP, NOT_RECORDED, kept_rows, part
from planner import export, measured_step
from stack_config import DENSITY, STACK

TARGETS = ("portable", "host")
TARGET_WORDS = {"portable": "portable (a watch)", "host": "host (NCHWc, this machine)"}
DOC = ROOT / "docs" / "results.md"
ROUNDS = 3
TIMED_STEPS = 3
SHORT_STEP_S, SHORT_TIMED_STEPS = 0.2, 20
LONG_STEP_S = 5.0  # a step this long is timed once a round


def timed_steps(step_s: float) -> int:
    """Timed steps a round, for a step that took `step_s` once warm."""
    if step_s < SHORT_STEP_S:
        return SHORT_TIMED_STEPS
    return 1 if step_s >= LONG_STEP_S else TIMED_STEPS


def warm_up_steps(accumulation: int) -> int:
    """Untimed steps before the timed ones, for a step of `accumulation` micro-batches."""
    return 0 if accumulation >= WARM_IN_STEP else 1


def steady_s(times: list[float], warm_up: int) -> float:
    """The median step after the warm-up steps."""
    return statistics.median(times[warm_up:])


def eager_step_s(c, trainable: list[str] | None, steps: int) -> float:
    spec = {"network": c.network, "width": 1.0, "density": DENSITY if c.sparse else 1.0,
            "trainable": trainable, "recompute": c.recompute, "micro_batch": c.micro_batch,
            "accumulation": c.accumulation, "patch": c.network == "patch_mobilenet",
            "steps": steps}
    p = subprocess.run([sys.executable, str(ROOT / "bench" / "torch_peer.py"), json.dumps(spec)],
                       capture_output=True, text=True, cwd=ROOT)
    if p.returncode != 0:
        raise SystemExit(f"torch peer {c.name} failed:\n{p.stderr[-3000:]}")
    return steady_s(json.loads(p.stdout)["step_times_s"], warm_up_steps(c.accumulation))


def race(c, tmp: Path) -> dict:
    from edgetrain.manifest import load_manifest

    update = "head" if c.update.startswith("auto") else c.update
    arts = {t: export(tmp / f"{c.name}-{t}", c.network, c.sparse, c.recompute, c.micro_batch,
                      c.accumulation, update, target=t) for t in TARGETS}
    trainable = ([t.name for t in load_manifest(arts["portable"]).trainable]
                 if update != "all" else None)

    warm = warm_up_steps(c.accumulation)

    def ours_s(target: str, steps: int) -> float:
        return steady_s(measured_step(arts[target], c.micro_batch, c.accumulation,
                                      steps)["step_times_s"], warm)

    probe = ours_s("portable", warm + 1)  # one timed portable step sets the count
    steps = warm + timed_steps(probe)
    ours = {t: [probe] if steps == warm + 1 and t == "portable" else [] for t in TARGETS}
    theirs: list[float] = []  # the probe is round one's portable time when one step is timed
    while len(theirs) < ROUNDS:
        for t in TARGETS:
            if len(ours[t]) == len(theirs):
                ours[t].append(ours_s(t, steps))
        theirs.append(eager_step_s(c, trainable, steps))
    row = {**stamp(), "config": c.name, "network": c.network, "update": update,
           "micro_batch": c.micro_batch, "accumulation": c.accumulation,
           "warm_up_steps": warm, "timed_steps": steps - warm, "eager_step_s": theirs,
           "eager_median_s": statistics.median(theirs)}
    for t in TARGETS:
        row[f"{t}_step_s"] = ours[t]
        row[f"{t}_median_s"] = statistics.median(ours[t])
        row[f"{t}_ratio"] = row[f"{t}_median_s"] / row["eager_median_s"]
    print(json.dumps(row), flush=True)
    return row


def report(rows: list[dict]) -> None:
    """Two lines a row: the portable artifact (what a watch runs) and the host one."""
    where = {}
    for r in rows:  # rows raced before rows carried a stamp say so
        key = (f"commit `{r['commit']}`, {r['date']}, {r['machine']}"
               if r.get("commit") not in (None, NOT_RECORDED)
               else "a commit not recorded (before the rows carried one)")
        where.setdefault(key, []).append(r["config"])
    lines = ["Measured at " + "; ".join(f"{k} ({', '.join(v)})" for k, v in where.items())
             + "; `bench/eager_race.py`.", "",
             "| row | network | plan | artifact (target) | edgetrain step (median of 3 rounds, "
             "warm) | PyTorch eager step | edgetrain ÷ eager |", "|---|---|---|---|---:|---:|---:|"]
    for r in rows:
        if "portable_median_s" not in r:  # a race from before both targets were raced
            continue
        for t in TARGETS:
            lines.append(f"| {r['config']} | {r['network']} ({r['update']}) | "
                         f"{r['micro_batch']} × {r['accumulation']} | {TARGET_WORDS[t]} | "
                         f"{r[f'{t}_median_s']:.3f} s | {r['eager_median_s']:.3f} s | "
                         f"{r[f'{t}_ratio']:.2f} |")
    replace_table(DOC, lines, "eager-race")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--report", action="store_true", help="only rebuild the table")
    ap.add_argument("--heavy", action="store_true", help=HEAVY_HELP)
    args = ap.parse_args()
    rows = load_results("eager_race", [])
    if not args.report:
        # a stopped race continues; rows of this part measured on other code are raced again,
        # the other part's rows are kept as they are (each carries its stamp)
        here = stamp()["commit"]
        mine = {c.name for c in part(STACK, args.heavy)}
        rows = ([r for r in rows if r["config"] in mine and "portable_median_s" in r
                 and r.get("commit") == here]
                + kept_rows("eager_race", args.heavy, lambda r: r["network"]))
        done = {r["config"] for r in rows}
        order = [c.name for c in STACK]
        with tempfile.TemporaryDirectory() as tmp:
            for c in (c for c in STACK if c.name in mine and c.name not in done):
                rows.append(race(c, Path(tmp)))
                rows.sort(key=lambda r: order.index(r["config"]))
                save_results("eager_race", rows)
    report(rows)


if __name__ == "__main__":
    main()
