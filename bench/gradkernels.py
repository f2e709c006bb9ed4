"""The gradient rewrites of exporters/passes/relugrad.py and depthwisegrad.py, node by node:
ORT's own gradient kernel against the rewrite, on the tensor shapes of MobileNetV1 at 224 x 224 (C5's network).

    .venv/bin/python bench/gradkernels.py      # ~1 min on 2 cores

Each case is a one-node graph (ReluGrad, or a depthwise ConvGrad) run in an InferenceSession
with 2 intra-op threads, then the same graph after the rewrite; the median of 60 runs after 5
warm-ups, and the largest difference between the two outputs. The depthwise rewrite is asked
at micro-batch 1 and 2 threads with C5's predicted peak (an untrained export of C5's
configuration), as C5 exports it: it skips only layers its rule finds too small. The pointwise
split (exporters/passes/pointwisegrad.py) is timed on C6's pointwise layers at its watchos-extension
micro-batch (7 patches of 32 x 32), with dX image by image and as one product
(ONE_PRODUCT_MAX_PIXELS set for the case), against ORT's ConvGrad; and C6's stride-1 depthwise
weight gradients at that micro-batch, ORT's ConvGrad (weight only) against the stacked NCHWc
Conv of exporters/passes/stackedgrad.py (where this CPU has NCHWc kernels). Results:
bench/results/gradkernels.json; table in docs/results.md (marker `gradkernels`).
"""
from __future__ import annotations


import numpy as np
from onnx import TensorProto, helper

from common import ROOT, measure_or_report, replace_table, run
from nodetimer import time_model
from exporters.passes import pointwisegrad
from exporters.passes.depthwisegrad import rewrite_depthwise_conv_grads
from exporters.passes.relugrad import rewrite_relu_grads
from exporters.passes.nchwc import CHANNEL_MULTIPLE, host_block
from exporters.passes.stackedgrad import rewrite_stacked_weight_grads

DOC = ROOT / "docs" / "results.md"
THREADS, RUNS, WARMUP = 2, 60, 5
# MobileNetV1's depthwise layers at 224 x 224: (channels, input side, stride)
DEPTHWISE = [(32, 112, 1), (64, 112, 2), (128, 56, 1), (128, 56, 2), (256, 28, 1),
             (512, 14, 1), (1024, 7, 1)]
RELU = [(32, 112), (64, 112), (128, 56), (512, 14)]
# C6's masked pointwise layers at micro-batch 7: (C_out, C_in, side)
POINTWISE_BATCH = 7
POINTWISE = [(1024, 1024, 4), (1024, 512, 4), (256, 256, 8), (128, 128, 16)]
# C6's stride-1 depthwise layers at micro-batch 7: (channels, side)
STACKED = [(1024, 4), (512, 4), (256, 8), (128, 16), (32, 32)]


def _model(nodes, inputs: dict, outputs: dict):
    def vi(name, shape):
        return helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape))
    graph = helper.make_graph(nodes, "g", [vi(k, v) for k, v in inputs.items()],
                              [vi(k, v) for k, v in outputs.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                   helper.make_opsetid("com.microsoft", 1)])


def _time(model, feed: dict) -> tuple[float, list]:
    return time_model(model, feed, THREADS, RUNS, WARMUP)


def _case(label: str, make, rewrite, feed: dict) -> dict:
    before_s, before = _time(make(), feed)
    m = make()
    replaced = rewrite(m)
    after_s, after = _time(m, feed)
    row = {"case": label, "ort_s": before_s, "rewritten_s": after_s, "replaced": replaced,
           "max_abs_diff": max(float(np.abs(a - b).max()) for a, b in zip(before, after))}
    print(row, flush=True)
    return row


def _pointwise(x, y, c_out: int, c_in: int):
    """ConvGrad of a 1 x 1 convolution whose weight the graph computes (W = Wp * 1), as a
    masked layer's dense weight is rebuilt on each call."""
    m = _model([helper.make_node("Mul", ["wp", "one"], ["w"]),
                helper.make_node("ConvGrad", ["dy", "x", "w"], ["dx", "dw"], domain="com.microsoft",
                                 group=1, kernel_shape=[1, 1], pads=[0, 0, 0, 0],
                                 strides=[1, 1], dilations=[1, 1])],
               {"dy": y, "x": x, "wp": (c_out, c_in, 1, 1)}, {"dx": x, "dw": (c_out, c_in, 1, 1)})
    m.graph.initializer.append(helper.make_tensor("one", TensorProto.FLOAT, [1], [1.0]))
    m.graph.value_info.append(helper.make_tensor_value_info("w", TensorProto.FLOAT,
                                                            [c_out, c_in, 1, 1]))
    return m


def _split(model, most_pixels: int) -> int:
    """rewrite_pointwise_grads with dX as one product up to `most_pixels` pixels an image."""
    kept = pointwisegrad.ONE_PRODUCT_MAX_PIXELS
    pointwisegrad.ONE_PRODUCT_MAX_PIXELS = most_pixels
    try:
        return pointwisegrad.rewrite_pointwise_grads(model)
    finally:
        pointwisegrad.ONE_PRODUCT_MAX_PIXELS = kept


