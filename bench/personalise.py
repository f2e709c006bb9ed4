"""Personalisation for every user: each of the ten subjects is a held-out user once.

    .venv/bin/python bench/personalise.py                  # patch_mobilenet, ~40 min on 2 cores
    .venv/bin/python bench/personalise.py --model imu_cnn  # the raw-IMU 1-D CNN, ~10 min
    .venv/bin/python bench/personalise.py --report         # tables and plot from saved rows

Five folds of two subjects ({1,2}, {3,4}, ... {9,10}): a fold's population model pretrains on
the other eight and never sees its held-out users. Each held-out user then personalises on
device (`edgetrain personalise`, watchos-extension budget, micro-batch 8; 7 for a raw-IMU
network with one label per class: 7 windows, 7 items) from the population
model, once per mode: label-free (BatchNorm statistics from the user's unlabelled windows),
1 and 5 labelled windows per class, and all labelled windows. Labelled modes use the product's
on-device selection: a validation slice cut in time from the user's personalisation arm,
learning rates 1e-4/3e-4/9e-4, early stopping, keep-best, and the do-no-harm guard. The test
arm (the user's other arm) is read only for the final numbers. Rows are appended to
bench/results/personalise-<model>.jsonl as they finish (a stopped run continues where it
stopped); --report writes bench/results/personalise.json, the tables in docs/results.md and
docs/img/personalise.png. Gains: mean over users, with a 95% interval from a bootstrap over
users and, within each user, over test windows (paired: a window's before and after move
together).
"""
from __future__ import annotations

import argparse
import json
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from common import ROOT, replace_table, run, save_results

FOLDS = ((1, 2), (3, 4), (5, 6), (7, 8), (9, 10))
MODES = {"label-free": ["--labels-per-class", "0", "--adapt", "bn"],
         "1 label/class": ["--labels-per-class", "1"],
         "5 labels/class": ["--labels-per-class", "5"],
         "all labels": []}
DEVICE, MICRO_BATCH, EPOCHS = "watchos-extension", 8, 5
RESULTS = ROOT / "bench" / "results"


@dataclass(frozen=True)
class Variant:
    """A network as it ships to one device: what trains, its width, micro-batch and threads."""
    model: str = "patch_mobilenet"
    update: str = "all"
    device: str = DEVICE
    width: float | None = None
    micro_batch: int = MICRO_BATCH
    threads: int = 2

    @property
    def label(self) -> str:  # the network column of the tables
        extra = [f"update {self.update}"] if self.update != "all" else []
        extra += [f"width {self.width:g}"] if self.width is not None else []
        extra += [self.device] if self.device != DEVICE else []
        extra += [f"micro-batch {self.micro_batch}"] if self.micro_batch != MICRO_BATCH else []
        return self.model + (f" ({', '.join(extra)})" if extra else "")


def rows_path(label: str) -> Path:
    return RESULTS / f"personalise-{re.sub(r'[^A-Za-z0-9_.-]+', '-', label).strip('-')}.jsonl"


def export_fold(v: Variant, users: tuple[int, int], out: Path) -> None:
    from edgetrain.manifest import Plan
    from exporters.pretrain import PretrainConfig, export_named

    cfg = PretrainConfig(model=v.model, width=v.width, holdout_user=users[0],
                         also_held_out=users[1:])
    export_named(cfg, out, Plan(micro_batch=v.micro_batch, threads=v.threads),
                 show_progress=False, cache_dir=ROOT / ".cache" / "pretrain",
                 update=None if v.update == "all" else v.update)


def main(v: Variant) -> None:
    model = v.label
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = rows_path(model)
    done = {(r["user"], r["mode"]) for r in _rows(path)}
    with tempfile.TemporaryDirectory() as tmp:
        for users in FOLDS:
            todo = [(u, m) for u in users for m in MODES if (u, m) not in done]
            if not todo:
                continue
            art = Path(tmp) / f"fold-{users[0]}"
            export_fold(v, users, art)
            for user, mode in todo:
                out = Path(tmp) / f"run-{user}-{mode.split()[0]}"
                # one labelled window of each of 7 classes is 7 items for a raw-IMU network
                # (a patch model cuts each window into 49 patches)
                raw = v.model.startswith("imu_")
                batch = min(7, v.micro_batch) if raw and mode == "1 label/class" else v.micro_batch
                r = json.loads(run("personalise", str(art), "--user", str(user), "--device",
                                   v.device, "--micro-batch", str(batch), "--epochs",
                                   str(EPOCHS), "--out", str(out), "--json", *MODES[mode]))
                row = {"model": model, "fold": list(users), "user": user, "mode": mode, **r}
                with open(path, "a") as f:
                    f.write(json.dumps(row) + "\n")
                print(json.dumps({k: row[k] for k in ("user", "mode", "accuracy_before",
                                                      "accuracy_after", "train_time_s")}),
                      flush=True)


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []


