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
"""
from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from common import ROOT, replace_table, run, save_results

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


def main() -> None:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
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
    save_results("feed_paths", rows)
    lines = ["| artifact | numpy inputs, a call | bound OrtValues, a call | saved |",
             "|---|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['case']} | {r['numpy_call_s'] * 1e3:.3f} ms | "
                     f"{r['bound_call_s'] * 1e3:.3f} ms | "
                     f"{1 - r['bound_call_s'] / r['numpy_call_s']:+.1%} |")
    replace_table(DOC, lines, "feed-paths")


if __name__ == "__main__":
    main()
