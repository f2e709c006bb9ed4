"""Every tensor's shape at a concrete batch, from the graph alone (for the static predictor).

tensor_shapes: what ORT can size before running (ONNX shape inference at the batch, then the
gradient rules: `X_grad` takes X's shape, elementwise ops broadcast). runtime_shapes: every
tensor's size when the step runs, iterating the same rules to a fixpoint (for FLOP and byte
counts, not for the memory plan).
"""
from __future__ import annotations

import re

import numpy as np
import onnx
from onnx import numpy_helper, shape_inference

from edgetrain import names
from edgetrain.names import NCHWC_DOMAIN

# Ops whose outputs ONNX shape inference leaves unsized (gradient helpers included) and that
# we size by broadcasting their inputs.
COMPARE_OPS = {"Greater", "Less", "Equal", "GreaterOrEqual", "LessOrEqual"}  # bool outputs
SHAPE_FILL_OPS = {"Relu", "ReluGrad", "Add", "Sub", "Mul", "Div", "Scale", "Sum", "Sqrt",
                  "Reciprocal", "Neg", "Abs", "Exp", "Log", "Cast", "Sign",
                  "Ceil", "HardSigmoid"} | COMPARE_OPS
ITEMSIZE = {1: 4, 2: 1, 3: 1, 6: 4, 7: 8, 9: 1, 10: 2, 11: 8}  # float, uint8, int8, int32, int64,
# bool, fp16, double
# a type of that size, to declare a tensor's size; 8 bytes is int64 or double, so left to
# shape inference (0, undefined: a guess that differs from what it infers is an error)
ELEM_OF_ITEMSIZE = {4: 1, 8: 0, 1: 9, 2: 10}

Shapes = dict[str, tuple[tuple[int, ...], int]]  # name -> (shape, itemsize)


def nbytes(shape_itemsize: tuple[tuple[int, ...], int]) -> int:
    shape, itemsize = shape_itemsize
    return int(np.prod(shape, dtype=np.int64)) * itemsize


def initializer_bytes(init: onnx.TensorProto) -> int:
    return nbytes((tuple(init.dims), ITEMSIZE.get(init.data_type, 4)))


