"""The `host` profile: this machine's speed, measured with ONNX Runtime (not assumed), so the
latency model can be checked against step times measured here and plans can be ranked by it.

Each figure is the median of repeated runs at the runtime's thread count, graphs unoptimised
so every node runs as written:
  * compute_flops_per_s: a dense 3x3 convolution, 64 channels at 56x56 (what convolutions
    and linear layers get from MLAS at a good size);
  * depthwise_flops_per_s: a depthwise 3x3 convolution, 32 channels at 32x32 (ORT 1.19's
    grouped convolution on CPU is far slower per FLOP: MobileNets spend their time there);
  * memory_bandwidth_bytes_per_s: an elementwise Add over 8 Mi floats (32 MiB read twice,
    written once), far larger than the caches;
  * compute_node_overhead_s: what one more small convolution costs beyond its FLOPs (a
    chain of 1x1 convolutions on 16x16x16): ORT's dispatch and its thread pool's fork/join;
  * node_overhead_s: what one more tiny elementwise node costs (a chain of Adds on 16
    floats, less a chain of one);
  * call_overhead_s: one `run` of a one-node graph on 16 floats.
Measured once per thread count and cached as JSON under .cache/ (keyed by the CPU model, ORT
version and SCHEMA); `refresh=True` measures again.
"""
from __future__ import annotations

import json
import os
import platform
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

CACHE = Path(".cache/host-profile")
SCHEMA = 2  # bump when what is measured changes: older cached figures are measured again
STREAM_FLOATS = 8 << 20
CHAIN_NODES = 200


@dataclass(frozen=True)
class HostSpeed:
    threads: int
    compute_flops_per_s: float
    depthwise_flops_per_s: float
    memory_bandwidth_bytes_per_s: float
    compute_node_overhead_s: float
    node_overhead_s: float
    call_overhead_s: float
    cpu: str
    onnxruntime: str

    def to_dict(self) -> dict:
        return asdict(self)


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _session(graph, threads: int):
    import onnx
    import onnxruntime as ort

    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)])
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # keep nodes
    return ort.InferenceSession(model.SerializeToString(), opts,
                                providers=["CPUExecutionProvider"])


def _median_s(run, repeats: int) -> float:
    run()  # warm up: first-run allocations and thread start
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _chain(n_nodes: int, numel: int):
    from onnx import TensorProto, helper

    nodes = [helper.make_node("Add", ["x" if i == 0 else f"t{i}", "x"], [f"t{i + 1}"])
             for i in range(n_nodes)]
    return helper.make_graph(nodes, f"chain{n_nodes}",
                             [helper.make_tensor_value_info("x", TensorProto.FLOAT, [numel])],
                             [helper.make_tensor_value_info(f"t{n_nodes}", TensorProto.FLOAT,
                                                            [numel])])


def _conv_chain(n_nodes: int, channels: int, side: int, kernel: int, group: int = 1):
    from onnx import TensorProto, helper, numpy_helper

    w = np.random.default_rng(0).standard_normal(
        (channels, channels // group, kernel, kernel), dtype=np.float32) * 0.01
    nodes = [helper.make_node("Conv", ["x" if i == 0 else f"t{i}", "w"], [f"t{i + 1}"],
                              pads=[kernel // 2] * 4, group=group) for i in range(n_nodes)]
    shape = [1, channels, side, side]
    graph = helper.make_graph(
        nodes, "convs", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info(f"t{n_nodes}", TensorProto.FLOAT, shape)],
        initializer=[numpy_helper.from_array(w, "w")])
    flops = 2 * channels * (channels // group) * kernel * kernel * side * side
    return graph, np.ones(shape, np.float32), flops


def _per_node_s(threads: int, make, n_nodes: int, repeats: int) -> tuple[float, float, int]:
    """(time of a chain of one, time per further node, FLOPs of one node)."""
    g1, x, flops = make(1)
    gn, _, _ = make(n_nodes)
    one, many = _session(g1, threads), _session(gn, threads)
    t1 = _median_s(lambda: one.run(None, {"x": x}), repeats)
    tn = _median_s(lambda: many.run(None, {"x": x}), max(5, repeats // 4))
    return t1, max(0.0, (tn - t1) / (n_nodes - 1)), flops


def measure_host(threads: int) -> HostSpeed:
    import onnxruntime as ort

    _, dense_s, dense_flops = _per_node_s(threads, lambda k: _conv_chain(k, 64, 56, 3), 5, 9)
    _, dw_s, dw_flops = _per_node_s(threads, lambda k: _conv_chain(k, 32, 32, 3, 32), 20, 21)
    _, small_s, small_flops = _per_node_s(threads, lambda k: _conv_chain(k, 16, 16, 1), 50, 41)
    add = _session(_chain(1, STREAM_FLOATS), threads)
    big = np.ones(STREAM_FLOATS, np.float32)
    stream = 3 * 4 * STREAM_FLOATS / _median_s(lambda: add.run(None, {"x": big}), 7)
    call, tiny_s, _ = _per_node_s(
        threads, lambda k: (_chain(k, 16), np.ones(16, np.float32), 0), CHAIN_NODES, 201)
    flops = dense_flops / dense_s
    return HostSpeed(threads, flops, dw_flops / dw_s, stream,
                     max(0.0, small_s - small_flops / flops), tiny_s, call, _cpu_model(),
                     ort.__version__)


def host_speed(threads: int, refresh: bool = False, cache: Path = CACHE) -> HostSpeed:
    """This machine's measured speed at `threads` (cached per CPU model and ORT version)."""
    import onnxruntime as ort

    key = f"{_cpu_model()}|{ort.__version__}|{threads}|v{SCHEMA}"
    stable = cache / ("".join(c if c.isalnum() else "_" for c in key)[:150] + ".json")
    if not refresh and stable.is_file():
        d = json.loads(stable.read_text())
        if d.get("key") == key:
            return HostSpeed(**d["speed"])
    speed = measure_host(threads)
    stable.parent.mkdir(parents=True, exist_ok=True)
    tmp = stable.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"key": key, "speed": speed.to_dict()}, indent=2))
    os.replace(tmp, stable)
    return speed
