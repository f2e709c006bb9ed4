"""Pass `recurrent_grad_outputs` (training graph): name the weight-gradient outputs ORT's
GRUGrad/LSTMGrad kernels write whether or not the gradient builder asked for them.

A GRUGrad/LSTMGrad whose weight gradients are not wanted (the cell frozen, something below it
trained) kills the process (SIGSEGV) in onnxruntime-training 1.19.2: its dW and dR outputs
are named, and nothing reads them (tests/test_recurrent_freeze.py).
"""
from __future__ import annotations

import onnx
from exporters.passes.pipeline import Context, Graphs, Pass

RECURRENT_GRADS = {"GRUGrad", "LSTMGrad"}  # outputs: dX, dW, dR, dB, ...


def fix_recurrent_grads(m: onnx.ModelProto) -> int:
    """Name the missing dW and dR outputs (1 and 2) of each GRUGrad/LSTMGrad in the training
    graph: ORT 1.19.2's kernels write them unconditionally, and crash when the gradient builder
    left them out (a frozen GRU/LSTM layer above a trained one; measured for every frozen
    subset of one layer's W, R and biases). Nothing reads the named outputs; they live only
    while the node runs. Returns how many nodes were changed."""
    changed = 0
    for node in m.graph.node:
        if node.op_type in RECURRENT_GRADS:
            missing = [i for i in (1, 2) if len(node.output) <= i or not node.output[i]]
            while len(node.output) < 3:
                node.output.append("")
            for i in missing:
                node.output[i] = f"{node.name}_unused_output_{i}"
            changed += bool(missing)
    return changed


def name_recurrent_grads(graphs: Graphs, ctx: Context) -> int:
    """Name the dW and dR outputs of every GRUGrad/LSTMGrad that lacks them."""
    return fix_recurrent_grads(graphs.training)


PASS = Pass("recurrent_grad_outputs", "training", name_recurrent_grads)
