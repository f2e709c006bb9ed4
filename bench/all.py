"""Every benchmark in a fixed order, resumable, then every table from the saved results.

    .venv/bin/python bench/all.py              # `make results`: measure all, write the docs
    .venv/bin/python bench/all.py --list       # the steps, their estimates and state
    .venv/bin/python bench/all.py --report     # only rebuild the tables from bench/results/
    .venv/bin/python bench/all.py --only gradkernels,convbn   # these steps alone

Each step (bench/steps.py) runs as its own process from the repository root; its output goes
to .cache/results-logs/<step>.log. bench/results/progress.json records each finished step with
the code it measured (common.code_commit: the last commit that changed anything outside
docs/, bench/results/ and README.md, so committing results keeps it) and its time; a re-run
skips the steps finished on the same code and continues with the first that is not, so a
stopped run loses at most the step it was in. A run on other code (or on uncommitted changes)
starts again from the first step, saying so. A failed step stops the
run with exit status 1 and names its log. After the last step every table is rebuilt from the
saved results (each step's --report), the summary of docs/results.md and the README's figures
(bench/summary.py).
"""
from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
import time
from pathlib import Path

from common import RESULTS, ROOT, code_commit
from device_sim.layout import fix_address_layout
from steps import STEPS, Step, by_name

PROGRESS = RESULTS / "progress.json"
LOGS = ROOT / ".cache" / "results-logs"


def read_progress(code: str, fresh: bool, running: bool = True) -> dict:
    """The finished steps of a run on `code`; none for other code or --fresh. The time each
    step last took ("elapsed_s", on whatever code) is kept for the estimates."""
    old = load_progress()
    if old and not fresh and old.get("code") == code:
        return {"elapsed_s": {}, **old}
    if old and not fresh:
        print(f"bench/results/progress.json is of code {old.get('code')}; this is {code}: "
              + ("starting" if running else "a run would start") + " from the first step",
              flush=True)
    return {"code": code, "started": now(), "steps": {}, "elapsed_s": recorded_times()}


def load_progress() -> dict:
    """bench/results/progress.json as the last run left it ({} before any run)."""
    return json.loads(PROGRESS.read_text()) if PROGRESS.is_file() else {}


def recorded_times() -> dict[str, float]:
    """Each step's time in seconds as the last run of it measured it, on whatever code."""
    old = load_progress()
    return {**old.get("elapsed_s", {}),
            **{k: v["elapsed_s"] for k, v in old.get("steps", {}).items()}}


def now() -> str:
    return datetime.datetime.now().isoformat(timespec="seconds")


def write_progress(progress: dict) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    tmp = PROGRESS.with_suffix(".tmp")
    tmp.write_text(json.dumps(progress, indent=2))
    tmp.replace(PROGRESS)


def run_step(step: Step, report: bool = False) -> tuple[int, float, Path]:
    """Run one step (its --report form when `report`); exit status, seconds, log path."""
    LOGS.mkdir(parents=True, exist_ok=True)
    log = LOGS / f"{step.name}{'-report' if report else ''}.log"
    t0 = time.monotonic()
    with open(log, "w") as out:
        rc = subprocess.run([sys.executable, *step.argv(report)], cwd=ROOT, stdout=out,
                            stderr=subprocess.STDOUT).returncode
    return rc, time.monotonic() - t0, log


def chosen(only: str | None, full: bool) -> list[Step]:
    if only:
        return by_name([n.strip() for n in only.split(",") if n.strip()], STEPS)
    return [s for s in STEPS if full or not s.full]


def measure(steps: list[Step], progress: dict) -> int:
    """Run the steps not finished on this code, in order; 0, or 1 at the first failure."""
    for i, step in enumerate(steps, 1):
        if step.name in progress["steps"]:
            print(f"[{i}/{len(steps)}] {step.name}: done on this code, skipped", flush=True)
            continue
        print(f"[{i}/{len(steps)}] {step.name}: {' '.join(step.argv())} "
              f"(about {estimate_min(step, progress):.0f} min)", flush=True)
        rc, elapsed_s, log = run_step(step)
        if rc != 0:
            print(f"{step.name} failed (exit {rc}) after {elapsed_s:.0f} s; its log: {log}. "
                  "Mend it and run again: finished steps are kept.", file=sys.stderr)
            return 1
        progress["steps"][step.name] = {"elapsed_s": round(elapsed_s, 1), "finished": now()}
        progress["elapsed_s"][step.name] = round(elapsed_s, 1)
        write_progress(progress)
    return 0


def rebuild(steps: list[Step]) -> int:
    """Every step's tables from the saved results, then the summary and README figures."""
    seen = set()
    for step in steps:
        if step.report_args is None or tuple(step.argv(report=True)) in seen:
            continue  # steps of one script with one report (personalise_recipes) rebuild once
        seen.add(tuple(step.argv(report=True)))
        rc, _, log = run_step(step, report=True)
        if rc != 0:
            print(f"{step.name} --report failed (exit {rc}); its log: {log}", file=sys.stderr)
            return 1
    return subprocess.run([sys.executable, "bench/summary.py"], cwd=ROOT).returncode


def estimate_min(step: Step, progress: dict | None) -> float:
    """The step's time the last run measured (on any code), else bench/steps.py's estimate."""
    last = (progress or {}).get("elapsed_s", {}).get(step.name)
    return last / 60 if last is not None else step.estimate_min


def listing(steps: list[Step], progress: dict) -> list[str]:
    lines = []
    for s in steps:
        state = "done on this code" if s.name in progress["steps"] else "to run"
        lines.append(f"{s.name:42} {estimate_min(s, progress):6.0f} min  {state:18} "
                     f"{' '.join(s.argv())}{'  (--full)' if s.full else ''}")
    total = sum(estimate_min(s, progress) for s in steps)
    lines.append(f"{len(steps)} steps, about {total / 60:.1f} h on 2 cores (each step's time as "
                 "last measured where a run recorded it, else its estimate)")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--list", action="store_true", help="the steps and their state; run nothing")
    ap.add_argument("--report", action="store_true", help="only rebuild the tables")
    ap.add_argument("--only", help="comma-separated step names (see --list)")
    ap.add_argument("--full", action="store_true", help="also the heavy optional steps")
    ap.add_argument("--fresh", action="store_true", help="forget finished steps")
    a = ap.parse_args(argv)
    steps = chosen(a.only, a.full)
    if a.report:
        return rebuild(steps)
    progress = read_progress(code_commit(), a.fresh, running=not a.list)
    if a.list:
        print("\n".join(listing(steps, progress)))
        return 0
    # every step, and every command it starts, without address randomisation: the layout the
    # device commands would re-execute themselves to get (device_sim/layout.py), given once
    fix_address_layout()
    return measure(steps, progress) or rebuild(steps)


if __name__ == "__main__":
    sys.exit(main())
