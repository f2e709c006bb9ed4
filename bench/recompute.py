"""Recompute plans at batch 8: measured peak, activation bytes and step time.

    .venv/bin/python bench/recompute.py           # MobileNet v1, patch MobileNet
    .venv/bin/python bench/recompute.py --heavy   # ResNet-50 alone (bench/heavy.py)
    .venv/bin/python bench/recompute.py --report  # the table from saved results

For each network (the built-in ones and two probes, bench/probe_models.py: a TCN and a
transformer encoder exported through the Python API): export with recompute `none`, `sqrt`
and `optimal` (its default time budget, 1.3x the step's predicted time; no pretraining:
weights do not change memory or time) and measure each; for the image networks, then export
with the `budget` planner at three budgets between the measured `sqrt` and `none` peaks (10%,
50% and 90% of the way) and measure each under its budget as a cap (a plan that did not fit
would fail the run); a budget for which the planner finds no plan that leaves its headroom
free is a row with the planner's refusal, as a user gets it (when the budget is that close to
`sqrt`'s peak). Every
export is made first; then ROUNDS rounds each measure every plan once, one after another
(each measurement a fresh process timing STEPS steps, its figure their median). A plan's
step time is the fastest of its rounds; its time ratio to `none` (and to `sqrt`) is the
median over rounds of the ratio within a round (paired_ratio): this host's speed moves for
minutes at a time (the patch MobileNet's `none` ran 11.3-12.7 ms a step in six processes at
one time and 16.4-19.8 ms in seven half an hour later), so each plan's fastest compared
moments apart (its `optimal` plan measured 1.37x and 1.49x, then 0.71x its `none` in three
runs that way). Where `none`'s step is shorter than SHORT_STEP_S, a measurement times more
steps (steps_for) and each plan gets SHORT_ROUNDS rounds (rounds_for): a round then costs
little beyond starting the processes. Each measurement is watched for what else the host
did (bench/hostload.py): one during which other processes used more than a small share of a
core, or the hypervisor took CPU time, is run again once the host is quiet, up to 3 tries,
and rows keep what each kept measurement saw (host_load_runs). Writes
bench/results/recompute.json, the table in docs/recompute.md and
its guards (issue 41's checks: optimal <= sqrt <= none in measured activations, optimal's
step time within 1.3x + 5%, its predicted peak's error).
"""
from __future__ import annotations

import json
import statistics
import subprocess
import tempfile
from pathlib import Path

import onnx

from edgetrain.names import FILES, MANIFEST_NAME, TRAINING_MODEL
from exporters.plans.recompute.counting import count_step
from exporters.predictor.cost import node_costs
from exporters.predictor.steptime import host_time_model
from common import CLI, ROOT, measure_or_report, replace_table, run
from hostload import run_quiet
from heavy import HEAVY_HELP, kept_rows, part, why_mixed
from probe_models import PROBES, export_probe

NETWORKS = ["imu_cnn", "imu_transformer", "tcn_probe", "encoder_probe", "mobilenet_v1",
            "patch_mobilenet", "resnet50"]
BUDGET_NETWORKS = ("mobilenet_v1", "patch_mobilenet", "resnet50")  # with budget rows
FIXED_PLANS = ("none", "sqrt", "optimal")  # planners without a byte budget
TIME_RATIO, TIME_NOISE = 1.3, 0.05  # optimal's default budget; the guard's allowance
BUDGET_FRACTIONS = (0.1, 0.5, 0.9)  # of the way from the sqrt peak to the none peak
BATCH, ROUNDS, STEPS = 8, 5, 5  # 3 rounds of ResNet-50's 2-s step: 1.39x, 1.48x, 1.16x
TIMED_S, MAX_STEPS = 0.5, 100  # short steps: timed for about this long (steps_for)
SHORT_ROUNDS = 7  # rounds where a step is short (rounds_for)
SHORT_STEP_S = TIMED_S / STEPS  # a step shorter than this is short


REFUSAL = "error: no recompute plan fits the budget"  # the budget planner's answer


