"""The `host` profile: this machine's speed, measured with ONNX Runtime (not assumed), so the
latency model can be checked against step times measured here and plans can be ranked by it.

Four figures, each the median of repeated runs at the runtime's thread count:
  * compute_flops_per_s: a 512x512x512 fp32 MatMul (what convolutions and linear layers
    become inside MLAS);
  * memory_bandwidth_bytes_per_s: an elementwise Add over 8 Mi floats (32 MiB read twice,
    written once), far larger than the caches;
  * node_overhead_s: what one more tiny node costs (a chain of 200 Adds on 16 floats, less
    a chain of 1): ORT's per-kernel dispatch, which a roofline leaves out;
  * call_overhead_s: one `run` of a one-node graph on 16 floats: the fixed cost of a call.
Measured once per thread count and cached as JSON under .cache/ (keyed by the CPU model and
ORT version); `refresh=True` measures again.
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
MATMUL_N = 512
STREAM_FLOATS = 8 << 20
CHAIN_NODES = 200


@dataclass(frozen=True)
class HostSpeed:
    threads: int
    compute_flops_per_s: float
    memory_bandwidth_bytes_per_s: float
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


def measure_host(threads: int) -> HostSpeed:
    import onnxruntime as ort
    from onnx import TensorProto, helper

    f32 = TensorProto.FLOAT
    n = MATMUL_N
    mm = _session(helper.make_graph(
        [helper.make_node("MatMul", ["a", "b"], ["c"])], "mm",
        [helper.make_tensor_value_info(x, f32, [n, n]) for x in "ab"],
        [helper.make_tensor_value_info("c", f32, [n, n])]), threads)
    a = np.random.default_rng(0).standard_normal((n, n), dtype=np.float32)
    flops = 2 * n ** 3 / _median_s(lambda: mm.run(None, {"a": a, "b": a}), 9)
    add = _session(_chain(1, STREAM_FLOATS), threads)
    big = np.ones(STREAM_FLOATS, np.float32)
    stream = 3 * 4 * STREAM_FLOATS / _median_s(lambda: add.run(None, {"x": big}), 7)
    small = np.ones(16, np.float32)
    one, many = _session(_chain(1, 16), threads), _session(_chain(CHAIN_NODES, 16), threads)
    call = _median_s(lambda: one.run(None, {"x": small}), 201)
    chain = _median_s(lambda: many.run(None, {"x": small}), 51)
    per_node = max(0.0, (chain - call) / (CHAIN_NODES - 1))
    return HostSpeed(threads, flops, stream, per_node, call, _cpu_model(), ort.__version__)


def host_speed(threads: int, refresh: bool = False, cache: Path = CACHE) -> HostSpeed:
    """This machine's measured speed at `threads` (cached per CPU model and ORT version)."""
    import onnxruntime as ort

    key = f"{_cpu_model()}|{ort.__version__}|{threads}"
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
