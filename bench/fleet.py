"""The fleet at scale: Ray's own cost per task, throughput at 1 and 2 workers, 1,000+ users.

    .venv/bin/python bench/fleet.py            # ~9 min on 2 cores; continues a stopped run
    .venv/bin/python bench/fleet.py --heavy    # 4.'s one-worker run alone (~12 min; --full)
    .venv/bin/python bench/fleet.py --report   # the tables from saved results

1. The artifact: imu_cnn pretrained on subjects 1-7 (8, 9 and 10 held out: the fleet's real
   users and the sources of its synthetic ones), training its head:
   `edgetrain export --model imu_cnn --also-holdout 8,9 --update head --out artifacts/imu_fleet`.
2. Ray's cost per task at our task size, on the embedded local Ray with 2 CPUs: TASKS empty
   tasks with max_calls=1 (a fresh worker process each), the same with workers reused (Ray's
   scheduling alone), and with workers reused, each task forking one child from its worker's
   fork server (as the fleet runs them, device_sim/fleetproc.py).
3. Throughput: the same THROUGHPUT_USERS synthetic users on watch-app-low, 1 worker, 2 workers,
   and 1 worker with the command and every process it starts (Ray's too) confined to core 0
   (fresh fleet folders, `edgetrain fleet --workers N`): personalisations per hour, wall clock
   from the command's start (Ray's start included) to its end, and from the first task's start
   to the last task's end; the CPU-seconds every process spent (/proc/stat).
4. examples/fleet-1000.json (1,003 users on a mix of four devices, micro-batch chosen by the
   planner per device) to completion on 2 workers (its report and pictures:
   docs/img/fleet-gains.png, fleet-peaks.png, fleet-timeline.png), and with `--heavy` on 1
   (HEAVY_PARTS: `bench/all.py --full` runs it; a default run keeps its saved part).
Results: bench/results/fleet.json; tables in docs/results.md (marker `fleet`). Nothing else
should run meanwhile.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

from common import CLI, ROOT, load_results, replace_table, run, save_results, stamp
from heavy import split_at_two_commits

DOC = ROOT / "docs" / "results.md"
ART = ROOT / "artifacts" / "imu_fleet"
WORK = ROOT / "runs" / "bench-fleet"
TASKS = 40
OVERHEAD_LABELS = {"fresh_process": "fresh process", "reused_worker": "reused worker",
                   "reused_worker_forked_child": "reused worker, a forked child: as the fleet "
                                                 "runs"}
THROUGHPUT_USERS = 60
# The 1,003 users again on one worker (about 12 minutes) is measured by `bench/all.py --full`
# only (`--heavy`); a default run keeps its saved part, and the table then names both commits.
HEAVY_PARTS = ("fleet_1000_one_worker",)
HEAVY_WHY = ("examples/fleet-1000.json on one worker is measured by `bench/all.py --full` only, "
             "the other parts by every `make results`")


def export() -> None:
    if not (ART / "manifest.json").is_file():
        run("export", "--model", "imu_cnn", "--also-holdout", "8,9", "--update", "head",
            "--out", str(ART), "--json")


def ray_overhead() -> dict:
    import ray

    def empty() -> int:
        return os.getpid()

    def forked() -> int:  # what the fleet does per run: a child of the worker's fork server
        from device_sim.fleetproc import fork_run

        return fork_run(os.getpid, ())[0]

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        out = {}
        for label, remote in (("fresh_process", ray.remote(max_calls=1)(empty)),
                              ("reused_worker", ray.remote(empty)),
                              ("reused_worker_forked_child", ray.remote(forked))):
            ray.get([remote.remote() for _ in range(4)])  # workers started once
            t0 = time.perf_counter()
            pids = ray.get([remote.remote() for _ in range(TASKS)])
            wall = time.perf_counter() - t0
            out[label] = {"tasks": TASKS, "wall_s": wall, "cpus": 2,
                          "cpu_s_per_task": wall * 2 / TASKS, "processes": len(set(pids))}
        return out
    finally:
        ray.shutdown()


def busy_cpu_s() -> float:
    """CPU-seconds every core has spent busy since boot (/proc/stat: user, nice, system, irq,
    softirq), so a run's whole cost is counted: its workers, Ray's own processes, the driver."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return (v[0] + v[1] + v[2] + v[5] + v[6]) / os.sysconf("SC_CLK_TCK")


