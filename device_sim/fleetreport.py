"""What a fleet run says, per device and per user, from its merged records (device_sim/fleet.py).

Per device, real and synthetic users apart: how many users it had, how many trained, how many
could not fit the device (and the smallest budget they needed), the measured peak bytes
(distribution, beside the budget), the step time, the gain in held-out accuracy
(distribution, and how many gained, lost, stayed), and the guard's decisions. Per user: the
before and after. Pictures: the gain histogram per device, peak against budget per device,
and the fleet's timeline (each task's start and end by worker process).
"""
from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import numpy as np

from edgetrain.jsonfile import read_json


def _dist(values: list[float]) -> dict | None:
    if not values:
        return None
    v = np.asarray(values, dtype=float)
    p10, p50, p90 = np.percentile(v, [10, 50, 90])
    return {"n": len(v), "min": float(v.min()), "p10": float(p10), "median": float(p50),
            "p90": float(p90), "max": float(v.max()), "mean": float(v.mean())}


def group_summary(recs: list[dict]) -> dict:
    trained = [r for r in recs if r["status"] == "trained"]
    gains = [r["gain_points"] for r in trained if r.get("gain_points") is not None]
    unfit = [r for r in recs if r["status"] == "does not fit"]
    guard = dict(Counter(r.get("guard") or "no selection" for r in trained))
    return {
        "users": len(recs), "trained": len(trained), "does_not_fit": len(unfit),
        "other_errors": len(recs) - len(trained) - len(unfit),
        "needed_bytes_min": min((r["needed_bytes"] for r in unfit
                                 if r.get("needed_bytes")), default=None),
        "peak_bytes": _dist([r["measured_peak_bytes"] for r in trained
                             if r.get("measured_peak_bytes") is not None]),
        "process_rss_bytes": _dist([r["peak_rss_bytes"] for r in recs
                                    if r.get("peak_rss_bytes")]),
        "step_time_s": _dist([r["step_time_s"] for r in trained if r.get("step_time_s")]),
        "task_time_s": _dist([r["ended_at"] - r["started_at"] for r in recs
                              if r.get("started_at") and r.get("ended_at")]),
        "gain_points": _dist(gains),
        "gained": sum(g > 0 for g in gains), "lost": sum(g < 0 for g in gains),
        "unchanged": sum(g == 0 for g in gains), "guard": guard,
        "over_budget": sum(1 for r in trained
                           if (r.get("measured_peak_bytes") or 0) > r["budget_bytes"]),
        "over_declared_memory": sum(1 for r in recs if r.get("declared_memory_bytes") and
                                    (r.get("peak_rss_bytes") or 0)
                                    > r["declared_memory_bytes"]),
    }


def report(recs: list[dict], spec_devices=()) -> dict:
    """The fleet's summary: per device, per kind of user (real, synthetic), and per user.
    spec_devices: every device of the spec, so one no user drew still has its row."""
    from device_sim.profiles import PROFILES

    devices = sorted({r["device"] for r in recs} | {d for d in spec_devices if d in PROFILES})
    pids = [r["pid"] for r in recs if r.get("pid") is not None]
    spans = [(r["started_at"], r["ended_at"]) for r in recs
             if r.get("started_at") and r.get("ended_at")]
    per_device = {d: {"budget_bytes": next((r["budget_bytes"] for r in recs if r["device"] == d),
                                           PROFILES[d].ram_budget_bytes if d in PROFILES else 0),
                      **{kind: group_summary([r for r in recs if r["device"] == d
                                              and r["kind"] == kind])
                         for kind in ("real", "synthetic")}} for d in devices}
    return {
        "records": len(recs), "devices": per_device,
        "distinct_processes": len(set(pids)), "runs_with_a_process": len(pids),
        "first_start": min((s for s, _ in spans), default=None),
        "last_end": max((e for _, e in spans), default=None),
        "users": [{k: r.get(k) for k in ("user", "kind", "device", "status", "accuracy_before",
                                         "accuracy_after", "gain_points", "guard",
                                         "measured_peak_bytes", "attempts")} for r in recs],
    }


def mib(n) -> str:
    return "" if n is None else f"{n / 2**20:.2f} MiB"


