"""The step-time model's fit (exporters/predictor/steptime.py) and how well it predicts.

    .venv/bin/python bench/time_model.py           # profile, fit, write the model and table
    .venv/bin/python bench/time_model.py --report  # the table from saved results

For each network of bench/recompute.py but ResNet-50 (its optimal export alone takes minutes;
the fit has ResNet-50's operators from the MobileNets), export at micro-batch 8 with recompute
`none`, `sqrt` and `optimal` (as the exporter at this commit plans them) and run RUNS training
steps (after WARMUP) with ORT's profiler on, in a torch-free child with the plan's threads.
Each profiled node gives (op, FLOPs, bytes, kernel seconds); FLOPs and bytes by
cost.node_costs on the shipped training graph. Steps are also timed without the profiler, at
least 0.5 s of them in a child of their own, in ROUNDS rounds alternating between the
network's plans (a plan's step: the median of the rounds' medians). The profiler slows
kernels as well as the executor, so where the profiled kernels add up to more than the
unprofiled step they are scaled down to it; where less, the executor's time per node is the
difference over the nodes. The fit on every network is written to
exporters/predictor/time_model.json (the model the exporter plans with; --report writes it
from the saved results). Held out: each
network's step times and plan-to-none ratios are predicted by a fit on the other networks'
profiles alone, beside the measured ones and the FLOP ratio.
"""
from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import onnx

from common import ROOT, measure_or_report, replace_table, stamp
from hostload import run_quiet
from recompute import BATCH, FIXED_PLANS, export
from edgetrain.names import FILES, TRAINING_MODEL
from exporters.predictor.cost import node_costs
from exporters.predictor.steptime import TIME_MODEL_FILE, fit_time_model

NETWORKS = ["imu_cnn", "imu_transformer", "tcn_probe", "encoder_probe", "mobilenet_v1",
            "patch_mobilenet"]
WARMUP, RUNS = 3, 12
ROUNDS = 3  # alternating timings of a network's plans; a plan's step is their median
PROFILES = ROOT / ".cache" / "time_model_profiles.json"  # the last run's per-node rows

PROFILER = """
import json, sys, time
import numpy as np
from edgetrain.ort_device import onnxruntime, training_api
from edgetrain.sessions import session_options
art, prefix, steps, warmup = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
api, ort = training_api(), onnxruntime()
man = json.load(open(art + "/manifest.json"))
so = session_options(ort, man["plan"]["threads"])
if prefix != "-":  # profile; else time the steps (one session a process: ORT's idle threads
    so.enable_profiling = True  # spin, and two sessions' would slow each other)
    so.profile_file_prefix = prefix
state = api.CheckpointState.load_checkpoint(art + "/checkpoint")
module = api.Module(art + "/training_model.onnx", state, art + "/eval_model.onnx",
                    session_options=so)
b = man["plan"]["micro_batch"]
x = np.random.default_rng(0).standard_normal((b, *man["input"]["sample_shape"]), np.float32)
y = np.zeros(b, np.int64)
module.train()
times = []
while len(times) < steps or prefix == "-" and sum(times[warmup:]) < 0.5:
    t0 = time.perf_counter()
    module(x, y)
    times.append(time.perf_counter() - t0)
print(json.dumps(times[warmup:]))
"""


