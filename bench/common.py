"""What the benchmarks share: the repository root, the `edgetrain` CLI run as a user runs it,
results written as JSON under bench/results/, and tables replaced between markers in docs/.
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


def save_results(name: str, rows: list[dict]) -> None:
    """Write rows to bench/results/<name>.json."""
    out = ROOT / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(rows, indent=2))


def replace_table(doc: Path, lines: list[str], name: str = "table") -> None:
    """Put `lines` between the markers <!-- name --> and <!-- /name --> in `doc`."""
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


def stamp() -> dict:
    """Where a result was measured: the commit, the date and the machine."""
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, cwd=ROOT).stdout.strip()
    cpu = next((line.split(":", 1)[1].strip() for line in
                Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    return {"commit": commit, "date": datetime.date.today().isoformat(),
            "machine": f"{cpu}, {os.cpu_count()} cores"}