def table(rep: dict) -> str:
    """The per-device summary as a terminal table."""
    head = (f"{'device':18} {'users':>9} {'trained':>7} {'no fit':>6} {'peak (median)':>14} "
            f"{'budget':>11} {'step':>9} {'gain median':>11} {'gained/lost/same':>16} "
            f"{'guard kept':>10}")
    lines = [head, "-" * len(head)]
    for d, s in rep["devices"].items():
        if not s["real"]["users"] and not s["synthetic"]["users"]:
            lines.append(f"{d:18} {0:>5}      no user drew this device")
        for kind in ("real", "synthetic"):
            g = s[kind]
            if not g["users"]:
                continue
            peak = g["peak_bytes"]["median"] if g["peak_bytes"] else None
            step = f"{g['step_time_s']['median'] * 1e3:.1f} ms" if g["step_time_s"] else ""
            gain = f"{g['gain_points']['median']:+.1f} pt" if g["gain_points"] else ""
            lines.append(
                f"{d:18} {g['users']:>5} {kind[:4]:>3} {g['trained']:>7} "
                f"{g['does_not_fit']:>6} {mib(peak):>14} {mib(s['budget_bytes']):>11} "
                f"{step:>9} {gain:>11} "
                f"{g['gained']:>6}/{g['lost']}/{g['unchanged']:<6} "
                f"{g['guard'].get('kept population', 0):>10}")
    lines.append(f"{rep['records']} records from {rep['distinct_processes']} processes "
                 f"({rep['runs_with_a_process']} runs in a process)")
    return "\n".join(lines)