def c5_predicted_peak_bytes() -> int:
    """The predicted peak of C5's configuration (MobileNetV1 at width 1, 10% of its weights
    kept, recompute sqrt, micro-batch 1), exported untrained."""
    import json
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        out = json.loads(run("export", "--model", "mobilenet_v1", "--width", "1.0", "--epochs",
                             "0", "--density", "0.1", "--recompute", "sqrt", "--micro-batch",
                             "1", "--out", f"{tmp}/c5", "--json"))
    return out["predicted"]["peak_bytes"]


def measure() -> list[dict]:
    rng = np.random.default_rng(0)
    rows = []
    peak = c5_predicted_peak_bytes()
    for c, side in RELU:
        shape = (1, c, side, side)
        feed = {"dy": rng.standard_normal(shape, np.float32),
                "x": rng.standard_normal(shape, np.float32)}
        rows.append(_case(f"ReluGrad {c}x{side}x{side}", lambda shape=shape: _model(
            [helper.make_node("Relu", ["x"], ["y"]),
             helper.make_node("ReluGrad", ["dy", "y"], ["dx"], domain="com.microsoft")],
            {"dy": shape, "x": shape}, {"dx": shape}), rewrite_relu_grads, feed))
    for c, side, stride in DEPTHWISE:
        x, y, w = (1, c, side, side), (1, c, side // stride, side // stride), (c, 1, 3, 3)
        feed = {"dy": rng.standard_normal(y, np.float32), "x": rng.standard_normal(x, np.float32),
                "w": rng.standard_normal(w, np.float32)}
        rows.append(_case(f"depthwise ConvGrad {c}x{side}x{side}, stride {stride}",
                          lambda x=x, y=y, w=w, stride=stride: _model(
                              [helper.make_node("ConvGrad", ["dy", "x", "w"], ["dx", "dw"],
                                                domain="com.microsoft", group=w[0],
                                                kernel_shape=[3, 3], pads=[1, 1, 1, 1],
                                                strides=[stride, stride], dilations=[1, 1])],
                              {"dy": y, "x": x, "w": w}, {"dx": x, "dw": w}),
                          lambda m: rewrite_depthwise_conv_grads(m, 1, THREADS, peak), feed))
    for c_out, c_in, side in POINTWISE:
        x, y = (POINTWISE_BATCH, c_in, side, side), (POINTWISE_BATCH, c_out, side, side)
        feed = {"dy": rng.standard_normal(y, np.float32), "x": rng.standard_normal(x, np.float32),
                "wp": rng.standard_normal((c_out, c_in, 1, 1), np.float32)}
        for how, most in (("image by image", 0), ("one product", side * side)):
            rows.append(_case(f"pointwise ConvGrad {c_out}x{c_in}, {POINTWISE_BATCH}x{side}x{side}"
                              f", dX {how}", lambda x=x, y=y, c_out=c_out, c_in=c_in: _pointwise(
                                  x, y, c_out, c_in), lambda m, most=most: _split(m, most), feed))
    for c, side in STACKED if host_block() > 1 else []:
        x, w = (POINTWISE_BATCH, c, side, side), (c, 1, 3, 3)
        feed = {"dy": rng.standard_normal(x, np.float32), "x": rng.standard_normal(x, np.float32),
                "w": rng.standard_normal(w, np.float32)}
        rows.append(_case(f"depthwise weight gradient {c}x{side}x{side}, {POINTWISE_BATCH} "
                          "patches, stacked", lambda x=x, w=w: _model(
                              [helper.make_node("ConvGrad", ["dy", "x", "w"], ["", "dw"],
                                                domain="com.microsoft", group=w[0],
                                                kernel_shape=[3, 3], pads=[1, 1, 1, 1],
                                                strides=[1, 1], dilations=[1, 1])],
                              {"dy": x, "x": x, "w": w}, {"dw": w}),
                          lambda m: rewrite_stacked_weight_grads(m, host_block(),
                                                                 CHANNEL_MULTIPLE), feed))
    return rows


def report(rows: list[dict]) -> None:
    lines = ["| node (MobileNetV1 at 224; C6's pointwise layers) | ORT's kernel | rewritten | speed-up | largest "
             "difference |", "|---|---:|---:|---:|---:|"]
    for r in rows:
        if r["replaced"]:
            lines.append(f"| {r['case']} | {r['ort_s'] * 1e3:.2f} ms | "
                         f"{r['rewritten_s'] * 1e3:.2f} ms | {r['ort_s'] / r['rewritten_s']:.1f}× "
                         f"| {r['max_abs_diff']:.1e} |")
        else:
            lines.append(f"| {r['case']} | {r['ort_s'] * 1e3:.2f} ms | not rewritten | | |")
    replace_table(DOC, lines, "gradkernels", sources=["gradkernels"])


if __name__ == "__main__":
    measure_or_report("gradkernels", measure, report, __doc__.splitlines()[0])
