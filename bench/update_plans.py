"""What each update plan costs, measured: the peak and its breakdown from the allocator.

    .venv/bin/python bench/update_plans.py            # ~5 min on 2 cores
    .venv/bin/python bench/update_plans.py --report   # tables and pictures from saved results

For the patch MobileNet and the raw-IMU 1-D CNN (population models of held-out user 10), at
micro-batch 8 and 2 threads: every plan of PLANS exported with `edgetrain export --update`,
then `edgetrain measure` (the personalisation cycle as a user runs it, selection included).
Then the 1-D CNN's head plan with its frozen weights in 8 bits (`--int8-frozen`), and the
smallest tier: the 1-D CNN at width 0.25 training its head, micro-batch 2, one
thread, on `mcu-256kb`. Last, the update search (`export --update auto`) of the 1-D CNN for
`watchos-extension` (every plan fits, so every plan is scored) and for `mcu-2mb`.
Results: bench/results/update_plans.json; tables in docs/update-plans.md; pictures
docs/img/update-plans.png (breakdowns) and docs/img/update-search.png (the contribution
analysis: predicted peak against host-replay gain).
"""
from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from common import ROOT, load_results, replace_table, run, save_results, stamp

PLANS = ("all", "last:4", "last:2", "head", "bias", "bias-only")
NETWORKS = ("patch_mobilenet", "imu_cnn")
SMALLEST = {"model": "imu_cnn", "width": 0.25, "update": "head", "batch": 2, "threads": 1,
            "device": "mcu-256kb"}
DOC = ROOT / "docs" / "update-plans.md"


def export_and_measure(tmp: Path, model: str, update: str, batch: int = 8, threads: int = 2,
                       width: float | None = None, device: str | None = None,
                       int8: bool = False) -> dict:
    out = tmp / f"{model}-{update.replace(':', '-').replace(',', '+')}-{width}-{int8}"
    args = ["export", "--model", model, "--update", update, "--micro-batch", str(batch),
            "--threads", str(threads), "--out", str(out), "--json",
            *(["--int8-frozen"] if int8 else [])]
    m = json.loads(run(*args, *(["--width", str(width)] if width else [])))
    meas = json.loads(run("measure", str(out), "--batch", str(batch), "--threads",
                          str(threads), "--json", *(["--device", device] if device else [])))
    return {"model": model, "width": width, "update": update, "batch": batch, "int8": int8,
            "threads": threads, "device": device, "trainable": len(m["trainable"]),
            "trainable_bytes": sum(4 * _numel(t["shape"]) for t in m["trainable"]),
            "predicted_peak_bytes": m["predicted"]["peak_bytes"],
            "peak_bytes": meas["peak_bytes"], "breakdown": meas["breakdown"]}


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def main() -> None:
    rows, searches = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        for model in NETWORKS:
            for update in PLANS:
                rows.append(export_and_measure(Path(tmp), model, update))
                print(json.dumps({k: rows[-1][k] for k in ("model", "update", "peak_bytes")}),
                      flush=True)
        rows.append(export_and_measure(Path(tmp), "imu_cnn", "head", int8=True))
        s = SMALLEST
        rows.append(export_and_measure(Path(tmp), s["model"], s["update"], s["batch"],
                                       s["threads"], s["width"], s["device"]))
        for device in ("watchos-extension", "mcu-2mb"):
            m = json.loads(run("export", "--model", "imu_cnn", "--update", "auto", "--device",
                               device, "--out", str(Path(tmp) / f"auto-{device}"), "--json"))
            searches[device] = m["provenance"]["update_search"]
    save_results("update_plans", [{**stamp(), "rows": rows, "searches": searches}])
    report()


