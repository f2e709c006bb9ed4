"""Time one ONNX model in a process of its own: the benches that rewrite graphs import the
exporters (and with them torch), and the device side's onnxruntime() refuses a process that
has loaded torch, as a watch's runtime never has it."""
from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from common import ROOT

TIMER = """
import statistics, sys, time
import numpy as np
from edgetrain.ort_device import onnxruntime
model, feeds, outs = sys.argv[1:4]
threads, runs, warmup = (int(a) for a in sys.argv[4:7])
ort = onnxruntime()
so = ort.SessionOptions()
so.intra_op_num_threads = threads
so.log_severity_level = 3
s = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
feed = dict(np.load(feeds))
for _ in range(warmup):
    out = s.run(None, feed)
times = []
for _ in range(runs):
    t0 = time.perf_counter()
    out = s.run(None, feed)
    times.append(time.perf_counter() - t0)
np.savez(outs, *out)
print(statistics.median(times))
"""


def time_model(model, feed: dict, threads: int, runs: int, warmup: int
               ) -> tuple[float, list[np.ndarray]]:
    """The median time of `model` (an onnx ModelProto) on `feed` over `runs` runs after
    `warmup`, with `threads` intra-op threads, and its outputs, from a torch-free child."""
    with tempfile.TemporaryDirectory() as tmp:
        paths = [str(Path(tmp) / n) for n in ("m.onnx", "feed.npz", "out.npz")]
        Path(paths[0]).write_bytes(model.SerializeToString())
        np.savez(paths[1], **feed)
        p = subprocess.run([sys.executable, "-c", TIMER, *paths, str(threads), str(runs),
                            str(warmup)], capture_output=True, text=True, cwd=ROOT)
        if p.returncode != 0:
            raise SystemExit(f"timing a model failed:\n{p.stderr[-2000:]}")
        with np.load(paths[2]) as z:
            out = [z[f"arr_{i}"] for i in range(len(z.files))]
    return float(p.stdout.strip().splitlines()[-1]), out
