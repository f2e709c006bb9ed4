"""Tables and plots of bench/personalise.py's rows, for docs/results.md.

    .venv/bin/python bench/personalise_report.py

Every gain is the mean over users of (after - before) test accuracy, with a 95% interval from
a bootstrap that resamples users and, within each user, test recordings (edgetrain/intervals.py;
windows overlap and a recording's windows share their errors). Beside it: the error reduction
(1 - mean error after / mean error before), how many users end below the population model and
below -5 points, the worst user, and how often the guard kept the population model. Each table
says the commit, date and machine its rows were measured on, and refuses to mix commits
unless the runtime and the exporter are the same at each (then it says so: stamps_of).
"""
from __future__ import annotations

import subprocess

import numpy as np

from common import ROOT, replace_table, save_results
from personalise import MODES, RESULTS, TIERS, TUNING_USERS, read_rows
from edgetrain.intervals import UserTest, gain_interval

DOC = ROOT / "docs" / "results.md"
GATE = ("hapt", "later-session")
CONTEXT = (("watch", "within-set"), ("watch", "other-arm"))
PROTOCOL_NAMES = {"later-session": "session 1 → session 2 (the gate)",
                  "within-set": "same arm, within one set (upper bound)",
                  "other-arm": "other arm (placement shift)"}


def stamp_of(rows: list[dict]) -> str:
    commits = sorted({r["commit"] for r in rows})
    if len(commits) > 1:
        raise SystemExit(f"rows of commits {commits} in one table: run bench/personalise.py "
                         "again (it measures rows of another commit again)")
    r = rows[0]
    return f"commit `{r['commit']}`, {r['date']}, {r['machine']}"


def stamps_of(groups: list[tuple[str, list[dict]]]) -> str:
    """The stamp of a table whose groups (one commit each) may come from different commits:
    then each group's commit is named, with the files of the runtime and the exporter that
    differ between them (a tier's plan is in its rows)."""
    by = {label: stamp_of(rows) for label, rows in groups if rows}
    commits = sorted({r["commit"] for _, rows in groups for r in rows})
    if len(commits) <= 1:
        return next(iter(by.values()), "")
    changed = sorted({f for other in commits[1:] for f in subprocess.run(
        ["git", "diff", "--name-only", commits[0], other, "--", "edgetrain", "exporters"],
        capture_output=True, text=True, cwd=ROOT, check=True).stdout.split()})
    return ("; ".join(f"{label.split(':')[0]} at {st}" for label, st in by.items())
            + f" (rows of {len(commits)} commits; the runtime and exporter files that differ "
            f"between them: {', '.join(changed) or 'none'})")


def summary(rows: list[dict]) -> dict:
    """The statistics of one (data set, protocol, tier, mode) over its users."""
    rows = sorted(rows, key=lambda r: r["user"])
    tests = [UserTest.of(r["test_correct_before"], r["test_correct_after"],
                         r["test_recordings"]) for r in rows]
    g = gain_interval(tests)
    gains = [100 * (t.accuracy_after - t.accuracy_before) for t in tests]
    worst = int(np.argmin(gains))
    guarded = [r for r in rows if r["guard"] is not None]
    first = rows[0]
    return {"dataset": first["dataset"], "protocol": first["protocol"],
            "device": first["tier"]["device"], "model": first["tier"]["model"],
            "network": first["network"], "commit": first["commit"], "date": first["date"],
            "users": len(rows), "before": float(np.mean([t.accuracy_before for t in tests])),
            "after": float(np.mean([t.accuracy_after for t in tests])), **g.to_dict(),
            "users_below_0": sum(x < -1e-9 for x in gains),
            "users_below_minus_5": sum(x < -5 for x in gains),
            "worst_user": rows[worst]["user"], "worst_points": gains[worst],
            "guard_kept": sum(r["guard"]["kept_population"] for r in guarded),
            "guarded": len(guarded), "peak_bytes": max(r["measured_peak_bytes"] or 0
                                                       for r in rows)}


def stats_line(label: str, mode: str, s: dict) -> str:
    kept = f"{s['guard_kept']} of {s['guarded']}" if s["guarded"] else "- (no labels)"
    return (f"| {label} | {mode} | {s['users']} | {s['before']:.3f} | {s['after']:.3f} | "
            f"{s['gain_points']:+.1f} [{s['low_points']:+.1f}, {s['high_points']:+.1f}] | "
            f"{100 * s['error_reduction']:+.0f}% [{100 * s['error_reduction_low']:+.0f}%, "
            f"{100 * s['error_reduction_high']:+.0f}%] | {s['users_below_0']} | "
            f"{s['users_below_minus_5']} | user {s['worst_user']}: {s['worst_points']:+.1f} | "
            f"{kept} | {s['peak_bytes']:,} |")


HEAD = ["| {what} | mode | users | population | after | mean gain, points [95%] | "
        "error reduction [95%] | users < 0 | users < −5 | worst user | guard kept population "
        "| measured peak (bytes) |",
        "|---|---|---:|---:|---:|---|---|---:|---:|---|---:|---:|"]


