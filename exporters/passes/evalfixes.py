"""Passes on the eval graph ORT's artifact builder wrote (the graph the device exports its
inference model from):
  * `eval_batchnorm_outputs`: BatchNormalization keeps its training-only outputs there, which
    ORT then refuses to load; they are deleted;
  * `eval_graph_fixes`, once the training graph is final: scalar-shape declarations copied
    from it, and each sparse layer's dense weight tied to its layer's input (below).
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

from edgetrain import names
from exporters.passes.pipeline import Context, Graphs, Pass
from exporters.plans.quantize import INT8_SUFFIX


def fix_eval_batchnorm(m: onnx.ModelProto) -> int:
    """Delete BatchNormalization's training-only outputs (running mean and variance) from the
    eval graph `m`, in place; returns how many nodes had them."""
    changed = 0
    for node in m.graph.node:
        if node.op_type == "BatchNormalization" and len(node.output) > 1:
            del node.output[1:]
            changed += 1
    return changed


def fix_eval_graph(m: onnx.ModelProto, train: onnx.ModelProto) -> int:
    """The eval-graph fixes made once the training graph `train` is final, in place on `m`:
    how many declarations fix_eval_scalar_shapes corrected plus how many weights
    order_eval_weight_builds tied to their layer's input."""
    return fix_eval_scalar_shapes(m, train) + order_eval_weight_builds(m)


def fix_eval_scalar_shapes(m: onnx.ModelProto, train: onnx.ModelProto) -> int:
    """Give the eval graph's tensors declared without a shape the static shape the training
    graph declares. ORT's artifact builder declares a sparse layer's flat dense weight
    (Expand's zeros, the ScatterElements into them) with no shape in the eval graph; the inference
    model exported from it keeps that, so ORT cannot run the scatter in place there and holds
    the dense weight twice during the end-of-run inference check (measured: 4 MiB more on
    the full-width patch MobileNet). In place; returns how many declarations were corrected."""
    shaped = {v.name: v for v in train.graph.value_info
              if v.type.tensor_type.shape.dim and all(d.HasField("dim_value")
                                                      for d in v.type.tensor_type.shape.dim)}
    fixed = 0
    for v in m.graph.value_info:
        t = v.type.tensor_type
        if not t.shape.dim and v.name in shaped and (
                shaped[v.name].type.tensor_type.elem_type == t.elem_type):
            v.CopyFrom(shaped[v.name])
            fixed += 1
    return fixed


VIEW_OPS = ("Reshape", "Transpose", "Squeeze", "Unsqueeze", "Identity", "Flatten")


def order_eval_weight_builds(m: onnx.ModelProto) -> int:
    """Make each weight the eval graph builds from initializers alone wait for its layer's
    input: a sparse layer's dense weight (Expand zeros, scatter the kept values) and a frozen
    weight stored in 8 bits (DequantizeLinear, exporters/plans/quantize.py).

    ORT may build every such weight before the first layer runs and hold them all: the
    end-of-run inference check, which runs the model exported from this graph without a
    memory pattern, then grew ResNet-50's arena (C4) by 41.9 MB; tying the 8-bit weights
    cut the 8-bit patch MobileNet's measured peak at micro-batch 2 from 1,011,456 to
    983,040 bytes (imu_cnn's, set by its eval pass, did not move). A zero tied to the
    layer's input X, Cast(Shape(X)[0:1]) * 0 (a shape is always finite, so it is exactly 0),
    becomes the scalar the zeros are expanded from, or is added to the 8-bit weight's
    scales; the weight can then be built only once X exists, just before it is read. In place; returns how many weights were tied."""
    g = m.graph
    producer = {o: n for n in g.node for o in n.output if o}
    readers: dict[str, list] = {}
    for n in g.node:
        for k, x in enumerate(n.input):
            readers.setdefault(x, []).append((n, k))
    zero = "edgetrain_eval_zero"
    tied = 0
    for n in list(g.node):
        if n.op_type == "ScatterElements" and n.input[1].endswith(names.MASK_POSITIONS_SUFFIX):
            waits = producer.get(n.input[0])  # the Expand whose scalar becomes the tied zero
            if waits is None or waits.op_type != "Expand":
                continue
        elif n.op_type == "DequantizeLinear" and n.input[0].endswith(INT8_SUFFIX):
            waits = n  # its scales get the tied zero added
        else:
            continue
        t, chain = n.output[0], [n]
        while len(readers.get(t, [])) == 1 and readers[t][0][0].op_type in VIEW_OPS:
            chain.append(readers[t][0][0])
            t = chain[-1].output[0]
        if len(readers.get(t, [])) != 1:
            continue
        layer, k = readers[t][0]
        data = layer.input[1 if k == 0 else 0] if len(layer.input) > 1 else ""
        if not data or data == t:
            continue
        base = f"{waits.output[0]}_after_input"
        if not tied:
            g.initializer.append(numpy_helper.from_array(
                np.zeros((), np.float32), zero))
        new = [onnx.helper.make_node("Shape", [data], [f"{base}_shape"], start=0, end=1,
                                     name=f"{base}/shape"),
               onnx.helper.make_node("Cast", [f"{base}_shape"], [f"{base}_float"],
                                     to=onnx.TensorProto.FLOAT, name=f"{base}/cast"),
               onnx.helper.make_node("Mul", [f"{base}_float", zero], [base], name=f"{base}/zero")]
        if waits is n:  # the rebuild moves next to its layer, after X's producer
            new.append(onnx.helper.make_node("Add", [n.input[1], base], [f"{base}_scale"],
                                             name=f"{base}/scale"))
            n.input[1] = f"{base}_scale"
            for node in chain:
                g.node.remove(node)
            at = list(g.node).index(layer)
            new += chain
        else:
            waits.input[0] = base
            at = list(g.node).index(waits)
        for j, node in enumerate(new):
            g.node.insert(at + j, node)
        tied += 1
    return tied


def drop_batchnorm_outputs(graphs: Graphs, ctx: Context) -> int:
    """Delete BatchNormalization's training-only outputs from the eval graph."""
    return fix_eval_batchnorm(graphs.eval)


def fix_eval_for_training(graphs: Graphs, ctx: Context) -> int:
    """Copy the final training graph's scalar-shape declarations into the eval graph and tie
    each sparse layer's dense weight to its layer's input."""
    return fix_eval_graph(graphs.eval, graphs.training)


BATCHNORM_OUTPUTS = Pass("eval_batchnorm_outputs", "eval", drop_batchnorm_outputs)
FIXES = Pass("eval_graph_fixes", "eval", fix_eval_for_training)
