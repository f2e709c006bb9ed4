"""What the benchmarks share: the repository root, the `edgetrain` CLI run as a user runs it,
results written as JSON under bench/results/ (each file stamped with the commit, the date, the
machine and the command that measured it), and tables replaced between markers in docs/, each
under a line saying where its rows were measured (and refusing rows of several commits unless
the table says why).
"""
from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-m", "edgetrain.cli"]


def run(*args: str) -> str:
    """Run `edgetrain ARGS` from the repository root; its stdout, or exit with its stderr."""
    p = subprocess.run([*CLI, *args], capture_output=True, text=True, cwd=ROOT)
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed:\n{p.stderr[-2000:]}")
    return p.stdout


def run_timed(*args: str) -> str:
    """run(), for a command whose step time a table shows: made again, up to 3 tries, where
    other processes shared the host with it (hostload.run_quiet)."""
    from hostload import run_quiet

    return run_quiet(lambda: run(*args))[0]


def run_warm(*args: str) -> str:
    """run(), the command forked from a warm process instead of a fresh Python
    (device_sim/warmcli.py): for benches that run thousands of short device commands."""
    from device_sim import warmcli

    p = warmcli.run(*args)
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed:\n{p.stderr[-2000:]}")
    return p.stdout


RESULTS = ROOT / "bench" / "results"
# A step of this many micro-batches or more is its own warm-up: only its first micro-batch grows
# the arena, so benches time it without an untimed step first (C6 and C7: 1,568). Measured at 3
# steps: C7's first portable step took 7.69 s, the next two 8.43 and 7.69 s; PyTorch eager's
# 10.37, 13.15 and 10.37 s.
WARM_IN_STEP = 100
FORMAT = 1  # of the stamped files save_results writes; a bare list or dict is an older file


def command_line() -> str:
    """The command this process was started with, as a user would type it from the root."""
    script = Path(sys.argv[0])
    name = script.relative_to(ROOT) if script.is_absolute() and ROOT in script.parents else script
    return " ".join([".venv/bin/python", str(name), *sys.argv[1:]])


def save_results(name: str, rows: list[dict] | dict, derived: bool = False) -> None:
    """Write rows to bench/results/<name>.json under this run's stamp and command. `derived`
    rows (computed from other results, as the reports do) equal to those the file holds leave
    it as it is: a report rebuilt from the same results keeps the stamp of where they were
    made, not of when the tables were last written. Measured rows are always stamped anew."""
    old = read_stamped(name) if derived else None
    if old is not None and old["stamp"] and old["results"] == json.loads(json.dumps(rows)):
        return
    RESULTS.mkdir(parents=True, exist_ok=True)
    doc = {"format": FORMAT, "stamp": {**stamp(), "command": command_line()}, "results": rows}
    (RESULTS / f"{name}.json").write_text(json.dumps(doc, indent=2))


def load_results(name: str, default=None):
    """The rows bench/results/<name>.json holds (its stamp set aside), or `default` when the
    file does not exist."""
    doc = read_stamped(name)
    return default if doc is None else doc["results"]


def read_stamped(name: str) -> dict | None:
    """bench/results/<name>.json as {"stamp": ..., "results": ...}; a file from before the
    stamp has the stamp {}."""
    path = RESULTS / f"{name}.json"
    if not path.is_file():
        return None
    doc = json.loads(path.read_text())
    if isinstance(doc, dict) and doc.get("format") == FORMAT:
        return doc
    return {"stamp": {}, "results": doc}


def row_stamps(doc: dict) -> list[dict]:
    """Where and by what each row of a stamped file was measured: the row's own commit, date,
    machine and command where it carries a commit (rows of a run continued at another commit,
    a heavy or light part kept from the other part's run, or a report's rows from runs of other
    days), else the file's. A row kept before rows carried their command takes the file's
    where its commit is the file's, else has none."""
    rows = doc["results"]
    if isinstance(rows, dict):
        rows = list(rows.values())
    keys = ("commit", "date", "machine", "command")
    base = {k: doc["stamp"].get(k) for k in keys}
    out = []
    for r in rows if isinstance(rows, list) else []:
        own = isinstance(r, dict) and r.get("commit")
        row = {k: r.get(k) for k in keys} if own else base
        if own and "command" not in r and r["commit"] == base["commit"]:
            row["command"] = base["command"]  # a row from before rows carried a command
        out.append(row)
    return out or [base]


def measured_at(names: list[str], why_mixed: str | None = None) -> str:
    """The line a table carries: "Measured at commit `c`, date, machine; `command`." for the
    result files `names`. Rows of more than one commit are refused (SystemExit naming them)
    unless `why_mixed` says why the table shows them together; then every commit is listed
    with that reason."""
    docs = {n: read_stamped(n) for n in names}
    missing = [n for n, d in docs.items() if d is None]
    if missing:
        raise SystemExit(f"no results for {', '.join(missing)} under {RESULTS}: run the bench "
                         "first (bench/all.py --list names the one that writes each)")
    stamps = [s for d in docs.values() for s in row_stamps(d)]
    commands = list(dict.fromkeys(s["command"] for s in stamps if s.get("command")))
    return measured_line(stamps, commands, why_mixed, ", ".join(names))