def bootstrap_gain(rows: list[dict], n: int = 10_000, seed: int = 0) -> tuple[float, float, float]:
    """Mean gain over users (points) and its 95% interval: users resampled, and each
    resampled user's test windows resampled, before and after paired."""
    rng = np.random.default_rng(seed)
    pairs = [(np.array(list(r["test_correct_before"]), int), np.array(list(r["test_correct_after"]), int))
             for r in rows]
    mean = 100 * float(np.mean([a.mean() - b.mean() for b, a in pairs]))
    draws = np.empty(n)
    for i in range(n):
        total = 0.0
        for u in rng.integers(0, len(pairs), len(pairs)):
            b, a = pairs[u]
            w = rng.integers(0, len(b), len(b))
            total += a[w].mean() - b[w].mean()
        draws[i] = 100 * total / len(pairs)
    lo, hi = np.percentile(draws, [2.5, 97.5])
    return mean, float(lo), float(hi)


def report(models: list[str]) -> None:
    everything, lines = [], []
    lines += ["| network | mode | population | after | mean gain (points, 95% interval) | "
              "worst user (points) | guard kept population |", "|---|---|---:|---:|---|---|---:|"]
    for model in models:
        rows = _rows(rows_path(model))
        everything += rows
        for mode in MODES:
            rs = sorted((r for r in rows if r["mode"] == mode), key=lambda r: r["user"])
            if not rs:
                continue
            mean, lo, hi = bootstrap_gain(rs)
            worst = min(rs, key=lambda r: r["accuracy_after"] - r["accuracy_before"])
            kept = sum(bool(r["guard"] and r["guard"]["kept_population"]) for r in rs)
            guarded = sum(r["guard"] is not None for r in rs)
            lines.append(
                f"| {model} | {mode} | {np.mean([r['accuracy_before'] for r in rs]):.3f} | "
                f"{np.mean([r['accuracy_after'] for r in rs]):.3f} | {mean:+.1f} "
                f"[{lo:+.1f}, {hi:+.1f}] | user {worst['user']}: "
                f"{100 * (worst['accuracy_after'] - worst['accuracy_before']):+.1f} | "
                + (f"{kept} of {guarded}" if guarded else "- (no labels)") + " |")
    per_user = ["| network | user | population | label-free | 1 label/class | 5 labels/class | "
                "all labels | guard (all labels) |", "|---|---:|---:|---:|---:|---:|---:|---|"]
    for model in models:
        rows = _rows(rows_path(model))
        for user in sorted({r["user"] for r in rows}):
            by = {r["mode"]: r for r in rows if r["user"] == user}
            cells = [f"{by[m]['accuracy_after']:.3f}" if m in by else "-" for m in MODES]
            before = next(iter(by.values()))["accuracy_before"]
            g = by.get("all labels", {}).get("guard")
            per_user.append(f"| {model} | {user} | {before:.3f} | {' | '.join(cells)} | "
                            + ("kept population" if g and g["kept_population"] else
                               "personalised" if g else "-") + " |")
    save_results("personalise", everything)
    replace_table(ROOT / "docs" / "results.md", lines, "personalise-table")
    replace_table(ROOT / "docs" / "results.md", per_user, "personalise-users")
    plot(models)


def plot(models: list[str]) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(models), 2, figsize=(11, 3.6 * len(models)), squeeze=False)
    for (left, right), model in zip(axes, models):
        rows = _rows(rows_path(model))
        users = sorted({r["user"] for r in rows})
        full = {r["user"]: r for r in rows if r["mode"] == "all labels"}
        before = [full[u]["accuracy_before"] if u in full else np.nan for u in users]
        after = [full[u]["accuracy_after"] if u in full else np.nan for u in users]
        x = np.arange(len(users))
        left.bar(x - 0.2, before, 0.4, label="population model")
        left.bar(x + 0.2, after, 0.4, label="personalised (all labels, guarded)")
        left.set_xticks(x, [str(u) for u in users])
        left.set(xlabel="held-out user", ylabel="test accuracy", ylim=(0, 1),
                 title=f"{model}: every user before and after")
        left.legend(loc="lower right", fontsize=8)
        xs, ys = [], []
        for i, mode in enumerate(MODES):
            rs = [r for r in rows if r["mode"] == mode]
            if rs:
                xs.append(i)
                ys.append(np.mean([r["accuracy_after"] - r["accuracy_before"] for r in rs]) * 100)
        right.plot(xs, ys, "o-")
        right.axhline(0, color="grey", lw=0.8)
        right.set_xticks(range(len(MODES)), list(MODES), fontsize=8)
        right.set(ylabel="mean gain over population (points)",
                  title=f"{model}: gain against labels per class")
    fig.tight_layout()
    fig.savefig(ROOT / "docs" / "img" / "personalise.png", dpi=110)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", action="append", help="network(s); default patch_mobilenet")
    ap.add_argument("--update", default="all", help="update plan the folds export with")
    ap.add_argument("--device", default=DEVICE)
    ap.add_argument("--width", type=float)
    ap.add_argument("--micro-batch", type=int, default=MICRO_BATCH)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--report", action="store_true", help="only write tables and the plot")
    a = ap.parse_args()
    if not a.report:
        for m in a.model or ["patch_mobilenet"]:
            main(Variant(m, a.update, a.device, a.width, a.micro_batch, a.threads))
    labels = [json.loads(p.read_text().splitlines()[0])["model"]
              for p in sorted(RESULTS.glob("personalise-*.jsonl"))]
    report(sorted(labels, key=lambda m: (m.split()[0] != "patch_mobilenet", m)))
