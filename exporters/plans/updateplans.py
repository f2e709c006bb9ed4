"""Update plans: which of a model's parameters train on the device.

A frozen parameter needs no gradient and no AdamW moments, and ORT's gradient builder builds
backward only as deep as the lowest trained tensor, so the frozen layers below it keep no
activations for backward either. A plan is written as a comma-separated list of items; the
parameters it trains are the union of the items':

    all        every parameter (the default)
    head       the last layer: `last:1`
    last:K     the last K layers (a layer: a parameter of two or more dimensions, such as a
               Conv or Linear weight), and every parameter the forward graph first uses at or
               after the first of them (their biases, the norms that follow them)
    bias       every one-dimensional parameter: biases and norm scales and shifts
    bias-only  the biases alone (one-dimensional parameters named `bias`: a layer's bias and a
               norm's shift; TinyTL's update). A norm scale's gradient reads the norm's input
               at every position, so `bias` keeps each norm's input for backward; `bias-only`
               keeps none of them (a ReLU's 1-byte mask where a ReLU follows)
    NAME       a parameter by its PyTorch name (`classifier.weight`), or every parameter under
               a module prefix (`blocks.7`)

Layers are ordered by where the exported forward graph first reads them (one walk over its
nodes), so the order is the order of computation, not of definition. Each named plan is a
small function in UPDATE_PLANS.
"""
from __future__ import annotations

from typing import Callable

import onnx


def first_use(graph: onnx.GraphProto, names: list[str]) -> dict[str, int]:
    """Index of the first node reading each name (len(nodes) when no node reads it)."""
    wanted, order = set(names), {}
    for i, node in enumerate(graph.node):
        for name in node.input:
            if name in wanted and name not in order:
                order[name] = i
    return {n: order.get(n, len(graph.node)) for n in names}


LAYER_OPS = {"Conv", "ConvTranspose", "Gemm", "MatMul"}


def first_layer_use(graph: onnx.GraphProto, name: str) -> int:
    """Where a masked weight's layer runs: the index of the first Conv/Gemm/MatMul node that
    reads a tensor computed from `name` (a sparse layer's values are scattered into its
    dense weight first, maybe far earlier in the graph); len(nodes) if none does."""
    derived = {name}
    for i, node in enumerate(graph.node):
        if derived.intersection(node.input):
            if node.op_type in LAYER_OPS:
                return i
            derived.update(o for o in node.output if o)
    return len(graph.node)


def _last(k: int) -> Callable[[dict, dict], list[str]]:
    def plan(shapes: dict[str, tuple], use: dict[str, int]) -> list[str]:
        layers = sorted((n for n in shapes if len(shapes[n]) >= 2), key=use.__getitem__)
        if not layers:
            return list(shapes)
        start = use[layers[-min(k, len(layers))]]
        return [n for n in shapes if use[n] >= start]
    return plan


UPDATE_PLANS: dict[str, Callable[[dict, dict], list[str]]] = {
    "all": lambda shapes, use: list(shapes),
    "head": _last(1),
    "bias": lambda shapes, use: [n for n in shapes if len(shapes[n]) == 1],
    "bias-only": lambda shapes, use: [n for n in shapes if len(shapes[n]) == 1
                                      and n.rsplit(".", 1)[-1] == "bias"],
}


def _item(item: str, shapes: dict[str, tuple], use: dict[str, int]) -> list[str]:
    if item in UPDATE_PLANS:
        return UPDATE_PLANS[item](shapes, use)
    if item.startswith("last:"):
        k = item[len("last:"):]
        if not k.isdigit() or int(k) < 1:
            raise ValueError(f"update plan item {item!r}: K in last:K must be a whole number of "
                             "layers, at least 1 (e.g. last:2)")
        return _last(int(k))(shapes, use)
    chosen = [n for n in shapes if n == item or n.startswith(item + ".")]
    if not chosen:
        some = ", ".join(list(shapes)[:6])
        raise ValueError(f"update plan item {item!r} is neither a plan ({', '.join(UPDATE_PLANS)}, "
                         f"last:K) nor a parameter name or module prefix of this model (its "
                         f"parameters begin: {some}, ...)")
    return chosen


def resolve(spec: str, shapes: dict[str, tuple], use: dict[str, int]) -> list[str]:
    """The parameters `spec` trains, in the model's parameter order.

    shapes: parameter name -> shape, in the model's order; use: parameter name -> index of the
    forward graph's first node reading it (first_use)."""
    items = [s.strip() for s in spec.split(",")]
    if not spec.strip() or any(not s for s in items):
        raise ValueError(f"update plan {spec!r} is empty or has an empty item; give e.g. all, "
                         "head, bias, last:2 or parameter names, separated by commas")
    chosen: set[str] = set()
    for item in items:
        chosen.update(_item(item, shapes, use))
    return [n for n in shapes if n in chosen]