def measured_line(stamps: list[dict], commands: list[str], why_mixed: str | None = None,
                  what: str = "the table") -> str:
    """measured_at's line for rows stamped `stamps` (commit, date, machine), run by
    `commands`; `what` names the rows in the refusal."""
    commits = sorted({s["commit"] or "not recorded" for s in stamps})
    if len(commits) > 1 and why_mixed is None:
        raise SystemExit(f"{what}: rows measured at {len(commits)} commits "
                         f"({', '.join(commits)}); re-run the bench at one commit, or give the "
                         "table a reason to show them together")
    where = "; ".join(sorted({f"{s['date']}, {s['machine']}" for s in stamps if s['date']}))
    head = (f"commit `{commits[0]}`" if len(commits) == 1 else
            f"commits {', '.join(f'`{c}`' for c in commits)} ({why_mixed})")
    if commits == ["not recorded"]:
        head = "a commit not recorded"
    tail = f"; `{'`, `'.join(commands)}`" if commands else ""
    return f"Measured at {head}{', ' + where if where else ''}{tail}."


def replace_table(doc: Path, lines: list[str], name: str = "table",
                  sources: list[str] | None = None, why_mixed: str | None = None) -> None:
    """Put `lines` between the markers <!-- name --> and <!-- /name --> in `doc`, under the
    measured_at line of the result files `sources` when given."""
    if sources:
        lines = [measured_at(sources, why_mixed), "", *lines]
    text = doc.read_text()
    start, end = f"<!-- {name} -->", f"<!-- /{name} -->"
    if start not in text or end not in text:
        raise SystemExit(f"{doc} has no {start} ... {end} markers for the table")
    head, _, rest = text.partition(start)
    _, _, tail = rest.partition(end)
    doc.write_text(head + start + "\n" + "\n".join(lines) + "\n" + end + tail)


def step_table(rows: list[dict], first: str, second: str, heads: tuple[str, str, str]
               ) -> list[str]:
    """Markdown lines: each stack row's step time two ways (keys `first`, `second`, in
    seconds) and their ratio, first / second; heads name the three columns."""
    lines = [f"| row | network | plan | {heads[0]} | {heads[1]} | {heads[2]} |",
             "|---|---|---|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['config']} | {r['network']} ({r['update']}) | {r['micro_batch']} × "
                     f"{r['accumulation']} | {r[first]:.3f} s | {r[second]:.3f} s | "
                     f"{r[first] / r[second]:.2f} |")
    return lines


NOT_CODE = ("docs", "bench/results", "README.md")  # prose, and the figures results write


def code_commit(root: Path = ROOT) -> str:
    """The commit a result measures: the last one that changed anything outside NOT_CODE
    (committing results, whose figures land in docs/ and the README, does not change it),
    with "+changes" when the working tree's code differs from it."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], capture_output=True, text=True,
                              cwd=root).stdout.strip()
    scope = ["--", ".", *(f":!{p}" for p in NOT_CODE)]
    commit = git("log", "-1", "--format=%h", *scope)
    return commit + ("+changes" if git("status", "--porcelain", "--untracked-files=no", *scope)
                     else "")


def stamp() -> dict:
    """Where a result was measured: the commit (code_commit), the date and the machine: its
    CPU's name, its widest vector extension (one name, "AMD EPYC", was seen with AVX-512 and
    with AVX2 only; MLAS's kernels and NCHWc block, so ORT's graphs, memory and times, differ
    between the two) and its cores."""
    commit = code_commit()
    lines = Path("/proc/cpuinfo").read_text().splitlines()
    cpu = next((line.split(":", 1)[1].strip() for line in lines
                if line.startswith("model name")), platform.processor())
    flags = set(next((line.split(":", 1)[1].split() for line in lines
                      if line.startswith("flags")), []))
    isa = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else None
    return {"commit": commit, "date": datetime.date.today().isoformat(),
            "machine": f"{cpu}{f' ({isa})' if isa else ''}, {os.cpu_count()} cores"}


def measure_or_report(name: str, measure, report, description: str | None = None,
                      heavy_help: str | None = None) -> None:
    """A bench's command line: measure (`measure()` returns the rows), save them to
    bench/results/<name>.json and write the tables (`report(rows)`); with --report, only the
    tables, from the saved file. With `heavy_help` (bench/heavy.py's split) it takes --heavy
    and calls `measure(heavy)`."""
    import argparse

    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--report", action="store_true",
                    help=f"only rebuild the tables from bench/results/{name}.json")
    if heavy_help:
        ap.add_argument("--heavy", action="store_true", help=heavy_help)
    a = ap.parse_args()
    if a.report:
        rows = load_results(name)
        if rows is None:
            raise SystemExit(f"no bench/results/{name}.json: run the bench without --report "
                             "first")
    else:
        rows = measure(a.heavy) if heavy_help else measure()
        save_results(name, rows)
    report(rows)


MEMORY_RUNS_AT_ONCE = 2  # a run's allocator peak does not depend on what else runs


def side_by_side(jobs: list, workers: int = MEMORY_RUNS_AT_ONCE) -> list:
    """Each job's result (jobs are functions of no arguments), in the jobs' order, `workers`
    at a time. For benches whose tables hold bytes and accuracy only: the allocator measures
    the same peak with another run beside it (checked on the patch MobileNet at batch 8, alone
    and two at once: 6,063,360 bytes, the breakdown equal). Timed benches run alone."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = [pool.submit(job) for job in jobs]
        try:
            return [f.result() for f in futures]
        except BaseException:  # the first failure stops the bench: start nothing more
            pool.shutdown(cancel_futures=True)
            raise