def plots(recs: list[dict], out_dir: str | Path) -> list[str]:
    """gains.png, peaks.png and timeline.png in out_dir; their paths."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    devices = sorted({r["device"] for r in recs})
    trained = [r for r in recs if r["status"] == "trained"]
    fig, axes = plt.subplots(1, len(devices), figsize=(4 * len(devices), 3), squeeze=False)
    for ax, d in zip(axes[0], devices):
        gains = {kind: [r["gain_points"] for r in trained if r["device"] == d
                        and r["kind"] == kind and r.get("gain_points") is not None]
                 for kind in ("synthetic", "real")}
        if gains["synthetic"]:
            ax.hist(gains["synthetic"], bins=20, color="tab:blue", alpha=0.7,
                    label=f"synthetic users ({len(gains['synthetic'])})")
        for k, g in enumerate(gains["real"]):  # each real user a line no bar can hide
            ax.axvline(g, color="tab:orange", lw=2.2, zorder=3,
                       label=f"real users ({len(gains['real'])})" if k == 0 else None)
        if not any(r["device"] == d for r in trained):
            n = sum(r["device"] == d for r in recs)
            ax.text(0.5, 0.5, f"no run fits\n({n} users recorded\nas 'does not fit')",
                    ha="center", va="center", transform=ax.transAxes, fontsize=9)
            ax.set_xticks([])
            ax.set_yticks([])
        ax.axvline(0, color="k", lw=0.8)
        ax.set_title(d, fontsize=9)
        ax.set_xlabel("gain in held-out accuracy (points)")
        ax.set_ylabel("users")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    fig.tight_layout()
    paths = [out_dir / "gains.png"]
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(max(4, 1.6 * len(devices)), 3.2))
    for i, d in enumerate(devices):
        peaks = [r["measured_peak_bytes"] / 2**20 for r in trained if r["device"] == d
                 and r.get("measured_peak_bytes") is not None]
        budget = next(r["budget_bytes"] for r in recs if r["device"] == d) / 2**20
        jitter = np.random.default_rng(i).uniform(-0.15, 0.15, len(peaks))
        ax.scatter(i + jitter, peaks, s=6, alpha=0.5, color="tab:blue",
                   label="a run's measured peak" if i == 0 else None)
        ax.hlines(budget, i - 0.35, i + 0.35, colors="r", lw=2,
                  label="the device's budget" if i == 0 else None)
        unfit = sum(r["device"] == d and r["status"] == "does not fit" for r in recs)
        if unfit:  # runs that could not start: marked above the budget, with their count
            ax.scatter([i], [budget * 1.4], marker="x", color="r", s=40,
                       label="users that did not fit" if not any(
                           "did not fit" in h for h in ax.get_legend_handles_labels()[1])
                       else None)
            ax.annotate(f"{unfit} did not fit", (i, budget * 1.4), xytext=(6, 0),
                        textcoords="offset points", fontsize=7, color="r")
    ax.set_xticks(range(len(devices)), devices, fontsize=8, rotation=15)
    ax.set_yscale("log")
    ax.set_ylabel("MiB")
    ax.set_title("Measured training peak per run\nagainst its device's budget", fontsize=9)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    paths.append(out_dir / "peaks.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)

    spans = sorted((r for r in recs if r.get("started_at") and r.get("ended_at")),
                   key=lambda r: r["started_at"])
    if spans:
        t0 = spans[0]["started_at"]
        fig, ax = plt.subplots(figsize=(8, 3))
        colours = {d: f"C{i}" for i, d in enumerate(devices)}
        for k, r in enumerate(spans):
            ax.plot([r["started_at"] - t0, r["ended_at"] - t0], [k, k],
                    color=colours[r["device"]], lw=1)
        for d, c in colours.items():
            ax.plot([], [], color=c, label=d)
        ax.set_xlabel("seconds since the first task started")
        ax.set_ylabel("task, in order of start")
        ax.legend(fontsize=7)
        ax.set_title("fleet timeline: each task's time in its worker", fontsize=9)
        fig.tight_layout()
        paths.append(out_dir / "timeline.png")
        fig.savefig(paths[-1], dpi=110)
        plt.close(fig)
    return [str(p) for p in paths]


MAX_FLEET_JSON_BYTES = 512 << 20  # about 1 KB a record: half a million runs
_REQUIRED = {"user": int, "kind": str, "device": str, "status": str, "budget_bytes": int}
_NUMBERS = ("declared_memory_bytes", "ended_at", "gain_points", "measured_peak_bytes",
            "needed_bytes", "peak_rss_bytes", "pid", "started_at", "step_time_s")


def _record_problem(i: int, r) -> str | None:
    """What is wrong with record i of a fleet.json, for the fields the report reads."""
    if not isinstance(r, dict):
        return f"record {i} is {type(r).__name__}, not an object"
    for key, kind in _REQUIRED.items():
        if not isinstance(r.get(key), kind) or isinstance(r.get(key), bool):
            return f"record {i} field {key!r} is {repr(r.get(key))[:40]}, not {kind.__name__}"
    for key in _NUMBERS:
        v = r.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
            return f"record {i} field {key!r} is {repr(v)[:40]}, not a number"
    if r.get("guard") is not None and not isinstance(r["guard"], str):
        return f"record {i} field 'guard' is {repr(r['guard'])[:40]}, not a string"
    return None


def load_records(fleet_dir: str | Path) -> list[dict]:
    """The merged records of a fleet folder, each checked for what the report reads
    (ValueError naming the record, the field and the value)."""
    path = Path(fleet_dir) / "fleet.json"
    if not os.path.lexists(path):
        raise ValueError(f"{path} does not exist: {fleet_dir} is not a fleet folder; run "
                         f"`edgetrain fleet SPEC --out {fleet_dir}` first")
    recs = read_json(path, MAX_FLEET_JSON_BYTES, "a fleet's records", "Run `edgetrain fleet` "
                     "again to merge the records anew")
    if not isinstance(recs, list):
        raise ValueError(f"{path} holds {type(recs).__name__}, not a list of records; run "
                         "`edgetrain fleet` again to merge the records anew")
    for i, r in enumerate(recs):
        problem = _record_problem(i, r)
        if problem:
            raise ValueError(f"{path}: {problem}; run `edgetrain fleet` again to merge the "
                             "records anew")
    return recs


def spec_devices(fleet_dir: str | Path) -> tuple[str, ...]:
    """The devices of the spec a fleet folder ran (its fleet-spec.json), so a device no user
    drew keeps its row; () when the folder holds none."""
    path = Path(fleet_dir) / "fleet-spec.json"
    if not os.path.lexists(path):
        return ()
    doc = read_json(path, 1 << 20, "a fleet's spec", "Run `edgetrain fleet` again")
    devices = (doc.get("spec") or {}).get("devices") if isinstance(doc, dict) else None
    return tuple(d for d in devices if isinstance(d, str)) if isinstance(devices, dict) else ()