def fleet(spec: dict | Path, name: str, workers: int, one_core: bool = False) -> dict:
    out = WORK / name
    shutil.rmtree(out, ignore_errors=True)
    if isinstance(spec, dict):
        path = WORK / f"{name}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(spec))
        spec = path
    t0, c0 = time.perf_counter(), busy_cpu_s()
    args = ["fleet", str(spec), "--out", str(out), "--workers", str(workers), "--plots",
            str(out / "plots"), "--json"]
    if one_core:  # the command and every process it starts (Ray's too) on core 0
        p = subprocess.run([*CLI, *args], capture_output=True, text=True, cwd=ROOT, check=True,
                           preexec_fn=lambda: os.sched_setaffinity(0, {0}))
        doc = json.loads(p.stdout)
    else:
        doc = json.loads(run(*args))
    wall, cpu = time.perf_counter() - t0, busy_cpu_s() - c0
    rep = doc["report"]
    n = doc["scheduled"]
    span = (rep["last_end"] - rep["first_start"]) if rep["first_start"] else None
    return {"name": name, "workers": workers, "one_core": one_core, "runs": n, "wall_s": wall,
            "runs_per_hour": n / wall * 3600, "cpu_s": cpu, "cpu_s_per_run": cpu / max(1, n),
            "cores_busy": cpu / wall, "span_s": span,
            "steady_runs_per_hour": n / span * 3600 if span else None, "failed": doc["failed"],
            "report": {k: v for k, v in rep.items() if k != "users"}, "out": str(out),
            "plots": doc["plots"]}


def throughput_spec() -> dict:
    return {"artifact": str(ART), "users": {"synthetic": THROUGHPUT_USERS, "seed": 1,
                                            "sources": [8, 9, 10]},
            "devices": {"watch-app-low": 1}, "micro_batch": {"*": 8},
            "personalise": {"epochs": 3}, "threads": 1}


def report(r: dict) -> None:
    rows = ["| measurement | value |", "|---|---:|"]
    o = r.get("ray_overhead")
    if o:
        for k, v in ((k, v) for k, v in o.items() if isinstance(v, dict)):  # not its stamp
            rows.append(f"| Ray, an empty task ({OVERHEAD_LABELS.get(k, k)}, {v['tasks']} tasks "
                        f"on 2 CPUs): CPU-seconds a task | {v['cpu_s_per_task']:.3f} s |")
    for name in ("throughput_1", "throughput_2", "throughput_1_one_core"):
        t = r.get(name)
        if t:
            where = (", everything on one core (Ray's processes too)" if t.get("one_core")
                     else "")
            rows.append(f"| {t['runs']} users on watch-app-low, {t['workers']} worker(s){where}: "
                        f"wall (runs/hour) | {t['wall_s']:.1f} s ({t['runs_per_hour']:.0f}) |")
            if t.get("cpu_s"):
                rows.append(f"| … first task's start to last task's end (runs/hour) | "
                            f"{t['span_s']:.1f} s ({t['steady_runs_per_hour']:.0f}) |")
                rows.append(f"| … CPU-seconds a run, all processes (cores busy on average) | "
                            f"{t['cpu_s_per_run']:.2f} ({t['cores_busy']:.2f}) |")
    if r.get("throughput_1") and r.get("throughput_2"):
        t1, t2 = r["throughput_1"], r["throughput_2"]
        rows.append(f"| 2 workers ÷ 1 worker, runs per hour: wall clock (first start to last "
                    f"end) | {t2['runs_per_hour'] / t1['runs_per_hour']:.2f}× "
                    + (f"({t2['steady_runs_per_hour'] / t1['steady_runs_per_hour']:.2f}×)"
                       if t1.get("span_s") and t2.get("span_s") else "") + " |")
    if r.get("throughput_1_one_core") and r.get("throughput_2"):
        t1, t2 = r["throughput_1_one_core"], r["throughput_2"]
        rows.append(f"| 2 workers on 2 cores ÷ 1 worker on 1 core, runs per hour: wall clock "
                    f"(first start to last end) | "
                    f"{t2['runs_per_hour'] / t1['runs_per_hour']:.2f}× "
                    f"({t2['steady_runs_per_hour'] / t1['steady_runs_per_hour']:.2f}×) |")
    big = r.get("fleet_1000")
    for key, w in (("fleet_1000_one_worker", 1), ("fleet_1000", 2)):
        if r.get(key):
            f = r[key]
            rows.append(f"| examples/fleet-1000.json, {w} worker(s): {f['runs']} users | "
                        f"{f['wall_s'] / 60:.1f} min ({f['runs_per_hour']:.0f} users/hour) |")
    if big and r.get("fleet_1000_one_worker"):
        rows.append(f"| examples/fleet-1000.json, 2 workers ÷ 1 worker, users per hour | "
                    f"{r['fleet_1000_one_worker']['wall_s'] / big['wall_s']:.2f}× |")
    lines = ["\n".join(rows)]
    if big:
        lines.append("")
        lines.append("| device | budget | users (real + synthetic) | trained | does not fit | "
                     "peak, median (max) | step, median | gain median [p10, p90] | gained / "
                     "lost / same | guard kept the population model |")
        lines.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for d, s in big["report"]["devices"].items():
            for kind in ("real", "synthetic"):
                g = s[kind]
                if not g["users"]:
                    continue
                pk, st, gn = g["peak_bytes"], g["step_time_s"], g["gain_points"]
                lines.append(
                    f"| {d} | {s['budget_bytes'] / 2**20:.2f} MiB | {g['users']} {kind} | "
                    f"{g['trained']} | {g['does_not_fit']} | "
                    + (f"{pk['median'] / 2**20:.2f} ({pk['max'] / 2**20:.2f}) MiB" if pk else "")
                    + " | " + (f"{st['median'] * 1e3:.1f} ms" if st else "") + " | "
                    + (f"{gn['median']:+.1f} [{gn['p10']:+.1f}, {gn['p90']:+.1f}]" if gn else "")
                    + f" | {g['gained']} / {g['lost']} / {g['unchanged']} | "
                    f"{g['guard'].get('kept population', 0)} |")
    replace_table(DOC, lines, "fleet", sources=["fleet"], why_mixed=why_mixed(r))


