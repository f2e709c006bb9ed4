"""Pass `int8_saved_activations` (training graph): the activations a training step saves for
its backward pass held in 8 bits (`export --saved-activations int8`, plan.saved_activations).

Between a layer's forward and its backward the step keeps the float tensors the gradients
read: a convolution's input (for its weight gradient), a ReLU's output (for its mask), a
norm's input. At a micro-batch of 8 they are about half of imu_cnn's activation bytes. For each
such tensor T (made in forward, read in backward, an activation map of rank 3 or more):

  forward:   after T's last forward reader R has run (Y its output):
             (T_r, _) = PassThrough(T, Y); (T_q, scale, zero_point) = DynamicQuantizeLinear(T_r)
             (Y', _) = PassThrough(Y, T_q); Y's forward readers read Y'
  backward:  (T_q'', _) = PassThrough(T_q, G); T_dq = DequantizeLinear(T_q'', scale, zp)
             T's backward readers read T_dq (Shape and Size read T_q: same shape)

G is the gradient of the output of one of T's forward readers: the first moment the backward
pass can need T. The PassThroughs (ORT's zero-copy node: its outputs alias its inputs) pin
ORT's execution order (reverse depth-first from the leaves): the quantisation runs after R
and before anything reads Y, so T is freed as soon as R is done with it, and the float copy
is not rebuilt before backward reaches T (it lives only while T's backward readers run).
Quantising right after T is made instead (T's forward readers reading T through a
PassThrough) left the 8-bit copies scattered through ORT's memory pattern: imu_cnn measured
1,307,904 and 3,765,248 activation bytes at micro-batches 8 and 32 against 1,276,928 and
3,273,472 this way (1,469,440 and 4,788,992 in float).

What stays: the backward pass of the widest layer holds its input rebuilt in float, its
output's gradient, its input's gradient and its weight gradient at once, and that is
imu_cnn's peak at micro-batch 8; the saved tensors are a larger share at larger batches.

ONNX's DynamicQuantizeLinear is asymmetric over [min(0, min T), max(0, max T)]: a ReLU output
(min 0) keeps zero exactly, so its mask (exporters/passes/relugrad.py) differs only where
0 < y < scale/2. The gradients are those of the network whose saved tensors are rounded so
(tests/test_int8_saved.py checks them against torch doing the same rounding); the forward
pass, the loss and every input gradient's own arithmetic are unchanged.

Only activations are rounded: tensors with the batch axis first (a weight rebuilt in the graph,
such as a folded BatchNorm's convolution weight, is not). Tensors read only in backward
(nothing to free early), graph inputs (the caller holds them), rank-2 tensors (a head's
[B, C] input, the loss's log-probabilities: small, and the loss gradient is not to be
rounded), tensors read by the last layer and tensors whose readers' output gradients the
graph does not name stay float. Not with a recompute plan (it rebuilds the tensors this
would round).
"""
from __future__ import annotations

import onnx
from onnx import TensorProto, helper

from edgetrain import names
from exporters.graph import declare_like, ensure_ms_domain, is_backward, producers, stated_shapes
from exporters.passes.pipeline import Context, Graphs, Pass

SHAPE_READERS = ("Shape", "Size")


