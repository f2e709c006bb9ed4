"""The headline figures, from the saved results: docs/results.md's summary and the README's.

    .venv/bin/python bench/summary.py          # write both (bench/all.py runs it last)
    .venv/bin/python bench/summary.py --check  # exit 1 when either differs from the results

Each figure is a function of one result file (bench/results/<source>.json) returning its text;
the summary table of docs/results.md (block `summary`) gives each with the commit and date of
the rows it comes from, and the README holds some of the same texts between
`<!-- fig:NAME -->` and `<!-- /fig -->` (tests/test_results_summary.py fails when one differs
from what its source gives today).
"""
from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from typing import Callable

from all import load_progress, recorded_times
from common import RESULTS, ROOT, load_results, read_stamped, replace_table, row_stamps
from heavy import is_heavy
from personalise import read_rows
from steps import STEPS

DOC = ROOT / "docs" / "results.md"
README = ROOT / "README.md"
FIG = re.compile(r"<!-- fig:([a-z0-9-]+) -->(.*?)<!-- /fig -->", re.S)


@dataclass(frozen=True)
class Figure:
    name: str
    headline: str  # the summary table's first column
    source: str  # result file name
    text: Callable[[object], tuple[str, list]]  # the text and the rows it was read from
    section: str  # anchor in docs/results.md (or a docs/ page) holding the table


def _stack(rows: list[dict]) -> tuple[str, list]:
    by = {r["config"]: r for r in rows}
    if not {"C1", "C6"} <= set(by):
        return "C1 or C6 not measured yet", []
    c1, c6 = by["C1"], by["C6"]
    return (f"C1 → C6 peak {c1['peak_bytes'] / c6['peak_bytes']:,.0f}× lower "
            f"({c1['peak_bytes'] / 1e6:,.1f} MB → {c6['peak_bytes'] / 1e6:,.1f} MB) for "
            f"{100 * (c6['accuracy_after_mean'] - c1['accuracy_after_mean']):+.1f} points "
            "(mean of watch users 8–10, tested on the other arm)"), [c1, c6]


def _gain(device: str, mode: str = "all labels") -> Callable[[list[dict]], tuple[str, list]]:
    def text(rows: list[dict]) -> tuple[str, list]:
        r = next((r for r in rows if r.get("table") == "gate" and r["device"] == device
                  and r["mode"] == mode and not r.get("without_users")), None)
        if r is None:
            return f"no {device} rows yet", []
        return (f"{r['gain_points']:+.1f} points [{r['low_points']:+.1f}, "
                f"{r['high_points']:+.1f}] over {r['users']} users ({mode}), peak "
                f"{r['peak_bytes']:,} B"), [r]
    return text


def _demo(rows: list[dict]) -> tuple[str, list]:
    r = next((r for r in rows if r["device"] == "watchos-extension"), None)
    if r is None:
        return "no `watchos-extension` row yet", []
    guard = {True: "the guard kept the population model", False: "the guard kept the "
             "personalised model", None: "no guard"}[r["guard_kept_population"]]
    return (f"{guard}; session-2 accuracy {r['accuracy_before']:.3f} → "
            f"{r['accuracy_after']:.3f} ({r['gain']['gain_points']:+.1f} points); measured "
            f"peak {r['peak_bytes']:,} B"), [r]


def _predictor(rows: list[dict]) -> tuple[str, list]:
    built_in = [r for r in rows if r.get("part") == "table" and r["claim"] == "complete"]
    worst = max(built_in, key=lambda r: abs(r["error_ratio"]))
    return (f"within {abs(worst['error_ratio']):.1%} of the allocator on {len(built_in)} "
            f"built-in network × batch rows (worst: {worst['model']} at batch "
            f"{worst['batch']})"), built_in


def _eager(rows: list[dict]) -> tuple[str, list]:
    raced = [r for r in rows if "portable_ratio" in r]
    ratios = [r["portable_ratio"] for r in raced]
    return (f"a step takes {min(ratios):.2f}–{max(ratios):.2f}× PyTorch eager's time on the "
            f"portable artifact, over {len(ratios)} stack rows"), raced