def report() -> None:
    saved = load_results("update_plans")[0]
    rows, searches = saved["rows"], saved["searches"]
    where = (f"Measured at commit `{saved['commit']}`, {saved['date']}, {saved['machine']}; "
             "`bench/update_plans.py`." if "commit" in saved else
             "Measured at a commit not recorded; `bench/update_plans.py`.")
    lines = [where, "", "| network | plan | micro-batch | trains (bytes) | measured peak | predicted | "
             "× below `all` | parameters | gradients | optimizer | activations | other |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        full = next((a for a in rows if a["model"] == r["model"] and a["update"] == "all"
                     and a["width"] == r["width"]), None)
        b = r["breakdown"]
        name = r["model"] + (f" width {r['width']:g}, {r['threads']} thread" if r["width"] else "")
        name += ", frozen weights in int8" if r.get("int8") else ""
        lines.append(
            f"| {name} | `{r['update']}` | {r['batch']} | {r['trainable_bytes']:,} | "
            f"{r['peak_bytes']:,} | {100 * (r['predicted_peak_bytes'] / r['peak_bytes'] - 1):+.1f}% | "
            + (f"{full['peak_bytes'] / r['peak_bytes']:.2f}×" if full else "-") + " | "
            + " | ".join(f"{b[k]:,}" for k in ("parameters", "gradients", "optimizer_state",
                                               "activations", "other")) + " |")
    replace_table(DOC, lines, "update-plans")
    search_lines = [where, "", "| budget | plan | trains (bytes) | predicted peak | fits | gain (points, "
                    "host replay) |", "|---|---|---:|---:|---|---:|"]
    for device, s in searches.items():
        for c in s["candidates"]:
            mark = " (chosen)" if c["update"] == s["chosen"] else ""
            gain = f"{c['gain_points']:+.1f}" if c["gain_points"] is not None else "-"
            search_lines.append(f"| {device} | `{c['update']}`{mark} | {c['trainable_bytes']:,} | "
                                + (f"{c['predicted_peak_bytes']:,}" if c["predicted_peak_bytes"]
                                   else "no claim")
                                + f" | {'yes' if c['fits'] else 'no'} "
                                f"| {gain} |")
        search_lines.append(f"| {device} | measured peak of the choice | | "
                            f"{s['measured_peak_bytes']:,} | | |")
    replace_table(DOC, search_lines, "update-search")
    plot(rows, searches)


def plot(rows: list[dict], searches: dict) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cats = ("parameters", "gradients", "optimizer_state", "activations", "other")
    fig, axes = plt.subplots(1, len(NETWORKS), figsize=(11, 3.8))
    for ax, model in zip(axes, NETWORKS):
        rs = [r for r in rows if r["model"] == model and r["width"] is None
              and not r.get("int8")]
        bottom = [0.0] * len(rs)
        for cat in cats:
            vals = [r["breakdown"][cat] / 2 ** 20 for r in rs]
            ax.bar([r["update"] for r in rs], vals, bottom=bottom, label=cat.replace("_", " "))
            bottom = [a + b for a, b in zip(bottom, vals)]
        ax.scatter([r["update"] for r in rs], [r["predicted_peak_bytes"] / 2 ** 20 for r in rs],
                   marker="_", s=400, color="black", label="predicted peak", zorder=3)
        ax.axhline(2.0, color="red", lw=0.8, ls="--", label="mcu-2mb budget")
        ax.set(title=f"{model}, micro-batch 8: measured peak by plan", ylabel="MiB")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(ROOT / "docs" / "img" / "update-plans.png", dpi=110)

    s = searches["watchos-extension"]
    fig, ax = plt.subplots(figsize=(7, 4))
    for c in s["candidates"]:
        ax.scatter(c["predicted_peak_bytes"] / 2 ** 20, c["gain_points"], color="C0")
        ax.annotate(c["update"], (c["predicted_peak_bytes"] / 2 ** 20, c["gain_points"]),
                    fontsize=7, xytext=(3, 3), textcoords="offset points")
    ax.axvline(2.0, color="red", lw=0.8, ls="--", label="mcu-2mb budget")
    ax.axhline(0, color="grey", lw=0.8)
    ax.set(xlabel="predicted peak (MiB)", ylabel="gain on inner subjects (points)",
           title="imu_cnn: what updating each part helps (host replay), against its cost")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(ROOT / "docs" / "img" / "update-search.png", dpi=110)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--report", action="store_true")
    report() if ap.parse_args().report else main()