def quantize_saved_activations(model: onnx.ModelProto) -> list[str]:
    """Rewrite `model` (ORT's training graph) in place; returns the tensors now saved in 8 bits."""
    g = model.graph
    nodes = list(g.node)
    produced = producers(nodes)
    backward_made = {o for n in nodes if is_backward(n) for o in n.output if o}
    shapes = stated_shapes(model)
    graph_outputs = {o.name for o in g.output}
    floats = {v.name for v in [*g.value_info, *g.output]
              if v.type.tensor_type.elem_type == TensorProto.FLOAT}
    readers: dict[str, list[tuple[int, int]]] = {}
    for i, n in enumerate(nodes):
        for k, x in enumerate(n.input):
            readers.setdefault(x, []).append((i, k))
    before: dict[int, list] = {}  # node index -> new nodes to put in front of it
    after: dict[int, list] = {}
    reads_as: dict[str, str] = {}  # Y -> what Y's forward readers read now (chained PassThroughs)
    done = []
    for t, src in produced.items():
        shape = shapes.get(t) or ()
        if (is_backward(nodes[src]) or t not in floats or len(shape) < 3
                or shape[0] is not None):
            continue  # an activation map has the batch axis first; weights do not
        back = [(i, k) for i, k in readers.get(t, ()) if is_backward(nodes[i])]
        fwd = [(i, k) for i, k in readers.get(t, ()) if not is_backward(nodes[i])]
        if not fwd or not [r for r in back if nodes[r[0]].op_type not in SHAPE_READERS]:
            continue
        gate = next((names.grad_name(o) for i, _ in fwd for o in nodes[i].output
                     if o and names.grad_name(o) in backward_made), None)
        first = min((i for i, _ in back if nodes[i].op_type not in SHAPE_READERS))
        if gate is None or produced[gate] > first:
            continue
        last = max(i for i, _ in fwd)  # T's last forward reader: quantise once it has run
        y = next((o for o in nodes[last].output if o), None)
        if y is None or y in graph_outputs:
            continue
        q, scale, zp, late, dq = names.saved_int8_names(t)
        gate_alias, ready, y_after = f"{q}_gate", f"{q}_ready", f"{q}_after"
        now = reads_as.get(y, y)  # two saved tensors with one last reader (a residual sum)
        after.setdefault(last, []).extend([
            helper.make_node("PassThrough", [t, y], [ready, f"{q}_reader"], name=f"{q}/ready",
                             domain="com.microsoft"),
            helper.make_node("DynamicQuantizeLinear", [ready], [q, scale, zp],
                             name=f"{q}/quantize"),
            helper.make_node("PassThrough", [now, q], [y_after, f"{q}_forward"],
                             name=f"{q}/order", domain="com.microsoft")])
        for i, k in readers.get(y, ()):
            if not is_backward(nodes[i]) and nodes[i].input[k] == now:
                nodes[i].input[k] = y_after
        reads_as[y] = y_after
        before.setdefault(first, []).extend([
            helper.make_node("PassThrough", [q, gate], [late, gate_alias], name=f"{q}/wait",
                             domain="com.microsoft"),
            helper.make_node("DequantizeLinear", [late, scale, zp], [dq], name=f"{q}/dequantize")])
        for i, k in back:
            nodes[i].input[k] = q if nodes[i].op_type in SHAPE_READERS else dq
        _declare(g, t, q, late, dq)
        done.append(t)
    if done:
        ensure_ms_domain(model)
        new = [n for group in (*before.values(), *after.values()) for n in group]
        declare_like(model, [n for n in new if n.op_type == "PassThrough"],
                     lambda node, k, o: node.input[k])  # PassThrough's k-th output: input k
        out = []
        for i, n in enumerate(nodes):
            out.extend(before.get(i, ()))
            out.append(n)
            out.extend(after.get(i, ()))
        del g.node[:]
        g.node.extend(out)
    return done


def _declare(g: onnx.GraphProto, t: str, q: str, late: str, dq: str) -> None:
    """Declare the new tensors' types and shapes (ONNX has no shape function for PassThrough)."""
    src = next(v for v in [*g.value_info, *g.output] if v.name == t)
    dims = [d.dim_value if d.HasField("dim_value") else d.dim_param
            for d in src.type.tensor_type.shape.dim]
    for name, kind in ((q, TensorProto.UINT8), (late, TensorProto.UINT8), (dq, TensorProto.FLOAT)):
        g.value_info.append(helper.make_tensor_value_info(name, kind, dims))


def int8_saved_activations(graphs: Graphs, ctx: Context) -> int:
    """Hold the activations saved for backward in 8 bits (DynamicQuantizeLinear in forward,
    DequantizeLinear when backward reaches them), where the static predictor gives the step a
    lower peak so; returns how many tensors it rounds (none where the predictor makes no claim
    or a higher one: imu_transformer measured 1,688,064 bytes with them, 1,660,416 without)."""
    trial = graphs.copy()
    rounded = quantize_saved_activations(trial.training)
    if not rounded:
        return 0
    if ctx.predictor is not None:
        with_int8, without = ctx.predicted_peak_as_shipped(trial), \
            ctx.predicted_peak_as_shipped(graphs)
        if with_int8 is None or without is None or with_int8 >= without:
            return 0
    graphs.training.CopyFrom(trial.training)
    return len(rounded)


PASS = Pass("int8_saved_activations", "training", int8_saved_activations,
            option="saved_activations int8",
            when=lambda ctx: ctx.plan.saved_activations == "int8")
