"""FLOPs and bytes of one training step, from the artifact's graphs, and a roofline latency.

Per node of the training graph at a batch: FLOPs (multiply-add = 2) and bytes moved (every
input and output read or written once). A device's predicted time for a node is the larger of
FLOPs / peak throughput and bytes / bandwidth; the step is their sum plus the AdamW update
(about 12 FLOPs and 7 reads or writes of 4 bytes per trained value). A roofline at peak
figures: a lower bound, labelled as a prediction.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx

from edgetrain import names
from exporters.graph import attributes, drop_identities, forward_conv_outputs, load_graph
from exporters.predictor.shapes import runtime_shapes

ADAMW_FLOPS_PER_VALUE = 12
ADAMW_BYTES_PER_VALUE = 7 * 4


@dataclass(frozen=True)
class StepCost:
    batch: int
    flops: int
    bytes_moved: int
    nodes: tuple[tuple[str, str, int, int], ...]  # (name, op, flops, bytes)

    def predicted_time_s(self, flops_per_s: float, bytes_per_s: float) -> float:
        return sum(max(f / flops_per_s, b / bytes_per_s) for _, _, f, b in self.nodes)


def _numel(shape) -> int:
    return int(np.prod(shape, dtype=np.int64))


def _conv_flops(x_shape, w_shape, y_shape, group: int) -> int:
    n, cout = y_shape[0], y_shape[1]
    return 2 * n * cout * _numel(y_shape[2:]) * (x_shape[1] // group) * _numel(w_shape[2:])


def _conv_grad_y(node, conv_out: dict, shapes) -> tuple | None:
    """The shape of the convolution output a ConvGrad differentiates: its forward node's, or
    dY's (a recompute plan may rebuild X or W under new names); None if X, W or it is unsized."""
    if node.input[1] not in shapes or node.input[2] not in shapes:
        return None
    for name in (conv_out.get((node.input[1], node.input[2])), node.input[0]):
        if name in shapes:
            return shapes[name][0]
    return None


# recurrent cells: (gates, the multiple of the forward's multiply-adds its node does)
_RECURRENT = {"GRU": (3, 1), "GRUTraining": (3, 1), "GRUGrad": (3, 2),
              "LSTM": (4, 1), "LSTMTraining": (4, 1), "LSTMGrad": (4, 2)}


def _recurrent_flops(op: str, x_shape, attrs: dict) -> int:
    """A GRU/LSTM over X [T, B, I]: per step and direction, every gate's input and recurrent
    matrix products (2 FLOPs a multiply-add); a gradient node does both products' gradients."""
    gates, times = _RECURRENT[op]
    t, b, i = (int(d) for d in x_shape[:3])
    h = int(attrs.get("hidden_size", 0))
    directions = 2 if attrs.get("direction") in ("bidirectional", b"bidirectional") else 1
    return times * 2 * directions * t * b * gates * h * (i + h)


def step_cost(training_model: str, batch: int, trained_values: int) -> StepCost:
    rows = node_costs(load_graph(training_model), batch)
    rows.append(("AdamW", "AdamWOptimizer", ADAMW_FLOPS_PER_VALUE * trained_values,
                 ADAMW_BYTES_PER_VALUE * trained_values))
    return StepCost(batch, sum(r[2] for r in rows), sum(r[3] for r in rows), tuple(rows))


def node_costs(model: onnx.ModelProto, batch: int) -> list[tuple[str, str, int, int]]:
    """(name, op, FLOPs, bytes) of every node of the graph as ORT runs it, at `batch`."""
    nodes, _ = drop_identities(model)
    shapes = runtime_shapes(model, batch)
    conv_out = forward_conv_outputs(nodes)
    rows = []
    for n in nodes:
        known = [shapes[x] for x in list(n.input) + list(n.output) if x in shapes]
        nbytes = sum(_numel(s) * item for s, item in known)
        attrs = attributes(n)
        group = int(attrs.get("group", 1))
        if n.op_type == "Conv" and n.output[0] in shapes:
            flops = _conv_flops(shapes[n.input[0]][0], shapes[n.input[1]][0],
                                shapes[n.output[0]][0], group)
        elif n.op_type == "ConvGrad" and _conv_grad_y(n, conv_out, shapes) is not None:
            # each gradient it produces (dX, dW) costs one convolution's multiply-adds
            y = _conv_grad_y(n, conv_out, shapes)
            produced = sum(1 for o in n.output[:2] if o)
            flops = produced * _conv_flops(shapes[n.input[1]][0], shapes[n.input[2]][0], y, group)
        elif n.op_type == "ConvTranspose" and all(t in shapes for t in (*n.input[:2],
                                                                       n.output[0])):
            # a frozen layer's dX (frozenconvgrad.py): its convolution's multiply-adds, with
            # dX as that convolution's input and dY as its output
            flops = _conv_flops(shapes[n.output[0]][0], shapes[n.input[1]][0],
                                shapes[n.input[0]][0], group)
        elif n.op_type in ("Gemm", "MatMul") and n.output[0] in shapes:
            if n.input[0] in shapes:  # the shared dimension, from whichever operand is sized
                a = shapes[n.input[0]][0]
                k = a[0] if attrs.get("transA") else a[-1]
            else:
                w = shapes[n.input[1]][0] if n.input[1] in shapes else (0, 0)
                k = w[1] if attrs.get("transB") else w[0]
            flops = 2 * _numel(shapes[n.output[0]][0]) * k
        elif n.op_type in _RECURRENT and n.input[0] in shapes:
            flops = _recurrent_flops(n.op_type, shapes[n.input[0]][0], attrs)
        else:  # elementwise, reductions, normalisation: about one FLOP per value touched
            flops = max((_numel(s) for s, _ in known), default=0)
        rows.append((n.name, n.op_type, int(flops), int(nbytes)))
    return rows


def recompute_flops(nodes) -> int:
    """FLOPs of the nodes a recompute plan copied into backward (counted, not predicted), from
    node_costs' rows (a StepCost's `nodes`)."""
    return sum(f for name, _, f, _ in nodes if names.is_recompute_name(name))
