"""Personalisation dense vs sparse (static mask, SET, RigL) on the held-out user, same budget.

    .venv/bin/python bench/dst.py        # about 10 minutes on 2 cores

Exports the pretrained patch MobileNet (the population model that left out user 10) dense
and at density 0.1 (ERK, magnitude-pruned), then personalises each on user 10 inside the
watchos-extension budget with the same epochs, learning rate and data order: dense, sparse
with the first mask kept (static), SET and RigL (mask update every 10 steps, drop fraction 0.3
with cosine decay, none after 75% of the steps). Three seeds each (data order and SET's
random growth). Two runs at a time, one ORT thread each (PARALLEL_RUNS): their train times
are so measured. Measures each artifact's training step peak with ORT's allocator. Writes
bench/results/dst.json and the table in docs/sparse.md.
"""
from __future__ import annotations

import json
import statistics
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from common import ROOT, measure_or_report, replace_table, run

DENSITY, DEVICE, USER, EPOCHS, SEEDS = 0.1, "watchos-extension", 10, 3, (0, 1, 2)
PARALLEL_RUNS = 2  # personalisation runs at once, one ORT thread each
RUNS = {"dense": (1.0, None), "static": (DENSITY, None), "set": (DENSITY, "set"),
        "rigl": (DENSITY, "rigl")}


def measure() -> list[dict]:
    with tempfile.TemporaryDirectory() as tmp:
        arts = {}
        for density in sorted({d for d, _ in RUNS.values()}):
            arts[density] = Path(tmp) / f"d{density}"
            run("export", "--model", "patch_mobilenet", "--density", str(density),
                "--holdout-user", str(USER), "--no-masking-check", "--out", str(arts[density]))
        peaks = {d: json.loads(run("measure", str(a), "--batch", "8", "--json"))["peak_bytes"]
                 for d, a in arts.items()}

        def one(name: str, seed: int) -> dict:
            density, method = RUNS[name]
            extra = ["--mask-update", method] if method else []
            r = json.loads(run("personalise", str(arts[density]), "--user", str(USER),
                               "--device", DEVICE, "--epochs", str(EPOCHS), "--seed",
                               str(seed), "--out", str(Path(tmp) / f"{name}-{seed}"),
                               "--threads", "1", "--json", "--no-select", *extra))
            row = {"run": name, "density": density, "seed": seed, "threads": 1,
                   "runs_at_once": PARALLEL_RUNS, "step_peak_bytes": peaks[density], **r}
            print(json.dumps({k: row[k] for k in ("run", "seed", "accuracy_before",
                                                  "accuracy_after", "train_time_s",
                                                  "mask_updates")}), flush=True)
            return row

        with ThreadPoolExecutor(PARALLEL_RUNS) as pool:
            jobs = [pool.submit(one, name, seed) for name in RUNS for seed in SEEDS]
            rows = [job.result() for job in jobs]  # in RUNS' order, whatever finished first
    return rows


def report(rows: list[dict]) -> None:
    how = ({(r.get("threads"), r.get("runs_at_once")) for r in rows})
    timed = ("train time" if how == {(None, None)} else  # rows from before they said
             "train time (" + "; ".join(f"{t} thread{'s' * (t > 1)}, {n} runs at a time"
                                        for t, n in sorted(how)) + ")")
    lines = ["| run | density | measured step peak | accuracy before | accuracy after "
             f"(mean ± sd, 3 seeds) | per seed | mask updates | {timed} |",
             "|---|---:|---:|---:|---:|---|---:|---:|"]
    for name in RUNS:
        rs = [r for r in rows if r["run"] == name]
        after = [r["accuracy_after"] for r in rs]
        lines.append(
            f"| {name} | {rs[0]['density']} | {rs[0]['step_peak_bytes']:,} | "
            f"{rs[0]['accuracy_before']:.3f} | {statistics.mean(after):.3f} ± "
            f"{statistics.stdev(after):.3f} | {', '.join(f'{a:.3f}' for a in after)} | "
            f"{rs[0]['mask_updates']} | {statistics.mean(r['train_time_s'] for r in rs):.0f} s |")
    replace_table(ROOT / "docs" / "sparse.md", lines, "dst-table", sources=["dst"])


if __name__ == "__main__":
    measure_or_report("dst", measure, report, __doc__.splitlines()[0])
