"""What binding a training call's inputs to pre-allocated buffers would buy (issue 21, item 2).

    .venv/bin/python bench/feed_paths.py      # ~2 min on 2 cores

The runtime hands each micro-batch to ONNX Runtime as numpy arrays (`Module.__call__`, whose
pybind layer wraps contiguous float32/int64 arrays without a copy). The alternative the
1.19.2 training API allows: OrtValues made once over pre-allocated numpy buffers, the
micro-batch copied into them, `Module.__call__` with the OrtValues
(`train_step_with_ort_values`). Both are timed on the same runtime, alternately in blocks,
for two artifacts exported untrained: imu_cnn training its head (C8's network, a
sub-millisecond call) and MobileNetV1 at micro-batch 1 (C5's configuration). Results:
bench/results/feed_paths.json; table in docs/results.md (marker `feed-paths`).

Then the patch MobileNet's inputs (issue 21's "cache per-user derived inputs"): C6's
configuration makes each of a step's 1,568 one-patch micro-batches on demand, a 32x32 GASF
patch from the 64 time points it spans, in the epoch's shuffled order (edgetrain/shuffle.py,
as edgetrain/trainloop.py draws it), so a window's signals are rarely reused between calls.
Timed in a torch-free process on held-out user 10's windows: one step's inputs as the
runtime makes them, and the bytes a cache of every patch of the user's windows would hold,
beside C6's step time from bench/results/eager_race.json and the watch budgets. Table in
docs/results.md (marker `patch-inputs`).
"""
from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from common import ROOT, load_results, measure_or_report, replace_table, run

DOC = ROOT / "docs" / "results.md"
CASES = [  # label, export arguments, micro-batch, calls per block
    ("imu_cnn, head trains, micro-batch 8 (C8)",
     ["--model", "imu_cnn", "--update", "head", "--micro-batch", "8"], 8, 500),
    ("mobilenet_v1, micro-batch 1 (C5)",
     ["--model", "mobilenet_v1", "--width", "1.0", "--density", "0.1", "--recompute", "sqrt",
      "--micro-batch", "1"], 1, 10),
]
BLOCKS = 5
CHILD = """
import json, sys, time
import numpy as np
from edgetrain.ort_device import onnxruntime
from edgetrain.runtime import DeviceRuntime
art, mb, n, blocks = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
rt = DeviceRuntime(art)
rt.micro_batch = mb
shape = rt.manifest.input.sample_shape
rng = np.random.default_rng(0)
xs = rng.standard_normal((n, mb, *shape)).astype(np.float32)
ys = rng.integers(0, rt.manifest.num_classes, (n, mb))
xb, yb = np.zeros((mb, *shape), np.float32), np.zeros(mb, np.int64)
ort = onnxruntime()
ovx, ovy = ort.OrtValue.ortvalue_from_numpy(xb), ort.OrtValue.ortvalue_from_numpy(yb)

def numpy_path(i):
    return rt.train_micro_batch(xs[i], ys[i])

def bound_path(i):
    np.copyto(xb, xs[i]); np.copyto(yb, ys[i])
    return float(rt.module(ovx, ovy)[0].numpy())

out = {"numpy": [], "bound": []}
for f in (numpy_path, bound_path):
    for i in range(min(n, 5)):
        f(i)
for _ in range(blocks):
    for key, f in (("numpy", numpy_path), ("bound", bound_path)):
        t0 = time.perf_counter()
        for i in range(n):
            f(i)
        out[key].append((time.perf_counter() - t0) / n)
print(json.dumps(out))
"""


PATCH_CHILD = """
import json, sys, time
import numpy as np
from edgetrain.data import leave_one_subject_out, load_recordings
from edgetrain.feed import Feed
from edgetrain.manifest import load_manifest
from edgetrain.shuffle import Shuffle
art, items, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
m = load_manifest(art)
x, y = leave_one_subject_out(load_recordings(), 10).personalise
feed = Feed(x, y, m)
order = Shuffle(len(feed), 12345)
times = []
for r in range(rounds):
    idx = order(np.arange(r * items, (r + 1) * items) % len(feed))
    t0 = time.perf_counter()
    for i in idx:
        feed.inputs(np.array([i]))
    times.append(time.perf_counter() - t0)
item_bytes = int(np.prod(m.input.sample_shape)) * 4
print(json.dumps({"step_inputs_s": times, "items_per_window": feed.per_sample,
                  "windows": feed.num_samples, "item_bytes": item_bytes,
                  "cache_bytes": len(feed) * item_bytes}))
"""
PATCH_ITEMS = 32 * 49  # C6's step: 32 windows x 49 patches, one patch a micro-batch
BUDGETS = {"watchos-extension": 15 * 2**20, "watch-app-low": 64 * 2**20}


