"""Pass `dense_builds` (training graph; `dense_build` unpool): sparse layers' dense weights built
by one MaxUnpool instead of Expand + ScatterElements.

A masked layer stores its kept values and their positions (exporters/plans/sparse.py); the graph
rebuilds the dense weight on every call, and again wherever a recompute plan copies it:

  ScatterElements(Expand(0, [N]), positions, values)  -> [N], then Reshape to the weight

ONNX Runtime 1.19.2 runs that as two buffers of N floats: Expand writes the zeros, and
ScatterElements (no in-place reuse: the training session runs without it, see
edgetrain/sessions.py) copies them into its own output before scattering. For C6's
1024 x 1024 pointwise layer that is 8 MB live at once where the weight is 4 MB, and three
passes over 4 MB. MaxUnpool (ONNX opset 11) writes exactly this in one op into one fresh
buffer: zeros, then X[i] at the flat output index I[i]. Its kernel_shape is chosen so that
the output length it infers is N ((nnz - 1) * 1 + kernel = N): ORT then knows the buffer's
size when it loads the graph and places it in its memory pattern (with output_shape given
instead, ORT's graph has no dims for it). MaxUnpool takes int64 indices, so int32 positions
get a Cast (8 bytes per kept weight, alive only while the weight is built).

  ScatterElements(Expand(0, [N]), P, V)
    -> Reshape(MaxUnpool(Reshape(V, [1,1,-1]), Reshape(Cast<int64>(P), [1,1,-1]),
                         kernel_shape=[N - nnz + 1]), [N])

Only a scatter into zeros is rewritten (the Expand's value is a Mul by a constant 0 or a
constant 0), along axis 0 of a 1-D tensor, without reduction. The recompute copies read
PassThrough copies of P and V, so ORT cannot merge them back into the forward build. The
backward (GatherElements of the dense weight's gradient at P) is untouched. Values are equal
to the scatter's bit for bit (tests/test_densebuild.py).
"""
from __future__ import annotations


import numpy as np
import onnx
from onnx import helper, numpy_helper

from exporters.graph import attributes, stated_elem_types
from exporters.passes.pipeline import Context, Graphs, Pass
from exporters.predictor.shapes import tensor_shapes

DENSE_BUILDS = ("unpool", "scatter")  # Plan.dense_build: this rewrite, or the export as is
SUFFIX = "_unpool"
ROW_SHAPE = "densebuild_row_shape"  # [1, 1, -1]: N and C of MaxUnpool's input, both 1


def _constant(model: onnx.ModelProto, producers: dict, name: str) -> np.ndarray | None:
    for t in model.graph.initializer:
        if t.name == name:
            return numpy_helper.to_array(t)
    n = producers.get(name)
    if n is not None and n.op_type == "Constant":
        a = attributes(n)
        if "value" in a:
            return numpy_helper.to_array(a["value"])
    return None


def _is_zero(model, producers: dict, name: str, depth: int = 0) -> bool:
    """Whether tensor `name` is 0 whatever the graph's inputs (a constant 0, or a Mul by one;
    sparse.dense_weight makes its zero as positions[:1] * 0 so it is not folded into a
    constant of N floats)."""
    c = _constant(model, producers, name)
    if c is not None:
        return c.size > 0 and not np.any(c)
    n = producers.get(name)
    if n is None or depth > 4:
        return False
    if n.op_type == "Mul":
        return any(_is_zero(model, producers, x, depth + 1) for x in n.input)
    if n.op_type in ("Cast", "Expand", "Reshape", "Identity"):
        return _is_zero(model, producers, n.input[0], depth + 1)
    return False


def _dense_build(model, producers: dict, node, shapes: dict) -> tuple[int, int] | None:
    """(N, nnz) if `node` scatters 1-D values into N zeros, else None."""
    if node.op_type != "ScatterElements" or node.domain not in ("", "ai.onnx"):
        return None
    a = attributes(node)
    if a.get("axis", 0) != 0 or a.get("reduction", b"none") not in (b"none", "none"):
        return None
    expand = producers.get(node.input[0])
    if expand is None or expand.op_type != "Expand" or not _is_zero(model, producers,
                                                                       expand.input[0]):
        return None
    n_shape = _constant(model, producers, expand.input[1])
    values = shapes.get(node.input[2])
    index = shapes.get(node.input[1])
    if n_shape is None or n_shape.size != 1 or values is None or index is None:
        return None
    if len(values) != 1 or list(index) != list(values) or not isinstance(values[0], int):
        return None
    n, nnz = int(n_shape.reshape(-1)[0]), int(values[0])
    return (n, nnz) if 0 < nnz <= n else None