def why_mixed(r: dict) -> str | None:
    """HEAVY_WHY when the heavy parts were measured at one commit and the others at another."""
    commits = {heavy: {v.get("commit") for k, v in r.items()
                       if isinstance(v, dict) and (k in HEAVY_PARTS) == heavy}
               for heavy in (True, False)}
    return HEAVY_WHY if split_at_two_commits(commits[True], commits[False]) else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--report", action="store_true", help="only rebuild the tables")
    ap.add_argument("--heavy", action="store_true", help="measure only examples/fleet-1000.json "
                    "on one worker (bench/all.py --full runs this), keeping the other saved "
                    "parts; without it, every part but that one")
    args = ap.parse_args()
    r = load_results("fleet", {})
    if not args.report:
        export()
        steps = [("ray_overhead", ray_overhead),
                 ("throughput_1", lambda: fleet(throughput_spec(), "throughput-1", 1)),
                 ("throughput_2", lambda: fleet(throughput_spec(), "throughput-2", 2)),
                 ("throughput_1_one_core",
                  lambda: fleet(throughput_spec(), "throughput-1-one-core", 1, one_core=True)),
                 ("fleet_1000", lambda: fleet(ROOT / "examples" / "fleet-1000.json",
                                              "fleet-1000", 2)),
                 ("fleet_1000_one_worker", lambda: fleet(ROOT / "examples" / "fleet-1000.json",
                                                         "fleet-1000-one-worker", 1))]
        here = stamp()  # a stopped run continues; parts measured on other code run again
        for key, fn in steps:
            if (key in HEAVY_PARTS) != args.heavy:
                continue  # the other run's part: its saved rows stay, with their stamps
            if r.get(key, {}).get("commit") != here["commit"]:
                r[key] = {**fn(), **here}
                save_results("fleet", r)
                print(key, json.dumps(r[key])[:400], flush=True)
                if key == "fleet_1000":  # its pictures, from the run just made (the saved
                    for pic in r[key]["plots"]:  # paths are this machine's)
                        shutil.copy(pic, ROOT / "docs" / "img" / f"fleet-{Path(pic).name}")
    report(r)


if __name__ == "__main__":
    main()