def patch_inputs(tmp: Path) -> dict:
    art = tmp / "patch"
    run("export", "--model", "patch_mobilenet", "--width", "1.0", "--density", "0.1",
        "--recompute", "sqrt", "--micro-batch", "1", "--epochs", "0", "--out", str(art),
        "--json")
    p = subprocess.run([sys.executable, "-c", PATCH_CHILD, str(art), str(PATCH_ITEMS),
                        str(BLOCKS)], capture_output=True, text=True, check=True, cwd=ROOT)
    t = json.loads(p.stdout.strip().splitlines()[-1])
    race = load_results("eager_race")
    c6 = next(r for r in race if r["config"] == "C6")
    return {**t, "step_inputs_median_s": statistics.median(t["step_inputs_s"]),
            "c6_step_s": c6["portable_median_s"],  # what a watch runs
            "c6_step_commit": c6.get("commit") or "a commit not recorded"}


def patch_table(r: dict) -> list[str]:
    share = r["step_inputs_median_s"] / r["c6_step_s"]
    lines = ["| measurement | value |", "|---|---:|",
             f"| one step's inputs, made on demand ({PATCH_ITEMS:,} patches, shuffled; median "
             f"of {len(r['step_inputs_s'])}) | {r['step_inputs_median_s']:.3f} s |",
             f"| C6's step (edgetrain, portable artifact; the eager race at "
             f"{r.get('c6_step_commit', 'a commit not recorded')}) | {r['c6_step_s']:.3f} s |",
             f"| inputs' share of the step | {share:.1%} |",
             f"| a cache of every patch of user 10's {r['windows']} windows "
             f"({r['items_per_window']} x {r['item_bytes']:,} bytes each) | "
             f"{r['cache_bytes']:,} bytes |"]
    for device, budget in BUDGETS.items():
        lines.append(f"| … against `{device}`'s budget ({budget:,} bytes) | "
                     f"{r['cache_bytes'] / budget:.1f}× |")
    return lines


def measure() -> dict:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        patch = patch_inputs(Path(tmp))
        print(json.dumps(patch), flush=True)
        for label, args, mb, n in CASES:
            art = Path(tmp) / f"a{len(rows)}"
            run("export", *args, "--epochs", "0", "--out", str(art), "--json")
            p = subprocess.run([sys.executable, "-c", CHILD, str(art), str(mb), str(n),
                                str(BLOCKS)], capture_output=True, text=True, check=True,
                               cwd=ROOT)
            t = json.loads(p.stdout.strip().splitlines()[-1])
            row = {"case": label, "numpy_call_s": statistics.median(t["numpy"]),
                   "bound_call_s": statistics.median(t["bound"]), "blocks": t}
            print(json.dumps(row), flush=True)
            rows.append(row)
    return {"bound_inputs": rows, "patch_inputs": patch}


def report(results: dict) -> None:
    rows = results["bound_inputs"]
    replace_table(DOC, patch_table(results["patch_inputs"]), "patch-inputs",
                  sources=["feed_paths"])
    lines = ["| artifact | numpy inputs, a call | bound OrtValues, a call | saved |",
             "|---|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['case']} | {r['numpy_call_s'] * 1e3:.3f} ms | "
                     f"{r['bound_call_s'] * 1e3:.3f} ms | "
                     f"{1 - r['bound_call_s'] / r['numpy_call_s']:+.1%} |")
    replace_table(DOC, lines, "feed-paths", sources=["feed_paths"])


if __name__ == "__main__":
    measure_or_report("feed_paths", measure, report, __doc__.splitlines()[0])