def export(art: Path, net: str, planner: str, budget: int | None = None) -> dict | str:
    """The artifact's manifest; for a budget no plan fits with the planner's headroom, the
    planner's refusal (its error, which the table shows: that is what a user gets)."""
    if net in PROBES:
        return export_probe(net, art, planner, BATCH)
    extra = ["--budget", str(budget)] if budget else []
    p = subprocess.run([*CLI, "export", "--model", net, "--epochs", "0", "--no-cache",
                        "--recompute", planner, "--micro-batch", str(BATCH), "--out", str(art),
                        *extra], capture_output=True, text=True, cwd=ROOT)
    refusal = next((line for line in p.stderr.splitlines() if line.startswith(REFUSAL)), None)
    if p.returncode != 0 and budget and refusal:
        return refusal.removeprefix("error: ")
    if p.returncode != 0:
        raise SystemExit(f"export {net} --recompute {planner} failed:\n{p.stderr[-2000:]}")
    return json.loads((art / MANIFEST_NAME).read_text())


def measure(art: Path, budget: int | None, steps: int = STEPS) -> dict:
    """`edgetrain measure --json` of the artifact, run while the host is quiet (run_quiet),
    with what the host did beside it under "host_load"."""
    extra = ["--budget", str(budget)] if budget else []
    out, load = run_quiet(lambda: run("measure", str(art), "--batch", str(BATCH), "--steps",
                                      str(steps), "--json", *extra))
    return {**json.loads(out), "host_load": load}


def fastest(runs: list[dict]) -> float:
    """A plan's step time: the fastest of its rounds (each round's figure the median step of
    one measuring process)."""
    return min(r["step_time_s"] for r in runs)


def paired_ratio(times_s: list[float], base_times_s: list[float]) -> tuple[float, list[float]]:
    """A plan's step time over another's: the median over rounds of the ratio of the two
    plans' figures in the same round (round k's of each), and those ratios. The plans of a
    round are measured one after the other, so the host's speed of the moment (which moves
    for minutes at a time on this VM) cancels; the fastest of each plan compares moments
    that may be minutes apart."""
    ratios = [t / b for t, b in zip(times_s, base_times_s)]
    return statistics.median(ratios), ratios


def with_time_ratios(rows: list[dict]) -> list[dict]:
    """Rows with time_ratio (against `none`), time_vs_sqrt and time_ratio_rounds, from their
    step_times_s (paired_ratio against the same network's `none` and `sqrt` rows); rows kept
    from an earlier run are given them anew, so that every row is judged alike."""
    timed = {(r["network"], r["plan"]): r["step_times_s"] for r in rows if "step_times_s" in r}
    out = []
    for r in rows:
        if "step_times_s" not in r:
            out.append(r)
            continue
        vs_none, rounds = paired_ratio(r["step_times_s"], timed[(r["network"], "none")])
        vs_sqrt, _ = paired_ratio(r["step_times_s"], timed[(r["network"], "sqrt")])
        out.append({**r, "time_ratio": round(vs_none, 3), "time_vs_sqrt": round(vs_sqrt, 3),
                    "time_ratio_rounds": [round(x, 3) for x in rounds]})
    return out


def predicted_time_ratio(art: Path) -> float:
    """The step-time model's ratio of the artifact's step with its recompute copies to the
    step without them (what `optimal`'s budget bounds), on its training graph as shipped."""
    graph = onnx.load(str(art / FILES[TRAINING_MODEL]))
    return count_step(node_costs(graph, BATCH), host_time_model()).time_ratio()


def steps_for(step_time_s: float) -> int:
    """Steps a measurement times: STEPS, or enough for about TIMED_S seconds where a step is
    short (a few-ms step on 2 shared cores moved 2-3x between rounds over 5 steps)."""
    return max(STEPS, min(MAX_STEPS, round(TIMED_S / max(step_time_s, 1e-4))))


def rounds_for(step_time_s: float) -> int:
    """Rounds per plan: ROUNDS, or SHORT_ROUNDS where `none`'s step is short (a round is
    then mostly the processes' start, and a short step's paired ratios spread the most)."""
    return ROUNDS if step_time_s >= SHORT_STEP_S else SHORT_ROUNDS


