"""Pass `pointwise_grads_split` (training graph): a pointwise convolution's gradients in two
steps, so that a weight built on each call dies before its gradient is made.

ORT's ConvGrad(dY, X, W) -> (dX, dW, dB) makes dW while W is alive: both are live at once.
For a masked layer W is a dense weight rebuilt from its kept values (exporters/plans/sparse.py,
densebuild.py), and dW a dense tensor of the same size read back at the kept positions, so
C6's 1024 x 1024 pointwise layer held 8 MB at the step's peak where either alone is 4 MB
(the memory pattern then kept both slots for the whole step). For a pointwise convolution
(a 1 x 1 kernel, stride 1, one group, no padding; [N, C, *pixels] flattened to [N, C, P])
both gradients are matrix products:

    dX[n] = W^T dY[n]                   FusedMatMul(W2, dY3, transA=1)     [N, C_in, P]
    dW    = sum_n dY[n] X[n]^T          FusedMatMul(dYt, Xt, transB=1)     [C_out, C_in]
            with dYt = [C_out, N*P] and Xt = [C_in, N*P] (Transpose [1, 0, 2], Reshape)
    dB    = ReduceSum(dY, all axes but 1)

Where an image has many pixels (C_out * C_in < (C_out + C_in) * P, per_image_dw), dW is made
per image and summed instead: FusedMatMul(dY3, X3, transB=1) -> [N, C_out, C_in], ReduceSum
over N. The transposed copies of dY and X would be activation-sized (on ResNet-50's first
stride-2 stage, a 25.7 MB copy of X at the step's peak); N weight-sized products are smaller.

dX is computed first; dY reaches the dW product through PassThrough(dY3, dX3), so ORT runs it
after dX, when W's last reader has run and W's buffer is free. The weight gradient's memory
then takes W's place. Rewritten: ConvGrads of such convolutions whose W is computed in the
graph (not a parameter or constant: those live all step anyway), whose dX and dW are both
used, and whose pixels the graph states. Values are the same sums in another order (float
rounding in the last bits).

Where an image has few pixels (P <= ONE_PRODUCT_MAX_PIXELS), dX is one product over the whole
micro-batch instead of N:

    dXt = W^T dYt                       FusedMatMul(W2, dYt, transA=1)     [C_in, N*P]
    dX  = Transpose(dXt as [C_in, N, P], [1, 0, 2])

reusing dYt, which dW needs anyway. ORT's batched FusedMatMul packs the transposed W once per
image: on C6's last pointwise layer (1024 x 1024, 4 x 4 pixels, 7 patches) that took 1.39 ms
against 0.72 ms for the one product with its two transposes; at 64 pixels the two were even
(256 x 256: 0.31 vs 0.29 ms) and at 256 the batched product won (bench/gradkernels.py). The
step holds dYt while dX is made and a dX-sized product briefly beside dX: small tensors at so
few pixels, and the memory predictor sees them like any other.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from exporters.graph import ensure_ms_domain, int64_constant, stated_shapes
from exporters.passes.sparsegrad import pointwise_conv_grad
from exporters.passes.pipeline import Context, Graphs, Pass

SUFFIX = "_pwgrad"
ONE_PRODUCT_MAX_PIXELS = 16  # pixels an image at most, for dX as one product (docstring)
MS_DOMAIN = "com.microsoft"


def rewrite_pointwise_grads(model: onnx.ModelProto) -> int:
    """Split each such ConvGrad (see the module's docstring), in place and in its position of
    the node list. Returns how many were rewritten."""
    graph = model.graph
    shapes = stated_shapes(model)
    computed = {o for n in graph.node for o in n.output if o}
    used = {x for n in graph.node for x in n.input} | {o.name for o in graph.output}
    out, count = [], 0
    for node in graph.node:
        found = pointwise_conv_grad(node, shapes)
        if (found is None or node.input[2] not in computed or not node.output[0]
                or node.output[0] not in used or node.output[1] not in used):
            out.append(node)
            continue
        out += _nodes(node, *found, graph)
        count += 1
    if count:
        del graph.node[:]
        graph.node.extend(out)
        ensure_ms_domain(model)
    return count



def _state_batch_dim(graph, x: str, tensors: dict[str, list]) -> None:
    """Give `tensors` (name -> dims, None for X's first dimension) X's symbolic batch in the
    graph's value_info. ORT cannot follow a Reshape's -1 through [C, N*P], so without it dX
    and its product's reshape would have no planned size: each would be allocated at run time
    beside the memory pattern, one more dX-sized block at the step's peak (measured)."""
    stated = next((v for v in [*graph.input, *graph.value_info] if v.name == x), None)
    dims = stated.type.tensor_type.shape.dim if stated is not None else []
    if not dims or not dims[0].HasField("dim_param"):
        return
    for name, shape in tensors.items():
        graph.value_info.append(helper.make_tensor_value_info(
            name, onnx.TensorProto.FLOAT, [dims[0].dim_param if d is None else d for d in shape]))


def _nodes(g, c_out: int, c_in: int, pixels: list, graph) -> list:
    dy, x, w = g.input[0], g.input[1], g.input[2]
    dx, dw = g.output[0], g.output[1]
    b = (g.name or dx) + SUFFIX
    view = int64_constant(graph, "pwgrad_view", [0, 0, -1])  # [N, C, *pixels] -> [N, C, P]
    rows = int64_constant(graph, "pwgrad_rows", [0, -1])  # [C, N, P] -> [C, N*P]
    w2 = helper.make_node("Reshape", [w, int64_constant(graph, f"pwgrad_w_{c_out}_{c_in}",
                                                        [c_out, c_in])], [b + "/w2"], b + "/w2")
    dx_shape = int64_constant(graph, "pwgrad_x_" + "_".join(map(str, [c_in, *pixels])),
                              [0, c_in, *pixels])
    p = int(np.prod(pixels))

    def dy_rows(src: str, out: str) -> list:  # dY as [C_out, N*P], for dW (and dX)
        return [helper.make_node("Transpose", [src], [b + "/dyt3"], b + "/dyt", perm=[1, 0, 2]),
                helper.make_node("Reshape", [b + "/dyt3", rows], [out], b + "/dyt2")]

    nodes = [helper.make_node("Reshape", [dy, view], [b + "/dy3"], b + "/dy3"), w2]
    if p <= ONE_PRODUCT_MAX_PIXELS:  # dX as one product (docstring)
        per_image = int64_constant(graph, f"pwgrad_cols_{c_in}_{p}", [c_in, -1, p])
        _state_batch_dim(graph, x, {b + "/dxt3": [c_in, None, p], b + "/dx3": [None, c_in, p]})
        nodes += dy_rows(b + "/dy3", b + "/dyt_all") + [
            helper.make_node("FusedMatMul", [b + "/w2", b + "/dyt_all"], [b + "/dxt"], b + "/dx",
                             domain=MS_DOMAIN, transA=1, transB=0, alpha=1.0),
            helper.make_node("Reshape", [b + "/dxt", per_image], [b + "/dxt3"], b + "/dxt3"),
            helper.make_node("Transpose", [b + "/dxt3"], [b + "/dx3"], b + "/dx3", perm=[1, 0, 2]),
            helper.make_node("Reshape", [b + "/dx3", dx_shape], [dx], b + "/dx_shape"),
            # dW after dX: W's last reader has run, so its buffer is free for dW
            helper.make_node("PassThrough", [b + "/dyt_all", b + "/dx3"],
                             [b + "/dyt", b + "/dx3_seen"], b + "/after_dx", domain=MS_DOMAIN)]
    else:
        nodes += [
            helper.make_node("FusedMatMul", [b + "/w2", b + "/dy3"], [b + "/dx3"], b + "/dx",
                             domain=MS_DOMAIN, transA=1, transB=0, alpha=1.0),
            helper.make_node("Reshape", [b + "/dx3", dx_shape], [dx], b + "/dx_shape"),
            # dW after dX: W's last reader has run, so its buffer is free for dW
            helper.make_node("PassThrough", [b + "/dy3", b + "/dx3"],
                             [b + "/dy3_after", b + "/dx3_seen"], b + "/after_dx",
                             domain=MS_DOMAIN)]
    wshape = int64_constant(graph, f"pwgrad_wshape_{c_out}_{c_in}_{len(pixels)}",
                            [c_out, c_in] + [1] * len(pixels))
    x3 = helper.make_node("Reshape", [x, view], [b + "/x3"], b + "/x3")
    if p > ONE_PRODUCT_MAX_PIXELS and per_image_dw(c_out, c_in, p):
        _state_batch_dim(graph, x, {b + "/dwn": [None, c_out, c_in]})
        nodes += [
            x3,
            helper.make_node("FusedMatMul", [b + "/dy3_after", b + "/x3"], [b + "/dwn"],
                             b + "/dw", domain=MS_DOMAIN, transA=0, transB=1, alpha=1.0),
            helper.make_node("ReduceSum", [b + "/dwn", int64_constant(
                graph, "pwgrad_images_axis", [0])], [b + "/dw2"], b + "/dw_sum", keepdims=0),
            helper.make_node("Reshape", [b + "/dw2", wshape], [dw], b + "/dw_shape")]
    else:
        if p > ONE_PRODUCT_MAX_PIXELS:
            nodes += dy_rows(b + "/dy3_after", b + "/dyt")
        nodes += [
            x3,
            helper.make_node("Transpose", [b + "/x3"], [b + "/xt3"], b + "/xt", perm=[1, 0, 2]),
            helper.make_node("Reshape", [b + "/xt3", rows], [b + "/xt"], b + "/xt2"),
            helper.make_node("FusedMatMul", [b + "/dyt", b + "/xt"], [b + "/dw2"], b + "/dw",
                             domain=MS_DOMAIN, transA=0, transB=1, alpha=1.0),
            helper.make_node("Reshape", [b + "/dw2", wshape], [dw], b + "/dw_shape")]
    if len(g.output) > 2 and g.output[2]:
        axes = int64_constant(graph, f"pwgrad_bias_axes_{len(pixels)}",
                      [0] + list(range(2, 2 + len(pixels))))
        nodes.append(helper.make_node("ReduceSum", [dy, axes], [g.output[2]], b + "/db",
                                      keepdims=0))
    return nodes


def per_image_dw(c_out: int, c_in: int, pixels: int) -> bool:
    """Whether dW is made per image and summed (N products [C_out, C_in]) rather than as one
    product of transposed copies of dY and X (N*P * (C_out + C_in) floats): the smaller."""
    return c_out * c_in < (c_out + c_in) * pixels


def pointwise_grads(graphs: Graphs, ctx: Context) -> int:
    """Split the ConvGrad of each rebuilt pointwise weight into dX first, then dW."""
    return rewrite_pointwise_grads(graphs.training)


PASS = Pass("pointwise_grads_split", "training", pointwise_grads)
