"""What folding frozen BatchNorms into their convolutions buys (exporters/passes/convbn.py).

    .venv/bin/python bench/convbn.py           # C5 and C6, about 4 min on 2 cores
    .venv/bin/python bench/convbn.py --heavy   # C4 (ResNet-50) alone (bench/heavy.py)

For three stack rows' configurations (untrained exports: time and memory do not depend on
the weights), the same export three ways, set by exporters.passes.convbn.WEIGHT_SHARE in the
exporting process: no layer folded (0), the exporter's rule (its default: where the weight is
no larger than the convolution's output at the plan's micro-batch), and every layer folded
(infinity). For each: the layers folded, the predicted peak, the peak measured by
`edgetrain measure` (the allocator), and the runtime's training call (DeviceRuntime.
train_micro_batch) timed after two warm-up calls, in a fresh process per block (one runtime
per process), the three artifacts alternately in BLOCKS blocks, the median block. Results: bench/results/convbn.json; table in
docs/results.md (marker `convbn`).
"""
from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from common import ROOT, measure_or_report, replace_table, run
from heavy import HEAVY_HELP, is_heavy, kept_rows, why_mixed

DOC = ROOT / "docs" / "results.md"
BLOCKS = 4
SHARES = {"none": "0", "rule": None, "all": "float('inf')"}
CASES = [  # row, export arguments, calls per block
    ("C4", ["--model", "resnet50", "--width", "1.0", "--density", "0.1", "--recompute", "sqrt"],
     5),
    ("C5", ["--model", "mobilenet_v1", "--width", "1.0", "--density", "0.1", "--recompute",
            "sqrt"], 20),
    ("C6", ["--model", "patch_mobilenet", "--width", "1.0", "--density", "0.1", "--recompute",
            "sqrt"], 200),
]
EXPORT = """
import sys
import exporters.passes.convbn
if sys.argv[1] != "None":
    exporters.passes.convbn.WEIGHT_SHARE = eval(sys.argv[1])
from edgetrain.cli import main
sys.argv = ["edgetrain", *sys.argv[2:]]
main()
"""
CHILD = """
import json, sys, time
import numpy as np
from edgetrain.runtime import DeviceRuntime
art, n = sys.argv[1], int(sys.argv[2])
rt = DeviceRuntime(art)
rt.micro_batch = 1
rng = np.random.default_rng(0)
x = rng.standard_normal((1, *rt.manifest.input.sample_shape)).astype(np.float32)
y = np.zeros(1, np.int64)
for _ in range(2):  # warm-up: the arena's growth, first-touch pages
    rt.train_micro_batch(x, y)
t0 = time.perf_counter()
for _ in range(n):
    rt.train_micro_batch(x, y)
print(json.dumps((time.perf_counter() - t0) / n))
"""


def call_s(art: str, n: int) -> float:
    """The runtime's mean training call over n calls, in a fresh process (one runtime per
    process: its memory cap is process-wide)."""
    p = subprocess.run([sys.executable, "-c", CHILD, art, str(n)], capture_output=True,
                       text=True, check=True, cwd=ROOT)
    return json.loads(p.stdout.strip().splitlines()[-1])


def export(out: Path, args: list[str], share: str | None) -> dict:
    p = subprocess.run([sys.executable, "-c", EXPORT, str(share), "export", *args, "--epochs",
                        "0", "--micro-batch", "1", "--out", str(out), "--json"],
                       capture_output=True, text=True, cwd=ROOT)
    if p.returncode != 0:
        raise SystemExit(f"export failed:\n{p.stderr[-2000:]}")
    return json.loads(p.stdout)


def network_of(row: dict) -> str:
    return row["export"][row["export"].index("--model") + 1]


def measure(heavy: bool) -> list[dict]:
    """This run's part of the cases (bench/heavy.py) measured, the other part's rows kept."""
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        mine = [c for c in CASES if is_heavy(network_of({"export": c[1]})) == heavy]
        for row, args, n in mine:
            arts, found = [], {}
            for variant, share in SHARES.items():
                art = Path(tmp) / f"{row}-{variant}"
                m = export(art, args, share)
                peak = json.loads(run("measure", str(art), "--batch", "1", "--steps", "1",
                                      "--no-select", "--json"))["peak_bytes"]
                found[variant] = {"folded": m["provenance"]["passes"]["fold_conv_batchnorms"],
                                  "predicted_peak_bytes": m["predicted"]["peak_bytes"],
                                  "peak_bytes": peak}
                arts.append(str(art))
            times = [[] for _ in arts]
            for _ in range(BLOCKS):  # the variants alternately, a fresh process each
                for k, art in enumerate(arts):
                    times[k].append(call_s(art, n))
            for (variant, r), t in zip(found.items(), times):
                r.update(call_s=statistics.median(t), blocks_s=t)
            rows.append({"row": row, "export": args, "variants": found})
            print(json.dumps(rows[-1]), flush=True)
    order = [c[0] for c in CASES]
    return sorted(rows + kept_rows("convbn", heavy, network_of),
                  key=lambda r: order.index(r["row"]))


def report(rows: list[dict]) -> None:
    lines = ["| row | folded | layers folded | call (median block) | vs none | measured peak | "
             "predicted |", "|---|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        base = r["variants"]["none"]["call_s"]
        for variant, v in r["variants"].items():
            lines.append(f"| {r['row']} | {variant} | {v['folded']} | {v['call_s'] * 1e3:.1f} ms | "
                         f"{v['call_s'] / base - 1:+.1%} | {v['peak_bytes']:,} | "
                         f"{v['predicted_peak_bytes'] / v['peak_bytes'] - 1:+.1%} |")
    replace_table(DOC, lines, "convbn", sources=["convbn"],
                  why_mixed=why_mixed("convbn", network_of))


if __name__ == "__main__":
    measure_or_report("convbn", measure, report, __doc__.splitlines()[0], HEAVY_HELP)