def child(art: Path, mode: str) -> list[float]:
    """Run PROFILER on artifact `art` (mode: a profile file prefix, or "-" to time unprofiled
    steps); the seconds of its steps after WARMUP. Run while the host is quiet
    (hostload.run_quiet: a run that other processes shared the cores with is made again), as
    the fit is what the exporter plans with."""
    p, _ = run_quiet(lambda: subprocess.run(
        [sys.executable, "-c", PROFILER, str(art), mode, str(WARMUP + RUNS), str(WARMUP)],
        capture_output=True, text=True, cwd=ROOT))
    if p.returncode != 0:
        raise SystemExit(f"profiling {art.name} failed:\n{p.stderr[-2000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def profile(art: Path, tmp: Path) -> list[dict]:
    """ORT's profile events of WARMUP + RUNS training steps of artifact `art`."""
    prefix = tmp / f"{art.name}-profile"
    child(art, str(prefix))
    # the Module opens a training and an eval session with these options: two profiles,
    # the training one the larger (the eval session runs nothing)
    paths = sorted(tmp.glob(f"{prefix.name}*.json"), key=lambda q: q.stat().st_size)
    events = json.loads(paths[-1].read_text())
    for q in paths:
        q.unlink()
    return events


def steps_of(events: list[dict]) -> list[tuple[float, dict[str, float]]]:
    """Each profiled step after WARMUP: (its profiled seconds, {node name: kernel seconds})."""
    runs = sorted((e for e in events if e.get("name") == "model_run"), key=lambda e: e["ts"])
    kernels = [e for e in events if e.get("cat") == "Node"
               and e["name"].endswith("_kernel_time")]
    out = []
    for r in runs[WARMUP:]:
        inside = {}
        for e in kernels:
            if r["ts"] <= e["ts"] <= r["ts"] + r["dur"]:
                name = e["name"].removesuffix("_kernel_time")
                inside[name] = inside.get(name, 0.0) + e["dur"] * 1e-6
        out.append((r["dur"] * 1e-6, inside))
    return out


def network_rows(tmp: Path, net: str) -> list[dict]:
    """One row per plan: the step's unprofiled seconds, its nodes' (op, FLOPs, bytes, median
    kernel seconds), the executor's seconds per node and the plan's counted FLOPs."""
    arts = {plan: tmp / f"{net}-{plan}" for plan in FIXED_PLANS}
    for plan, art in arts.items():
        export(art, net, plan)
    plain: dict[str, list[float]] = {plan: [] for plan in arts}
    for _ in range(ROUNDS):  # alternating, so drifts in machine load hit every plan alike
        for plan, art in arts.items():
            plain[plan].append(statistics.median(child(art, "-")))
    rows = []
    for plan, art in arts.items():
        steps = steps_of(profile(art, tmp))
        costs = node_costs(onnx.load(str(art / FILES[TRAINING_MODEL])), BATCH)
        step_s = statistics.median(plain[plan])
        kernel_s = statistics.median(sum(k.values()) for _, k in steps)
        # the profiler slows kernels too (it gathers each parallel kernel's thread stats):
        # where its kernels add up to more than the unprofiled step, they are scaled to it
        scale = min(1.0, step_s / kernel_s)
        nodes = []
        for name, op, f, b in costs:
            times = [k[name] for _, k in steps if name in k]
            if times:
                nodes.append([op, f, b, statistics.median(times) * scale])
        rows.append({"network": net, "plan": plan, "step_s": step_s,
                     "overhead_s": max(0.0, step_s - kernel_s) / max(1, len(costs)),
                     "flops": sum(f for _, _, f, _ in costs), "costs": costs, "nodes": nodes})
        print(f"{net} {plan}: {step_s * 1e3:.1f} ms, {len(nodes)} of {len(costs)} nodes "
              "profiled", flush=True)
    return rows


def fit(rows: list[dict], fitted_on: dict | None = None):
    samples = [tuple(n) for r in rows for n in r["nodes"]]
    return fit_time_model(samples, statistics.median(r["overhead_s"] for r in rows), fitted_on)


def held_out(rows: list[dict]) -> list[dict]:
    """Per network and plan: measured and predicted step seconds and ratios to none, the
    prediction by a fit on the other networks."""
    out = []
    for net in dict.fromkeys(r["network"] for r in rows):
        model = fit([r for r in rows if r["network"] != net])
        mine = {r["plan"]: r for r in rows if r["network"] == net}
        none = mine["none"]
        for plan, r in mine.items():
            predicted = model.step_time_s(r["costs"])
            out.append({"network": net, "plan": plan, "step_s": round(r["step_s"], 5),
                        "predicted_step_s": round(predicted, 5),
                        "time_ratio": round(r["step_s"] / none["step_s"], 3),
                        "predicted_time_ratio": round(
                            predicted / model.step_time_s(none["costs"]), 3),
                        "flop_ratio": round(r["flops"] / none["flops"], 3)})
    return out


def measure() -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        rows = [r for net in NETWORKS for r in network_rows(Path(tmp), net)]
    PROFILES.parent.mkdir(exist_ok=True)
    PROFILES.write_text(json.dumps(rows))  # for refitting by hand; not a result
    model = fit(rows, {**stamp(), "threads": 2, "micro_batch": BATCH, "networks": NETWORKS})
    return {"held_out": held_out(rows), "model": model.to_dict()}


def table(result: dict) -> str:
    lines = ["| network | plan | measured step | predicted (held out) | measured vs none "
             "| predicted vs none | FLOPs vs none |", "|---|---|---:|---:|---:|---:|---:|"]
    for r in result["held_out"]:
        lines.append(f"| {r['network']} | {r['plan']} | {r['step_s'] * 1e3:.1f} ms | "
                     f"{r['predicted_step_s'] * 1e3:.1f} ms | {r['time_ratio']:.2f}x | "
                     f"{r['predicted_time_ratio']:.2f}x | {r['flop_ratio']:.2f}x |")
    return "\n".join(lines)


def report(result: dict) -> None:
    """The table, and the fit written where the exporter reads it (after the results are
    saved: the file is code, and the results' stamp is of the code they were measured at)."""
    text = json.dumps(result["model"], indent=2) + "\n"
    if not TIME_MODEL_FILE.is_file() or TIME_MODEL_FILE.read_text() != text:
        TIME_MODEL_FILE.write_text(text)
        print(f"wrote {TIME_MODEL_FILE.relative_to(ROOT)}", flush=True)
    replace_table(ROOT / "docs" / "recompute.md", table(result).splitlines(), name="time_model",
                  sources=["time_model"])


if __name__ == "__main__":
    measure_or_report("time_model", measure, report, __doc__.splitlines()[0])