def rewrite_dense_builds(model: onnx.ModelProto, shapes: dict) -> int:
    """Every dense-weight build of `model` (see the module's docstring) as a MaxUnpool, in
    place; the Expands (and their zero chains) no one else reads are dropped. shapes: name ->
    shape (ONNX's). Returns how many builds were rewritten."""
    producers = {o: n for n in model.graph.node for o in n.output if o}
    types = stated_elem_types(model)
    out, count, expands = [], 0, []
    for node in model.graph.node:
        found = _dense_build(model, producers, node, shapes)
        if found is None:
            out.append(node)
            continue
        n, nnz = found
        expands.append(producers[node.input[0]])
        base = (node.name or node.output[0]) + SUFFIX
        index = node.input[1]
        if types.get(index) != onnx.TensorProto.INT64:  # int32 positions (or unknown)
            out.append(helper.make_node("Cast", [index], [base + "/index64"], base + "/Cast",
                                        to=onnx.TensorProto.INT64))
            index = base + "/index64"
        out += [helper.make_node("Reshape", [node.input[2], ROW_SHAPE], [base + "/x"],
                                 base + "/ReshapeX"),
                helper.make_node("Reshape", [index, ROW_SHAPE], [base + "/i"],
                                 base + "/ReshapeI"),
                helper.make_node("MaxUnpool", [base + "/x", base + "/i"], [base + "/y"],
                                 base, kernel_shape=[n - nnz + 1]),
                helper.make_node("Reshape", [base + "/y", _flat_shape(model, n)],
                                 [node.output[0]], base + "/ReshapeY")]
        count += 1
    if not count:
        return 0
    if not any(t.name == ROW_SHAPE for t in model.graph.initializer):
        model.graph.initializer.append(numpy_helper.from_array(
            np.array([1, 1, -1], np.int64), ROW_SHAPE))
    kept = _without_dead(out, expands, producers, {o.name for o in model.graph.output})
    gone = {o for n in out for o in n.output} - {o for n in kept for o in n.output}
    del model.graph.node[:]
    model.graph.node.extend(kept)
    for v in [v for v in model.graph.value_info if v.name in gone]:
        model.graph.value_info.remove(v)
    return count


def _flat_shape(model: onnx.ModelProto, n: int) -> str:
    name = f"densebuild_flat_{n}"
    if not any(t.name == name for t in model.graph.initializer):
        model.graph.initializer.append(numpy_helper.from_array(np.array([n], np.int64), name))
    return name


def _without_dead(nodes: list, expands: list, producers: dict, outputs: set[str]) -> list:
    """`nodes` less the replaced Expands and the nodes of their zero chains that nobody else
    reads any more (no other node is touched)."""
    candidates, todo = set(), list(expands)
    while todo:
        n = todo.pop()
        if id(n) not in candidates:
            candidates.add(id(n))
            todo += [producers[x] for x in n.input if x in producers]
    while True:
        read = {x for n in nodes for x in n.input if x} | outputs
        keep = [n for n in nodes if id(n) not in candidates
                or any(o in read for o in n.output if o)]
        if len(keep) == len(nodes):
            return nodes
        nodes = keep


def dense_builds(graphs: Graphs, ctx: Context) -> int:
    """Write each masked weight's dense build (Expand zeros, ScatterElements the kept values)
    as one MaxUnpool."""
    shapes = {k: list(v[0]) for k, v in tensor_shapes(graphs.training, 1).items()}
    return rewrite_dense_builds(graphs.training, shapes)


PASS = Pass("dense_builds", "training", dense_builds, option="dense_build unpool",
            when=lambda ctx: ctx.plan.dense_build == "unpool")
