"""Does holding the saved activations in 8 bits cost personalisation? The same users, the
same recipe, the tier's plan with and without `--saved-activations int8`.

    .venv/bin/python bench/personalise.py --tier T                          # float (the gate)
    .venv/bin/python bench/personalise.py --tier T --saved-activations int8
    .venv/bin/python bench/personalise_int8.py                              # the table

For each tier with 8-bit rows: the statistics of both (bench/personalise_report.py's table:
intervals over users and recordings) and the difference of the mean gains, per mode. The
rows of the two runs may be of different commits (the table names them). Written to
docs/update-plans.md (block `personalise-int8`) and bench/results/personalise-int8.json.
"""
from __future__ import annotations

from common import ROOT, replace_table, save_results
from personalise import MODES, TIERS, read_rows, rows_path
from personalise_report import GATE, table

DOC = ROOT / "docs" / "update-plans.md"


def main() -> None:
    lines, out = [], []
    for device, tier in TIERS.items():
        fp32 = read_rows(rows_path(*GATE, device))
        int8 = read_rows(rows_path(*GATE, device, saved_activations="int8"))
        if not fp32 or not int8:
            continue
        groups = [(f"`{device}`: saved activations in float", fp32),
                  (f"`{device}`: saved activations in 8 bits", int8)]
        rows, stats = table(groups, "tier, plan", f"bench/personalise.py --tier {device} "
                            "[--saved-activations int8]")
        lines += rows + [""]
        by = {(s["group"], s["mode"]): s for s in stats if not s.get("without_users")}
        diffs = []
        for mode in MODES:
            a, b = by.get((groups[0][0], mode)), by.get((groups[1][0], mode))
            if a and b:
                d = b["gain_points"] - a["gain_points"]
                diffs.append(f"{mode} {d:+.1f}")
                where = {"commit": a.get("commit") if a.get("commit") == b.get("commit") else
                         f"{a.get('commit')} and {b.get('commit')}", "date": b.get("date"),
                         "machine": b.get("machine")}  # the runs', not this report's
                out.append({**where, "device": device, "mode": mode,
                            "fp32_gain_points": a["gain_points"],
                            "int8_gain_points": b["gain_points"], "difference_points": d,
                            "fp32_peak_bytes": a["peak_bytes"], "int8_peak_bytes": b["peak_bytes"]})
        lines += [f"Mean gain in 8 bits minus in float (points), `{device}`: "
                  + "; ".join(diffs) + ".", ""]
    if not lines:
        raise SystemExit("no 8-bit rows: run bench/personalise.py --saved-activations int8")
    replace_table(DOC, lines[:-1], "personalise-int8")
    save_results("personalise-int8", out, derived=True)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
