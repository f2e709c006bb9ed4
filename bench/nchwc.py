"""Depthwise convolutions in ORT's NCHWc kernels (exporters/passes/nchwc.py): layer by layer, and C6's
whole step with and without them.

    .venv/bin/python bench/nchwc.py      # ~5 min on 2 cores

1. Each depthwise layer of C6's patch MobileNet (width 1.0, 32x32 patches) as a one-node
   graph at 1 and 28 patches: ORT's Conv against the rewrite (both reorders included), 2
   threads, the median of 60 runs after 5 warm-ups, and the largest difference.
2. C6's configuration (untrained; 10% of weights kept, recompute sqrt) exported at micro-batch
   1 with --nchwc and --no-nchwc, each measured at micro-batch 1 and 28, the four in turn for
   ROUNDS rounds: a round times one step (`edgetrain measure --steps 1`: 1,568 patches, 1,568
   or 56 micro-batches, of which only the first grows the arena), a row is the median of its
   rounds.
Results: bench/results/nchwc.json; tables in docs/results.md (markers `nchwc-layers`,
`nchwc-step`).
"""
from __future__ import annotations

import json
import statistics
import tempfile
from pathlib import Path

import numpy as np
from onnx import TensorProto, helper

from common import ROOT, measure_or_report, replace_table, run, run_timed
from nodetimer import time_model
from exporters.passes.nchwc import host_block, rewrite_depthwise_nchwc
from exporters.predictor.shapes import tensor_shapes

DOC = ROOT / "docs" / "results.md"
THREADS, RUNS, WARMUP, ROUNDS = 2, 60, 5, 3
STEPS = 1  # timed steps a round of the C6 step: one is 8-25 s of 56-1,568 micro-batches
# the patch MobileNet's depthwise layers at width 1.0: (channels, input side, stride)
LAYERS = [(32, 32, 1), (64, 32, 2), (128, 16, 1), (128, 16, 2), (256, 8, 1), (256, 8, 2),
          (512, 4, 1), (1024, 4, 1)]
C6 = ["--model", "patch_mobilenet", "--width", "1.0", "--epochs", "0", "--density", "0.1",
      "--recompute", "sqrt", "--micro-batch", "1", "--accumulate", "1568"]


def _layer(channels: int, side: int, stride: int):
    x = helper.make_tensor_value_info("X", TensorProto.FLOAT, ["batch", channels, side, side])
    w = helper.make_tensor_value_info("W", TensorProto.FLOAT, [channels, 1, 3, 3])
    y = helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)
    node = helper.make_node("Conv", ["X", "W"], ["Y"], group=channels, kernel_shape=[3, 3],
                            pads=[1, 1, 1, 1], strides=[stride, stride])
    m = helper.make_model(helper.make_graph([node], "dw", [x, w], [y]),
                          opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def _time(model, feeds) -> tuple[float, np.ndarray]:
    median_s, out = time_model(model, feeds, THREADS, RUNS, WARMUP)
    return median_s, out[0]


def layer_rows() -> list[dict]:
    rows, rng = [], np.random.default_rng(0)
    for batch in (1, 28):
        for c, side, stride in LAYERS:
            feeds = {"X": rng.standard_normal((batch, c, side, side), np.float32),
                     "W": rng.standard_normal((c, 1, 3, 3), np.float32)}
            m = _layer(c, side, stride)
            before, want = _time(m, feeds)
            shapes = {k: list(v[0]) for k, v in tensor_shapes(m, batch).items()}
            rewrite_depthwise_nchwc(m, shapes, host_block())
            after, got = _time(m, feeds)
            rows.append({"kind": "layer", "batch": batch, "channels": c, "side": side,
                         "stride": stride, "ort_conv_s": before, "nchwc_s": after,
                         "max_abs_diff": float(np.abs(got - want).max())})
            print(json.dumps(rows[-1]), flush=True)
    return rows


def step_rows() -> list[dict]:
    with tempfile.TemporaryDirectory() as tmp:
        arts = {}
        for flag in ("--nchwc", "--no-nchwc"):
            arts[flag] = Path(tmp) / flag.strip("-")
            run("export", *C6, flag, "--out", str(arts[flag]), "--json")
        times = {(f, b): [] for f in arts for b in (1, 28)}
        peaks = {}
        for _ in range(ROUNDS):
            for (flag, batch), got in times.items():
                d = json.loads(run_timed("measure", str(arts[flag]), "--batch", str(batch),
                                         "--accumulate", str(1568 // batch), "--steps",
                                         str(STEPS), "--no-select", "--json"))
                got.append(d["step_time_s"])
                peaks[(flag, batch)] = (d["peak_bytes"], d["predicted_peak_bytes"])
                print(flag, batch, round(got[-1], 2), flush=True)
    return [{"kind": "step", "export": f, "micro_batch": b, "step_times_s": v,
             "median_s": statistics.median(v), "peak_bytes": peaks[(f, b)][0],
             "predicted_peak_bytes": peaks[(f, b)][1]} for (f, b), v in times.items()]


def report(rows: list[dict]) -> None:
    lines = ["| depthwise layer (C6, width 1.0) | patches | ORT's Conv | NCHWc (with reorders) "
             "| speed-up | largest difference |", "|---|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['channels']}x{r['side']}x{r['side']}, stride {r['stride']} | {r['batch']} "
              f"| {r['ort_conv_s'] * 1e3:.3f} ms | {r['nchwc_s'] * 1e3:.3f} ms | "
              f"{r['ort_conv_s'] / r['nchwc_s']:.1f}× | {r['max_abs_diff']:.1e} |"
              for r in rows if r["kind"] == "layer"]
    replace_table(DOC, lines, "nchwc-layers", sources=["nchwc"])
    steps = {(r["export"], r["micro_batch"]): r for r in rows if r["kind"] == "step"}
    lines = ["| C6 step (1,568 patches) | `--no-nchwc` | `--nchwc` | speed-up | peak measured "
             "(`--nchwc`) | predicted |", "|---|---:|---:|---:|---:|---:|"]
    for b in (1, 28):
        old, new = steps[("--no-nchwc", b)], steps[("--nchwc", b)]
        lines.append(f"| micro-batch {b} | {old['median_s']:.2f} s | {new['median_s']:.2f} s | "
                     f"{old['median_s'] / new['median_s']:.2f}× | {new['peak_bytes']:,} B | "
                     f"{new['predicted_peak_bytes']:,} B |")
    replace_table(DOC, lines, "nchwc-step", sources=["nchwc"])
    print("\n".join(lines))


if __name__ == "__main__":
    measure_or_report("nchwc", lambda: layer_rows() + step_rows(), report,
                      __doc__.splitlines()[0])