def table(groups: list[tuple[str, list[dict]]], what: str, command: str) -> tuple[list, list]:
    lines, out = [h.format(what=what) for h in HEAD], []
    everything = [r for _, rows in groups for r in rows]
    if not everything:
        return ["(not measured yet: " + command + ")"], out
    for label, rows in groups:
        for mode in MODES:
            rs = [r for r in rows if r["mode"] == mode]
            if not rs:
                continue
            s = summary(rs)
            out.append({"group": label, "mode": mode, **s})
            lines.append(stats_line(label, mode, s))
            tuned = TUNING_USERS[rs[0]["dataset"]]
            rest = [r for r in rs if r["user"] not in tuned]
            if len(rest) < len(rs):
                s = summary(rest)
                out.append({"group": label, "mode": mode, "without_users": list(tuned), **s})
                lines.append(stats_line(label, f"{mode}, without users {tuned[0]}–{tuned[-1]}"
                                        if len(tuned) > 1 else f"{mode}, without user "
                                        f"{tuned[0]}", s))
    return [f"Measured at {stamps_of(groups)}; `{command}`. Recipe chosen on "
            f"{everything[0]['recipe_chosen_on']}: each mean is given with and without them.",
            ""] + lines, out


def per_user(rows: list[dict]) -> list[str]:
    lines = ["| user | population | " + " | ".join(MODES) + " | gain, all labels (points) | "
             "test recordings | guard (all labels) |",
             "|---:|---:|" + "---:|" * len(MODES) + "---:|---:|---|"]
    for user in sorted({r["user"] for r in rows}):
        by = {r["mode"]: r for r in rows if r["user"] == user}
        first = next(iter(by.values()))
        full = by.get("all labels")
        cells = [f"{by[m]['accuracy_after']:.3f}" if m in by else "-" for m in MODES]
        gain = f"{100 * (full['accuracy_after'] - full['accuracy_before']):+.1f}" if full else "-"
        g = full and full["guard"]
        lines.append(f"| {user} | {first['accuracy_before']:.3f} | {' | '.join(cells)} | {gain} "
                     f"| {len(set(first['test_recordings']))} | "
                     + ("kept population" if g and g["kept_population"] else
                        "adapted (statistics only)" if g and g.get("statistics_only") else
                        "personalised" if g else "-") + " |")
    return lines


def main() -> None:
    gate = [(f"`{t}`: {tier.label}", read_rows(RESULTS / f"personalise-{GATE[0]}-{GATE[1]}-{t}.jsonl"))
            for t, tier in TIERS.items()]
    lines, stats = table(gate, "device tier (network as shipped)",
                         "bench/personalise.py --tier T" + " for each tier")
    replace_table(DOC, lines, "personalise-gate")
    context = [(PROTOCOL_NAMES[p], read_rows(RESULTS / f"personalise-{d}-{p}-watchos-extension.jsonl"))
               for d, p in CONTEXT]
    clines, cstats = table(context, "watch data, protocol",
                           "bench/personalise.py --dataset watch --protocol P")
    replace_table(DOC, clines, "personalise-context")
    watch_tier = gate[0][1]
    if watch_tier:
        replace_table(DOC, [f"Measured at {stamp_of(watch_tier)}; accuracy on session 2."]
                      + [""] + per_user(watch_tier), "personalise-users")
    tiers = ["| tier | budget (bytes) | network as shipped | measured peak, largest run (bytes) | "
             "share of the budget |", "|---|---:|---|---:|---:|"]
    for (label, rows), (device, tier) in zip(gate, TIERS.items()):
        if rows:
            peak = max(r["measured_peak_bytes"] or 0 for r in rows)
            budget = rows[0]["budget_bytes"]
            tiers.append(f"| `{device}` | {budget:,} | {tier.label} | {peak:,} | "
                         f"{peak / budget:.0%} |")
    replace_table(ROOT / "docs" / "devices.md", [f"Measured at {stamps_of(gate)}."
                                                 , ""] + tiers, "tier-plans")
    save_results("personalise", [{"table": "gate", **s} for s in stats]
                 + [{"table": "context", **s} for s in cstats], derived=True)
    plot(gate, stats)


def plot(gate, stats) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.2),
                                      gridspec_kw={"width_ratios": [2, 1]})
    rows = [r for r in gate[0][1] if r["mode"] == "all labels"]
    tuned = TUNING_USERS[GATE[0]]
    if rows:
        rows.sort(key=lambda r: r["user"])
        x = np.arange(len(rows))
        left.bar(x - 0.2, [r["accuracy_before"] for r in rows], 0.4, label="population model")
        left.bar(x + 0.2, [r["accuracy_after"] for r in rows], 0.4,
                 label="personalised on the watch (all labels, guarded)")
        left.set_xticks(x, [f"{r['user']}*" if r["user"] in tuned else str(r["user"])
                            for r in rows], fontsize=7)
        left.set(xlabel="HAPT user, held out of pretraining (* chose the recipe)",
                 ylabel="accuracy on session 2",
                 ylim=(0.4, 1.02), title="Every HAPT user on watchos-extension, all labels")
        left.legend(loc="lower right", fontsize=8)
    for i, (label, _) in enumerate(gate):
        pts = [s for s in stats if s["group"] == label and not s.get("without_users")]
        if pts:
            xs = [list(MODES).index(s["mode"]) + 0.08 * (i - 1) for s in pts]
            y = np.array([s["gain_points"] for s in pts])
            err = np.array([[s["gain_points"] - s["low_points"] for s in pts],
                            [s["high_points"] - s["gain_points"] for s in pts]])
            right.errorbar(xs, y, yerr=err, fmt="o-", capsize=3,
                           label=label.split(":")[0].strip("`"))
    right.axhline(0, color="grey", lw=0.8)
    right.set_xticks(range(len(MODES)), list(MODES), fontsize=8)
    right.set(ylabel="mean gain on session 2 (points, 95% interval)",
              title="Gain against labels, all 30 users")
    right.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(ROOT / "docs" / "img" / "personalise.png", dpi=110)


if __name__ == "__main__":
    main()