def bench_network(tmp: Path, net: str) -> list[dict]:
    plans = {p: {"art": tmp / f"{net}-{p}", "budget": None} for p in FIXED_PLANS}
    for name, p in plans.items():
        p["manifest"] = export(p["art"], net, name)
    # a first measurement of none and sqrt, before the rounds: the steps and rounds to time,
    # and the peaks the budgets lie between (a plan's peak is the same in every run)
    first = {p: measure(plans[p]["art"], None) for p in ("none", "sqrt")}
    steps, rounds = (steps_for(first["none"]["step_time_s"]),
                     rounds_for(first["none"]["step_time_s"]))
    none_peak, sqrt_peak = first["none"]["peak_bytes"], first["sqrt"]["peak_bytes"]
    refused = []
    for f in BUDGET_FRACTIONS if net in BUDGET_NETWORKS else ():
        budget = int(sqrt_peak + f * (none_peak - sqrt_peak))
        name = f"budget@{f:.0%}"
        art = tmp / f"{net}-{name}"
        manifest = export(art, net, "budget", budget)
        if isinstance(manifest, str):  # refused: a row of its own, nothing to measure
            refused.append({"network": net, "plan": name, "batch": BATCH,
                            "budget_bytes": budget, "refused": manifest})
            continue
        plans[name] = {"art": art, "budget": budget, "manifest": manifest}
    for p in plans.values():
        p["runs"] = []
    for _ in range(rounds):  # every export done: a round measures the plans one after another
        for p in plans.values():
            p["runs"].append(measure(p["art"], p["budget"], steps))
    base = plans["none"]["runs"][0]
    rows = []
    for name, p in plans.items():
        r = p["runs"][0]
        rows.append({
            "network": net, "plan": name, "batch": BATCH, "budget_bytes": p["budget"],
            "checkpoints": len(p["manifest"]["plan"]["checkpoints"]),
            "recomputed_tensors": len(p["manifest"]["plan"]["recomputed"]),
            "extra_flops": r["recompute"]["extra_flops"],
            "peak_bytes": r["peak_bytes"],
            "peak_runs_bytes": [x["peak_bytes"] for x in p["runs"]],
            "within_budget": p["budget"] is None or max(x["peak_bytes"] for x in p["runs"])
            <= p["budget"],
            "predicted_peak_bytes": r["predicted_peak_bytes"],
            "activation_bytes": r["breakdown"]["activations"],
            "predicted_activation_bytes": r["predicted_breakdown"]["activations"],
            "activation_cut_ratio": round(base["breakdown"]["activations"]
                                          / r["breakdown"]["activations"], 3),
            "predicted_time_ratio": round(predicted_time_ratio(p["art"]), 3),
            "steps": steps, "step_time_s": round(fastest(p["runs"]), 4),
            "step_times_s": [x["step_time_s"] for x in p["runs"]],
            "host_load_runs": [x["host_load"] for x in p["runs"]]})
    rows = with_time_ratios(rows)
    for row in rows:
        print(json.dumps(row), flush=True)
    order = [*FIXED_PLANS, *(f"budget@{f:.0%}" for f in BUDGET_FRACTIONS)]
    return sorted(rows + refused, key=lambda r: order.index(r["plan"]))


