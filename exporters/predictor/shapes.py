"""Every tensor's shape at a concrete batch, from the graph alone (for the static predictor).

tensor_shapes: what ORT can size before running (ONNX shape inference at the batch, then the
gradient rules: `X_grad` takes X's shape, elementwise ops broadcast). runtime_shapes: every
tensor's size when the step runs, iterating the same rules to a fixpoint (for FLOP and byte
counts, not for the memory plan).
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper, shape_inference

from edgetrain import names

# Ops whose outputs ONNX shape inference leaves unsized (gradient helpers included) and that
# we size by broadcasting their inputs.
SHAPE_FILL_OPS = {"Relu", "ReluGrad", "Add", "Sub", "Mul", "Div", "Scale", "Sum", "Sqrt",
                  "Reciprocal", "Neg", "Abs", "Exp", "Log", "Cast"}
ITEMSIZE = {1: 4, 6: 4, 7: 8, 9: 1, 10: 2, 11: 8}  # float, int32, int64, bool, fp16, double

Shapes = dict[str, tuple[tuple[int, ...], int]]  # name -> (shape, itemsize)


def nbytes(shape_itemsize: tuple[tuple[int, ...], int]) -> int:
    shape, itemsize = shape_itemsize
    return int(np.prod(shape, dtype=np.int64)) * itemsize


def initializer_bytes(init: onnx.TensorProto) -> int:
    return nbytes((tuple(init.dims), ITEMSIZE.get(init.data_type, 4)))


def tensor_shapes(model: onnx.ModelProto, batch: int) -> Shapes:
    """name -> (shape, itemsize) for every tensor of the graph at `batch`."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    batch_params = set()
    for v in m.graph.input:
        dims = v.type.tensor_type.shape.dim
        if dims and dims[0].dim_param:
            batch_params.add(dims[0].dim_param)
            dims[0].dim_value = batch
    for v in m.graph.value_info:  # declared tensors (recompute copies) share the batch symbol
        for d in v.type.tensor_type.shape.dim:
            if d.dim_param in batch_params:
                d.dim_value = batch
    m = shape_inference.infer_shapes(m, strict_mode=False, data_prop=True)
    out: Shapes = {}
    for v in list(m.graph.input) + list(m.graph.value_info) + list(m.graph.output):
        t = v.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim]
        if t.HasField("shape") and None not in dims:
            out[v.name] = (tuple(dims), ITEMSIZE.get(t.elem_type, 4))
    consts = {}
    for init in m.graph.initializer:
        out[init.name] = (tuple(init.dims), ITEMSIZE.get(init.data_type, 4))
        if init.data_type == 7 and len(init.dims) <= 1:
            consts[init.name] = numpy_helper.to_array(init)
    for n in m.graph.node:  # fill what ONNX shape inference does not know (gradient ops)
        for k, o in enumerate(n.output):
            if not o or o in out:
                continue
            if n.op_type == "PassThrough" and k < len(n.input) and n.input[k] in out:
                out[o] = out[n.input[k]]  # output k is input k (recompute's ordering alias)
            elif names.is_grad_name(o) and names.grad_of(o) in out:
                out[o] = out[names.grad_of(o)]
            elif n.op_type in SHAPE_FILL_OPS and all(x in out for x in n.input if x):
                shapes = [out[x][0] for x in n.input if x]
                out[o] = (tuple(np.broadcast_shapes(*shapes)), out[n.input[0]][1])
            elif n.op_type == "Unsqueeze" and n.input[0] in out and n.input[1] in consts:
                shape = list(out[n.input[0]][0])
                for a in sorted(int(a) for a in consts[n.input[1]]):
                    shape.insert(a if a >= 0 else len(shape) + a + 1, 1)
                out[o] = (tuple(shape), out[n.input[0]][1])
            elif n.op_type == "ConvGrad":
                base = [n.input[1], n.input[2], n.input[2]][k]
                if base in out:
                    out[o] = out[base] if k < 2 else ((out[base][0][0],), out[base][1])
    return out


def runtime_shapes(model: onnx.ModelProto, batch: int, rounds: int = 8) -> Shapes:
    """Every tensor's size when the step runs (for FLOP and byte counts, not for the plan).

    Unlike tensor_shapes (what ORT can size before running), this iterates ONNX inference
    and the gradient rules to a fixpoint, and knows ORT's BatchNormInternal."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    del m.graph.value_info[:]
    shapes: Shapes = {}
    for _ in range(rounds):
        found = tensor_shapes(m, batch)
        for n in m.graph.node:
            ins = [found.get(x) for x in n.input]
            for k, o in enumerate(n.output):
                if not o or o in found:
                    continue
                if n.op_type == "BatchNormInternal" and ins and ins[0] is not None:
                    c = (ins[0][0][1],)
                    found[o] = ins[0] if k == 0 else (c, ins[0][1])
                elif n.op_type in SHAPE_FILL_OPS and all(s is not None for s in ins if s):
                    sized = [s for s in ins if s]
                    if sized and len(sized) == len([x for x in n.input if x]):
                        found[o] = (tuple(np.broadcast_shapes(*[s[0] for s in sized])),
                                    sized[0][1])
        if len(found) == len(shapes):
            break
        shapes = found
        graph_io = {v.name for v in list(m.graph.input) + list(m.graph.output)}
        del m.graph.value_info[:]  # symbolic entries would block refinement
        for name, (shape, item) in found.items():
            if name not in graph_io:
                elem = {4: 1, 8: 7, 1: 9, 2: 10}.get(item, 1)
                m.graph.value_info.append(onnx.helper.make_tensor_value_info(name, elem, shape))
    return shapes
