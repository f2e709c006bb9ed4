"""The planner against today's plan, and the latency model against measured step times.

    .venv/bin/python bench/planner.py            # continues a stopped run; not ResNet-50's
    .venv/bin/python bench/planner.py --heavy    # the ResNet-50 rows alone (bench/heavy.py)
    .venv/bin/python bench/planner.py --fresh    # forget the saved rows first
    .venv/bin/python bench/planner.py --repredict  # new predictions beside the saved times
    .venv/bin/python bench/planner.py --report   # tables from saved results

Every artifact here is exported untrained (`--epochs 0`): a step's time and peak depend on
the graph and the plan, not on the weights, and the stack's pretrained models take hours.
1. C6's configuration (patch MobileNet at width 1.0, 10% of its weights kept under ERK,
   recompute sqrt; a step of 32 windows, 1,568 patches), exported for the portable target
   (the watch's graph, which `edgetrain plan --device` requires): today's plan, micro-batch
   1 x 1,568, measured, against `edgetrain plan`'s choice for `watchos-extension` and
   `watch-app-low` (its capped runs, and its frontier picture).
2. The latency model (device_sim/planner.py, on this machine's measured speed) beside the
   measured step time for each stack row's configuration (C1-C6 and C8, at the row's
   micro-batch and accumulation), exported for the host target (this machine's kernels,
   which the model's rates were measured with).
Results: bench/results/planner.json; tables in docs/results.md (markers `planner` and
`latency`); pictures docs/img/plan-frontier-<device>.png.
"""
from __future__ import annotations

import argparse
import json
import math
import tempfile
from pathlib import Path

from common import (ROOT, load_results, replace_table, run, run_timed, save_results, stamp,
                    step_table)

from heavy import HEAVY_HELP, is_heavy, kept_rows, part, why_mixed
from stack_config import DENSITY, EFFECTIVE_BATCH, STACK

PLANNER_RESULTS = ROOT / "bench" / "results" / "planner.json"
DOC = ROOT / "docs" / "results.md"
DEVICES = ("watchos-extension", "watch-app-low")
WIDTH = 1.0  # the stack's width for every network
SHORT_STEP_S, SHORT_STEPS = 0.2, 21  # as bench/eager_race.py: short steps need many


def export(out: Path, network: str, sparse: bool, recompute: str, micro_batch: int,
           accumulation: int, update: str = "all", target: str = "host") -> Path:
    """An untrained export for `target` (host: this machine's kernels, the simulator's)."""
    run("export", "--model", network, "--width", str(WIDTH), "--epochs", "0",
        "--density", str(DENSITY if sparse else 1.0), "--recompute", recompute,
        "--micro-batch", str(micro_batch), "--accumulate", str(accumulation),
        "--update", update, "--target", target, "--out", str(out), "--json")
    return out


def measured_step(art: Path, batch: int, accumulation: int, steps: int,
                  device: str | None = None) -> dict:
    args = ["measure", str(art), "--batch", str(batch), "--accumulate", str(accumulation),
            "--steps", str(steps), "--no-select", "--json"]
    return json.loads(run_timed(*args, *(["--device", device] if device else [])))


def predicted_step_s(art: Path, batch: int, accumulation: int) -> float:
    from device_sim.hostprofile import host_speed
    from device_sim.planner import predicted_time_s
    from edgetrain import names
    from edgetrain.manifest import load_manifest

    m = load_manifest(art)
    train = str(art / m.files[names.TRAINING_MODEL].path)
    trained = sum(math.prod(t.shape) for t in m.trainable)
    return predicted_time_s(train, batch, accumulation, trained, host_speed(m.plan.threads))


def saved_rows() -> list[dict]:
    return load_results("planner", [])


def keep(row: dict) -> dict:
    """Save the row, stamped, with those before it (an interrupted run continues after it)."""
    row = {**row, **stamp()}
    save_results("planner", [*saved_rows(), row])
    print(json.dumps({k: v for k, v in row.items() if k != "candidates"}), flush=True)
    return row


def planner_rows(tmp: Path, done: set) -> list[dict]:
    if all(("planner", "C6", d) in done for d in DEVICES):
        return []
    c6 = next(c for c in STACK if c.name == "C6")
    art = export(tmp / "c6", c6.network, c6.sparse, c6.recompute, c6.micro_batch,
                 c6.accumulation, target="portable")  # the watch's graph: plan --device
    today = measured_step(art, c6.micro_batch, c6.accumulation, 1)
    rows = []
    for device in (d for d in DEVICES if ("planner", "C6", d) not in done):
        plot = ROOT / "docs" / "img" / f"plan-frontier-{device}.png"
        r = json.loads(run("plan", str(art), "--device", device, "--plot", str(plot),
                           "--json"))
        chosen = r["chosen"]
        rows.append(keep({"kind": "planner", "config": "C6", "device": device,
                     "budget_bytes": r["budget_bytes"], "items_per_step": r["effective_batch"],
                     "today_micro_batch": c6.micro_batch,
                     "today_step_time_s": today["step_time_s"],
                     "today_peak_bytes": today["peak_bytes"],
                     "today_fits": today["peak_bytes"] <= r["budget_bytes"],
                     "chosen": chosen, "runner_up": r["runner_up"], "reason": r["reason"],
                     "speedup": (today["step_time_s"] / chosen["measured_step_time_s"]
                                 if chosen else None),
                     "candidates": r["candidates"], "host": r["host"],
                     "frontier": str(plot.relative_to(ROOT))}))
    return rows