def _recompute(rows: list[dict]) -> tuple[str, list]:
    """`sqrt` and `optimal` on the networks every `make results` measures (ResNet-50's rows
    are --full's)."""
    rs = [r for r in rows if r["plan"] in ("none", "sqrt", "optimal")
          and not is_heavy(r["network"]) and not r.get("refused")]
    sqrt = [r for r in rs if r["plan"] == "sqrt"]
    if not sqrt:
        return "no rows yet", []
    acts = {(r["network"], r["plan"]): r["activation_bytes"] for r in rs}
    nets = [r["network"] for r in sqrt]
    ordered = [n for n in nets if (n, "optimal") in acts
               and acts[n, "optimal"] <= acts[n, "sqrt"] <= acts[n, "none"]]
    cuts = [r["activation_cut_ratio"] for r in sqrt]
    times = [r["time_ratio"] for r in sqrt]
    return (f"`sqrt` at batch {sqrt[0]['batch']} cuts measured activation bytes "
            f"{min(cuts):.2f}-{max(cuts):.2f}× on {len(nets)} networks for "
            f"{min(times):.2f}-{max(times):.2f}× the step time; `optimal` ≤ `sqrt` ≤ `none` "
            f"on {len(ordered)} of them"), rs


def _fleet(results: dict) -> tuple[str, list]:
    f = results["fleet_1000"]
    return (f"{f['runs']:,} users on four devices take about {f['wall_s'] / 60:.0f} minutes "
            f"on {f['workers']} workers"), [f]


FIGURES = (
    Figure("stack", "The seed deck's stack (C1 ResNet-50 → C6 patch MobileNet)", "stack",
           _stack, "#the-seed-stack-c1--c6-reproduced-and-c8-the-raw-imu-network-under-an-"
           "update-plan"),
    Figure("demo", "The demo (HAPT user 30, `watchos-extension`)", "demo", _demo,
           "#the-demo-hapt-user-30-session-1--session-2-on-each-tiers-shipped-plan"),
    Figure("gain-watch", "Personalisation, `watchos-extension`, session 1 → 2 (HAPT)",
           "personalise", _gain("watchos-extension"), "#personalisation-where-the-watch-is-worn"),
    Figure("gain-1mb", "Personalisation, `mcu-1mb`, session 1 → 2 (HAPT)", "personalise",
           _gain("mcu-1mb"), "#personalisation-where-the-watch-is-worn"),
    Figure("gain-256kb", "Personalisation, `mcu-256kb`, session 1 → 2 (HAPT)", "personalise",
           _gain("mcu-256kb"), "#personalisation-where-the-watch-is-worn"),
    Figure("predictor", "Static peak prediction", "predictor", _predictor,
           "predictor.md#accuracy"),
    Figure("eager", "Step time against PyTorch eager", "eager_race", _eager,
           "#edgetrain-against-pytorch-eager-step-for-step"),
    Figure("recompute", "Recompute", "recompute", _recompute, "recompute.md"),
    Figure("fleet-1000", "A fleet on Ray", "fleet", _fleet, "#a-fleet-on-ray"),
)


def text_of(fig: Figure) -> str:
    results = load_results(fig.source)
    return "not measured yet" if results is None else fig.text(results)[0]


def where(fig: Figure) -> str:
    """The commit and date of the rows the figure was read from ("N commits" when mixed)."""
    doc = read_stamped(fig.source)
    if doc is None:
        return "–"
    stamps = row_stamps({**doc, "results": fig.text(doc["results"])[1]})
    commits = sorted({s["commit"] or "not recorded" for s in stamps})
    dates = sorted({s["date"] for s in stamps if s["date"]})
    head = (f"{len(commits)} commits" if len(commits) > 1 else "commit not recorded"
            if commits == ["not recorded"] else f"`{commits[0]}`")
    return f"{head}, {dates[-1]}" if dates else head


def summary_lines() -> list[str]:
    lines = ["| | figure | measured at | table |", "|---|---|---|---|"]
    for f in FIGURES:
        lines.append(f"| {f.headline} | {text_of(f)} | {where(f)} | [table]({f.section}) |")
    return lines


def stamps_of(name: str) -> list[dict]:
    """Where each row of result `name` (.json or the personalisation runs' .jsonl) was
    measured: its commit, date and machine."""
    doc = read_stamped(name)
    if doc is not None:
        return row_stamps(doc)
    return [{k: r.get(k) for k in ("commit", "date", "machine")}
            for r in read_rows(RESULTS / f"{name}.jsonl")]


def commits_of(name: str) -> set[str]:
    """The commits the rows of result `name` were measured at."""
    return {s["commit"] or "not recorded" for s in stamps_of(name)}


