"""The training graph as ONNX Runtime will run it, read off ONNX Runtime itself (host side).

The predictor simulates ORT's memory planner, so it must plan the graph ORT plans, with the
shapes ORT knows:
  * optimized_graph: the training Module optimises its graphs at load (level 3: constant
    folding, Transpose+MatMul -> FusedMatMul, ...). ORT writes that graph out when asked
    (`optimized_model_filepath`), its nodes in the order the session runs them (ORT writes
    a graph in its GraphViewer's topological order, the executor's: node for node the
    order of ORT's profiler on every graph checked, plan.py).
  * node_arg_shapes: every tensor's shape as ORT's graph holds it, a symbolic dimension by
    its name and an unknown one as None. ORT's planner reuses a buffer only for a tensor of
    the same symbolic shape, and lays out in its memory pattern only tensors whose every
    dimension is a number or a symbol of the graph inputs.
  * initializer_chunks_bytes: what a session reserves for its graph's initializers: each in
    its own 256-byte-rounded chunk of the optimised graph (matched the allocator's Reserve
    lines exactly on 13 layer families).
Neither runs the graph: ORT only loads it.
"""
from __future__ import annotations

import os
import tempfile
from functools import lru_cache

import onnx
from onnx import helper

from edgetrain.budget import arena_rounded
from edgetrain.sessions import DISABLED_OPTIMIZERS, DISABLED_OPTIMIZERS_KEY
from exporters.predictor.evaluated import onnxruntime_module
from exporters.predictor.shapes import initializer_bytes

OPTIMIZATION_LEVEL = 3  # ORT_ENABLE_ALL: the default the runtime's sessions use
_ITEMSIZE = {"tensor(float)": 4, "tensor(int64)": 8, "tensor(int32)": 4, "tensor(bool)": 1,
             "tensor(double)": 8, "tensor(float16)": 2, "tensor(uint8)": 1, "tensor(int8)": 1}

Dims = tuple  # ints and symbol names
SymbolicShapes = dict[str, tuple[Dims | None, int]]  # name -> (dims or None, itemsize)


def _stamp(path: str) -> tuple[str, int, int]:
    st = os.stat(path)
    return (os.path.abspath(path), st.st_mtime_ns, st.st_size)


def optimized_graph(path: str, level: int = OPTIMIZATION_LEVEL) -> onnx.ModelProto:
    """The graph at `path` as ORT's optimiser leaves it at `level` (0: as the runtime's
    inference check opens it, unoptimised), nodes in ORT's execution order."""
    out = onnx.ModelProto()
    out.ParseFromString(_optimized(_stamp(path), level))
    return out


@lru_cache(maxsize=32)
def _optimized(stamp: tuple[str, int, int], level: int) -> bytes:
    ort = onnxruntime_module()
    path = stamp[0]
    with tempfile.TemporaryDirectory() as tmp:
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel(level)
        so.optimized_model_filepath = os.path.join(tmp, "optimized.onnx")
        so.add_session_config_entry(DISABLED_OPTIMIZERS_KEY, ",".join(DISABLED_OPTIMIZERS))
        so.log_severity_level = 3
        ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
        with open(so.optimized_model_filepath, "rb") as f:
            return f.read()


def node_arg_shapes(model: onnx.ModelProto) -> SymbolicShapes:
    """name -> (dims as ORT's graph holds them, itemsize) for every tensor of the graph."""
    return dict(_node_arg_shapes(model.SerializeToString()))


@lru_cache(maxsize=32)
def _node_arg_shapes(data: bytes) -> tuple:
    ort = onnxruntime_module()
    m = onnx.ModelProto()
    m.ParseFromString(data)
    listed = {o.name for o in m.graph.output} | {i.name for i in m.graph.initializer}
    for n in m.graph.node:
        for o in n.output:
            if o and o not in listed:
                m.graph.output.append(helper.make_empty_tensor_value_info(o))
                listed.add(o)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 3
    sess = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    out = []
    for arg in list(sess.get_outputs()) + list(sess.get_inputs()):
        dims = None if arg.shape is None else tuple(
            d if isinstance(d, int) else (d or None) for d in arg.shape)
        out.append((arg.name, (dims, _ITEMSIZE.get(arg.type, 4))))
    return tuple(out)


def initializer_chunks_bytes(model: onnx.ModelProto) -> int:
    """Bytes a session reserves for this (optimised) graph's initializers."""
    return sum(arena_rounded(b) for i in model.graph.initializer
               if (b := initializer_bytes(i)))