def latency_rows(tmp: Path, done: set, heavy: bool) -> list[dict]:
    rows = []
    for c in (c for c in part(STACK, heavy) if ("latency", c.name, None) not in done):
        update = "head" if c.update.startswith("auto") else c.update
        art = export(tmp / c.name, c.network, c.sparse, c.recompute, c.micro_batch,
                     c.accumulation, update)
        steps = 1 if c.accumulation > 64 or c.network == "resnet50" else 3
        got = measured_step(art, c.micro_batch, c.accumulation, steps)
        if got["step_time_s"] < SHORT_STEP_S:  # a few-millisecond step: the median of more
            got = measured_step(art, c.micro_batch, c.accumulation, SHORT_STEPS)
        pred = predicted_step_s(art, c.micro_batch, c.accumulation)
        rows.append(keep({"kind": "latency", "config": c.name, "network": c.network,
                          "update": update, "micro_batch": c.micro_batch,
                          "accumulation": c.accumulation,
                          "measured_step_time_s": got["step_time_s"],
                          "predicted_step_time_s": pred, "ratio": got["step_time_s"] / pred}))
    return rows


def repredict(tmp: Path) -> None:
    """The latency rows' predictions again (the cost model changed), their measurements kept."""
    rows = saved_rows()
    for r in rows:
        if r["kind"] == "latency":
            c = next(c for c in STACK if c.name == r["config"])
            art = export(tmp / c.name, c.network, c.sparse, c.recompute, c.micro_batch,
                         c.accumulation, r["update"])
            r["predicted_step_time_s"] = predicted_step_s(art, c.micro_batch, c.accumulation)
            r["ratio"] = r["measured_step_time_s"] / r["predicted_step_time_s"]
            print(json.dumps(r), flush=True)
    save_results("planner", rows)


def report(rows: list[dict]) -> None:
    lines = ["| device | budget | today: micro-batch 1 × 1,568 | measured peak | plan | "
             "measured peak | step time | windows/s | vs today |", "|---|---:|---:|---:|---|"
             "---:|---:|---:|---:|"]
    for r in (r for r in rows if r["kind"] == "planner"):
        c = r["chosen"]
        win = EFFECTIVE_BATCH / c["measured_step_time_s"] if c else 0
        today = (f"{r['today_step_time_s']:.1f} s ({EFFECTIVE_BATCH / r['today_step_time_s']:.2f}"
                 " windows/s)")
        fits = "" if r["today_fits"] else " (over budget)"
        lines.append(
            f"| `{r['device']}` | {r['budget_bytes']:,} | {today} | "
            f"{r['today_peak_bytes']:,}{fits} | "
            + (f"{c['micro_batch']} × {c['accumulation_steps']} | {c['measured_peak_bytes']:,} "
               f"| {c['measured_step_time_s']:.2f} s | {win:.1f} | {r['speedup']:.1f}× |"
               if c else f"none: {r['reason']} | | | | |"))
    why = why_mixed("planner", network_of)
    replace_table(DOC, lines, "planner", sources=["planner"], why_mixed=why)
    replace_table(DOC, step_table([r for r in rows if r["kind"] == "latency"],
                                  "measured_step_time_s", "predicted_step_time_s",
                                  ("measured step", "predicted (host model)",
                                   "measured / predicted")), "latency", sources=["planner"],
                  why_mixed=why)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--report", action="store_true", help="only rebuild the tables")
    ap.add_argument("--fresh", action="store_true", help="forget saved rows, measure all")
    ap.add_argument("--heavy", action="store_true", help=HEAVY_HELP)
    ap.add_argument("--repredict", action="store_true",
                    help="only predict the latency rows again (measurements kept)")
    args = ap.parse_args()
    if args.fresh:
        PLANNER_RESULTS.unlink(missing_ok=True)
    if args.repredict:
        with tempfile.TemporaryDirectory() as tmp:
            repredict(Path(tmp))
    elif not args.report:
        # a stopped run continues; rows of this run's part (bench/heavy.py) measured on other
        # code run again, the other part's rows are kept as they are (each carries its stamp)
        here = stamp()["commit"]
        save_results("planner", [r for r in saved_rows() if r.get("commit") == here
                                 and is_heavy(network_of(r)) == args.heavy]
                     + kept_rows("planner", args.heavy, network_of))
        done = {(r["kind"], r["config"], r.get("device")) for r in saved_rows()}
        with tempfile.TemporaryDirectory() as tmp:
            if not args.heavy:
                planner_rows(Path(tmp), done)
            latency_rows(Path(tmp), done, args.heavy)
        order = [c.name for c in STACK]
        save_results("planner", sorted(saved_rows(), key=lambda r: (
            r["kind"] == "latency", order.index(r["config"]))))
    report(saved_rows())


def network_of(row: dict) -> str:
    """The network a row measures (the planner rows: C6's patch MobileNet)."""
    return row.get("network", "patch_mobilenet")


if __name__ == "__main__":
    main()