def run_machines() -> list[str]:
    """The machines the default steps' rows of progress.json's code were measured on (rows
    that name one): where the run that the step times come from ran."""
    code = load_progress().get("code")
    names = {n for s in STEPS if not s.full for n in s.writes}
    return sorted({s["machine"] for n in names for s in stamps_of(n)
                   if s["commit"] == code and s["machine"]})


def provenance_line() -> str:
    """Which steps' results come from which commit: the page is one commit's (but for the
    `--full` steps' rows) when a whole default `make results` ran on one code."""
    whole = whole_run()
    if whole is not None:
        code, finished = whole
        kept = commits_by_step([s for s in STEPS if s.full], skip={code})
        return (f"A whole `make results` ran at commit `{code}` (finished {finished}): every "
                "table's rows were measured there, but the rows of the `--full` steps, "
                "which a default run keeps"
                + (": " + "; ".join(kept) + "." if kept else " (none differ)."))
    parts = commits_by_step(STEPS)
    return (f"The benchmarks' results (this page's and the capability pages') come from "
            f"{len(parts)} commits, because `make results` has not yet run whole on one "
            "code: " + "; ".join(parts) + ".")


def commits_by_step(steps: list, skip: set[str] = frozenset()) -> list[str]:
    """"`commit` (step, step, ...)" for each commit the result files of `steps` hold."""
    by: dict[str, list[str]] = {}
    for step in steps:
        for c in set().union(*(commits_of(n) for n in step.writes)) if step.writes else ():
            if c not in skip:
                by.setdefault(c, []).append(step.name)
    return [f"`{c}` ({', '.join(names)})" if c != "not recorded" else
            f"a commit not recorded ({', '.join(names)})" for c, names in sorted(by.items())]


def whole_run() -> tuple[str, str] | None:
    """(code, finish time) of the run bench/results/progress.json records when every default
    step finished in it on one code and every result file holds rows of that code only (or
    of a `--full` step's, in a file such a step writes too), else None."""
    progress = load_progress()
    code, done = progress.get("code"), progress.get("steps", {})
    if not code or any(s.name not in done for s in STEPS if not s.full):
        return None
    full_files = {n for s in STEPS if s.full for n in s.writes}
    for step in (s for s in STEPS if not s.full):
        if any(commits_of(n) != {code} and n not in full_files for n in step.writes):
            return None
    return code, max(done[s.name]["finished"] for s in STEPS if not s.full)


def duration_line() -> str:
    """How long a whole `make results` takes on 2 cores: each step's time as its last run
    measured it (bench/results/progress.json), else bench/steps.py's estimate."""
    times = recorded_times()
    steps = [s for s in STEPS if not s.full]
    hours = sum(times[s.name] / 3600 if s.name in times else s.estimate_min / 60 for s in steps)
    measured = sum(s.name in times for s in steps)
    machines = run_machines()
    where = (" and ".join(machines) + " (where the run of this page's commit ran; another "
             "CPU takes another time)") if machines else "2 cores"
    return (f"A whole `make results` ({len(steps)} steps; `--full` adds "
            f"{len(STEPS) - len(steps)}) takes about {hours:.1f} h on {where}: "
            f"{measured} steps' times as their last run measured them, "
            f"{len(steps) - measured} estimated (`.venv/bin/python bench/all.py --list` "
            "gives each).")


def readme_text(text: str) -> str:
    """The README with every figure between its markers as its source gives it today."""
    known = {f.name: f for f in FIGURES}

    def sub(m: re.Match) -> str:
        if m.group(1) not in known:
            raise SystemExit(f"README.md names figure {m.group(1)!r}, which bench/summary.py "
                             f"does not know (it knows {', '.join(known)})")
        return f"<!-- fig:{m.group(1)} -->{text_of(known[m.group(1)])}<!-- /fig -->"
    return FIG.sub(sub, text)


def main(check: bool) -> int:
    readme = README.read_text()
    if check:
        stale = readme_text(readme) != readme
        if stale:
            print("README.md's figures differ from bench/results/: run bench/summary.py",
                  file=sys.stderr)
        return int(stale)
    replace_table(DOC, summary_lines() + ["", provenance_line(), "", duration_line()],
                  "summary")
    README.write_text(readme_text(readme))
    return 0


if __name__ == "__main__":
    sys.exit(main("--check" in sys.argv[1:]))
