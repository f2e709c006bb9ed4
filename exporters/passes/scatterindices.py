"""Pass `int32_scatter_indices` (forward graph, before ORT's artifact builder): a masked
layer's dense weight is built by a scatter that reads the kept positions as they are stored,
in int32.

torch's scatter needs int64, so torch's export casts the stored int32 positions on every call
(8 bytes per kept weight, and again wherever a recompute plan rebuilds the dense weight);
ONNX's and ORT's CPU ScatterElements and GatherElements take int32 indices too, so the cast
is dropped. Runs on sparse artifacts (`--density` below 1) only.
"""
from __future__ import annotations

import onnx

from edgetrain import names
from exporters.graph import attributes
from exporters.passes.pipeline import Context, Graphs, Pass

INDEX_READERS = {"ScatterElements": 1, "GatherElements": 1}  # op -> its indices input


def int32_scatter_indices(model: onnx.ModelProto) -> int:
    """Let the scatter read the int32 positions as they are stored: drop each Cast to int64
    of a `<weight>_positions` graph input whose every reader takes it as the indices of a
    ScatterElements or GatherElements (ONNX and ORT's CPU kernels take int32 indices too).
    torch's scatter needs int64, so the export casts; the cast wrote 8 bytes per kept weight
    on every call, and again wherever a recompute plan rebuilds the dense weight. Returns
    how many casts were dropped; the values the scatter writes are the same."""
    int32 = {i.name for i in model.graph.input
             if i.name.endswith(names.MASK_POSITIONS_SUFFIX)
             and i.type.tensor_type.elem_type == onnx.TensorProto.INT32}
    int32 |= {t.name for t in model.graph.initializer
              if t.name.endswith(names.MASK_POSITIONS_SUFFIX)
              and t.data_type == onnx.TensorProto.INT32}
    readers: dict[str, list[tuple[onnx.NodeProto, int]]] = {}
    for n in model.graph.node:
        for k, x in enumerate(n.input):
            readers.setdefault(x, []).append((n, k))
    outputs = {o.name for o in model.graph.output}
    dropped = []
    for n in model.graph.node:
        if (n.op_type != "Cast" or attributes(n).get("to") != onnx.TensorProto.INT64
                or n.input[0] not in int32):
            continue
        uses = readers.get(n.output[0], [])
        if n.output[0] in outputs or not uses or any(
                INDEX_READERS.get(r.op_type) != k for r, k in uses):
            continue
        for r, k in uses:
            r.input[k] = n.input[0]
        dropped.append(n)
    gone = {n.output[0] for n in dropped}
    for n in dropped:
        model.graph.node.remove(n)
    for v in [v for v in model.graph.value_info if v.name in gone]:
        model.graph.value_info.remove(v)
    return len(dropped)


def scatter_int32_indices(graphs: Graphs, ctx: Context) -> int:
    """Drop the int64 casts of stored mask positions that only index a scatter or gather."""
    return int32_scatter_indices(graphs.forward)


PASS = Pass("int32_scatter_indices", "forward", scatter_int32_indices)