def table(rows: list[dict]) -> str:
    lines = ["| network | plan | budget | checkpoints / recomputed | extra GFLOP | measured peak "
             "| predicted peak | measured activations | activations cut | step time "
             "| vs none | vs sqrt |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        budget = "-" if r["budget_bytes"] is None else f"{r['budget_bytes']:,}"
        if r.get("refused"):
            lines.append(f"| {r['network']} | {r['plan']} | {budget} | refused: "
                         f"{r['refused'].split(': ', 1)[-1].split('. ')[0]} |" + " |" * 8)
            continue
        fits = "" if r["within_budget"] else " **over**"
        lines.append(
            f"| {r['network']} | {r['plan']} | {budget} | {r['checkpoints']} / "
            f"{r['recomputed_tensors']} | {r['extra_flops'] / 1e9:.2f} | {r['peak_bytes']:,}{fits} "
            f"| {r['predicted_peak_bytes']:,} | {r['activation_bytes']:,} "
            f"| {r['activation_cut_ratio']:.2f}x | {r['step_time_s'] * 1e3:.0f} ms "
            f"| {r['time_ratio']:.2f}x | {r['time_vs_sqrt']:.2f}x |")
    return "\n".join(lines)


def guards(rows: list[dict]) -> list[dict]:
    """Issue 41's checks per network: measured activations optimal <= sqrt <= none, optimal's
    measured step time within TIME_RATIO (+TIME_NOISE), its predicted peak's error."""
    out = []
    for net in dict.fromkeys(r["network"] for r in rows):
        plan = {r["plan"]: r for r in rows if r["network"] == net and not r.get("refused")}
        if not all(p in plan for p in FIXED_PLANS):
            continue
        acts = [plan[p]["activation_bytes"] for p in FIXED_PLANS]
        opt = plan["optimal"]
        out.append({"network": net, "activations": acts,
                    "ordered": acts[2] <= acts[1] <= acts[0],
                    "optimal_time_ratio": opt["time_ratio"],
                    "optimal_predicted_time_ratio": opt.get("predicted_time_ratio"),
                    "within_time": opt["time_ratio"] <= TIME_RATIO + TIME_NOISE,
                    "optimal_peak_error_ratio": round(opt["predicted_peak_bytes"]
                                                      / opt["peak_bytes"] - 1, 4),
                    "busy_runs": busy_runs(plan.values())})
    return out


def busy_runs(rows) -> str:
    """"k of n": how many of the rows' kept measurements ran while the host was busy (after
    run_quiet's tries), or "-" for rows measured before host load was recorded."""
    loads = [x for r in rows for x in r.get("host_load_runs") or []]
    return f"{sum(not x['quiet'] for x in loads)} of {len(loads)}" if loads else "-"


def guard_table(rows: list[dict]) -> str:
    lines = ["| network | none | sqrt | optimal | optimal <= sqrt <= none | optimal's time "
             f"(<= {TIME_RATIO + TIME_NOISE:.2f}x) | its predicted time | optimal's predicted "
             "peak | timed with the host busy |", "|---|---:|---:|---:|---|---:|---:|---:|---:|"]
    for g in guards(rows):
        lines.append(f"| {g['network']} | " + " | ".join(f"{a:,}" for a in g["activations"])
                     + f" | {'yes' if g['ordered'] else '**no**'} | "
                     f"{g['optimal_time_ratio']:.2f}x{'' if g['within_time'] else ' **over**'}"
                     f" | {_ratio(g['optimal_predicted_time_ratio'])} | "
                     f"{g['optimal_peak_error_ratio']:+.1%} | {g['busy_runs']} |")
    return "\n".join(lines)


def _ratio(r: float | None) -> str:
    return "-" if r is None else f"{r:.2f}x"


def network_of(row: dict) -> str:
    return row["network"]


def measure_all(heavy: bool) -> list[dict]:
    """This run's part of the networks measured, the other part's saved rows kept, in
    NETWORKS order."""
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for net in part(NETWORKS, heavy):
            rows += bench_network(Path(tmp), net)
    rows += with_time_ratios(kept_rows("recompute", heavy, network_of))
    return sorted(rows, key=lambda r: NETWORKS.index(r["network"]))


def report(rows: list[dict]) -> None:
    why = why_mixed("recompute", network_of)
    replace_table(ROOT / "docs" / "recompute.md", table(rows).splitlines(),
                  sources=["recompute"], why_mixed=why)
    replace_table(ROOT / "docs" / "recompute.md", guard_table(rows).splitlines(),
                  sources=["recompute"], why_mixed=why, name="guards")


if __name__ == "__main__":
    measure_or_report("recompute", measure_all, report, __doc__.splitlines()[0], HEAVY_HELP)