def tensor_shapes(model: onnx.ModelProto, batch: int, known: Shapes | None = None) -> Shapes:
    """name -> (shape, itemsize) for every tensor of the graph at `batch`. known: shapes
    found another way (evaluated.forward_shapes), declared before inference runs."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    if known:  # evaluated shapes replace symbolic declarations, keeping a declared type
        graph_io = {v.name for v in list(m.graph.input) + list(m.graph.output)}
        declared = {v.name: v.type.tensor_type.elem_type for v in m.graph.value_info}
        keep = [v for v in m.graph.value_info if v.name not in known]
        del m.graph.value_info[:]
        m.graph.value_info.extend(keep)
        for name, (shape, item) in known.items():
            if name not in graph_io:
                m.graph.value_info.append(onnx.helper.make_tensor_value_info(
                    name, declared.get(name) or ELEM_OF_ITEMSIZE.get(item, 1), list(shape)))
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
            item = known[v.name][1] if known and v.name in known else ITEMSIZE.get(t.elem_type, 4)
            out[v.name] = (tuple(dims), item)
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
                item = (1 if n.op_type in COMPARE_OPS else ITEMSIZE.get(_attr(n, "to"), 4)
                        if n.op_type == "Cast" else out[n.input[0]][1])
                out[o] = (tuple(np.broadcast_shapes(*shapes)), item)
            elif n.op_type == "Unsqueeze" and n.input[0] in out and n.input[1] in consts:
                shape = list(out[n.input[0]][0])
                for a in sorted(int(a) for a in consts[n.input[1]]):
                    shape.insert(a if a >= 0 else len(shape) + a + 1, 1)
                out[o] = (tuple(shape), out[n.input[0]][1])
            elif n.domain == NCHWC_DOMAIN and k == 0 and n.input[0] in out:
                shape = _nchwc_shape(n, out)
                if shape is not None:
                    out[o] = (shape, out[n.input[0]][1])
            elif n.op_type == "ConvGrad":
                base = [n.input[1], n.input[2], n.input[2]][k]
                if base in out:
                    out[o] = out[base] if k < 2 else ((out[base][0][0],), out[base][1])
            elif (n.op_type in ("BatchNormInternal", "BatchNormalization") and k > 0
                  and n.input[0] in out):
                out[o] = ((out[n.input[0]][0][1],), out[n.input[0]][1])  # per channel
            elif n.op_type == "ConcatTraining" and k == 1:
                out[o] = ((len([x for x in n.input if x]),), 8)  # each input's length
            elif (m_ := _PARTIAL_GRAD.fullmatch(o)) and m_.group(1) in out:
                out[o] = out[m_.group(1)]  # one of several gradient terms of a tensor
            elif n.op_type == "FusedMatMul" and k == 0 and all(x in out for x in n.input[:2]):
                shape = _fused_matmul(n, out[n.input[0]][0], out[n.input[1]][0])
                if shape is not None:
                    out[o] = (shape, out[n.input[0]][1])
            elif n.op_type == "BroadcastGradientArgs":  # reduced axes: at most one per dim
                ranks = [len(out[x][0]) for x in n.input if x in out]
                out[o] = ((max(ranks, default=8),), 8)
            elif n.op_type == "ReduceSumTraining" and n.input[0] in out:
                out[o] = out[n.input[0]]  # axes known only at run time: at most its input
            elif n.op_type == "Transpose" and n.input[0] in out:
                shape = out[n.input[0]][0]
                perm = _attr(n, "perm") or list(range(len(shape)))[::-1]
                out[o] = (tuple(shape[int(a)] for a in perm), out[n.input[0]][1])
            elif n.op_type == "Pad" and n.input[0] in out and n.input[1] in consts:
                shape, pads = out[n.input[0]][0], [int(p) for p in consts[n.input[1]]]
                if len(pads) == 2 * len(shape):  # every axis padded (no axes input)
                    out[o] = (tuple(d + pads[i] + pads[i + len(shape)]
                                    for i, d in enumerate(shape)), out[n.input[0]][1])
            elif (n.op_type == "Reshape" and n.input[0] in out and n.input[1] in consts):
                out[o] = (_reshaped(out[n.input[0]][0], consts[n.input[1]]), out[n.input[0]][1])
    return out


_PARTIAL_GRAD = re.compile(r"(.+)_grad_\d+")


def _nchwc_shape(node, out: Shapes) -> tuple[int, ...] | None:
    """The logical [N, C, H, W] output of ORT's NCHWc ops (exporters/passes/nchwc.py writes them for
    channel counts every block divides, so ReorderInput keeps its input's shape; ORT's own
    NCHWc transformer also converts the pools of a side graph)."""
    x = out[node.input[0]][0]
    if node.op_type == "ReorderInput":
        return x
    if node.op_type == "ReorderOutput":
        return (x[0], int(_attr(node, "channels", x[1]))) + tuple(x[2:])
    if node.op_type in ("GlobalAveragePool", "GlobalMaxPool"):
        return (x[0], x[1]) + (1,) * (len(x) - 2)
    if node.op_type in ("MaxPool", "AveragePool") and not _attr(node, "ceil_mode", 0):
        w = (x[1], x[1], *_attr(node, "kernel_shape", []))  # a pool keeps its channels
    elif node.op_type == "Conv" and node.input[1] in out:
        w = out[node.input[1]][0]
    else:
        return None
    kernel = _attr(node, "kernel_shape", list(w[2:]))
    rank = len(kernel)
    strides = _attr(node, "strides", [1] * rank)
    dilations = _attr(node, "dilations", [1] * rank)
    pads = _attr(node, "pads", [0] * 2 * rank)
    spatial = [(x[2 + i] + pads[i] + pads[i + rank] - dilations[i] * (kernel[i] - 1) - 1)
               // strides[i] + 1 for i in range(rank)]
    return (x[0], w[0], *spatial)


def _attr(node, name: str, default=None):
    return next((onnx.helper.get_attribute_value(a) for a in node.attribute if a.name == name),
                default)


def _fused_matmul(node, a, b) -> tuple[int, ...] | None:
    """ORT's FusedMatMul: MatMul of A and B, each optionally transposed in its last two axes
    (batched transposes, transBatchA/B, are not sized here)."""
    attrs = {x.name: x.i for x in node.attribute}
    if attrs.get("transBatchA") or attrs.get("transBatchB") or len(a) < 2 or len(b) < 2:
        return None
    a = a[:-2] + a[-2:][::-1] if attrs.get("transA") else a
    b = b[:-2] + b[-2:][::-1] if attrs.get("transB") else b
    batch = np.broadcast_shapes(a[:-2], b[:-2])
    return tuple(batch) + (a[-2], b[-1])


def _reshaped(shape: tuple[int, ...], target) -> tuple[int, ...]:
    """ONNX Reshape's output shape: 0 copies the input's dimension, -1 takes the rest."""
    dims = [shape[i] if int(d) == 0 and i < len(shape) else int(d) for i, d in enumerate(target)]
    if -1 in dims:
        known = int(np.prod([d for d in dims if d != -1], dtype=np.int64)) or 1
        dims[dims.index(-1)] = int(np.prod(shape, dtype=np.int64)) // known
    return tuple(dims)


def runtime_shapes(model: onnx.ModelProto, batch: int, rounds: int | None = None,
                   known: Shapes | None = None) -> Shapes:
    """Every tensor's size when the step runs (for FLOP and byte counts, not for the plan).

    Unlike tensor_shapes (what ORT can size before running), this iterates ONNX inference
    and the gradient rules to a fixpoint (at most `rounds` rounds; by default 8 more than
    the graph has PassThrough nodes, as each may hide the shapes after it from one round of
    ONNX inference), and knows ORT's BatchNormInternal."""
    if rounds is None:
        rounds = 8 + sum(n.op_type == "PassThrough" for n in model.graph.node)
    m = onnx.ModelProto()
    m.CopyFrom(model)
    # each tensor's element type, declared or as ONNX infers it (an int32 and a float share
    # an itemsize, so the sizes found below do not say which)
    typed = list(m.graph.value_info) + list(shape_inference.infer_shapes(m).graph.value_info)
    elem = {v.name: v.type.tensor_type.elem_type for v in typed if v.type.tensor_type.elem_type}
    elem.update((i.name, i.data_type) for i in m.graph.initializer)
    del m.graph.value_info[:]
    shapes: Shapes = {}
    for _ in range(rounds):
        found = tensor_shapes(m, batch, known)
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
                m.graph.value_info.append(onnx.helper.make_tensor_value_info(
                    name, elem.get(name) or ELEM_OF_ITEMSIZE.get(item, 1), shape))
    return shapes
