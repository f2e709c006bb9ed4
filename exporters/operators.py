"""Which operators an artifact may contain, and a clear refusal for the rest.

Checked on the forward ONNX graph before ORT builds any training graph: an operator listed in
REFUSED fails with the module that produced it, the operator, and what to use instead. An
operator ORT's gradient builder rejects for another reason is explained the same way from its
error (explain_artifact_failure). Either way nothing is written to the artifact folder.
"""
from __future__ import annotations

import re

import onnx

# ONNX operator -> why it is refused and what to use instead (measured with
# onnxruntime-training 1.19.2; docs/byom.md has the whole operator table).
REFUSED: dict[str, str] = {
    "InstanceNormalization": "ORT has no gradient for it; use nn.GroupNorm (edgetrain rewrites "
                             "it into ops that train) or BatchNorm",
    "HardSwish": "ORT has no gradient for it; use the nn.Hardswish module (rewritten into Clip, "
                 "which trains) rather than F.hardswish",
    "HardSigmoid": "ORT has no gradient for it; use the nn.Hardsigmoid module (rewritten into "
                   "Clip) rather than F.hardsigmoid",
    "AveragePool": "its gradient kills onnxruntime-training 1.19.2 with a floating-point "
                   "exception; use nn.AvgPool1d/2d with kernel == stride and no padding "
                   "(rewritten into a mean), adaptive average pooling to size 1, or a mean "
                   "over the axis",
}


class UnsupportedOperatorError(ValueError):
    """The model uses an operator edgetrain cannot train."""


def module_of(node: onnx.NodeProto) -> str:
    """The PyTorch module that produced a node, from the legacy exporter's scoped node name
    ("/encoder/layers.0/self_attn/MatMul_3" -> "encoder.layers.0.self_attn")."""
    parts = [p for p in node.name.split("/") if p][:-1]
    return parts[-1] if parts and "." in parts[-1] else ".".join(parts) or "(top level)"


def check_operators(model: onnx.ModelProto) -> None:
    """Raise UnsupportedOperatorError for the first node whose operator is refused."""
    for node in model.graph.node:
        if node.op_type in REFUSED:
            raise UnsupportedOperatorError(
                f"module {module_of(node)!r} uses the ONNX operator {node.op_type}, which "
                f"edgetrain cannot train: {REFUSED[node.op_type]}. Nothing was written.")


_NO_GRADIENT = re.compile(r"has not been registered: (\w+) for node (\S+?)\)?(?:\s|$)")


def explain_artifact_failure(error: Exception, model: onnx.ModelProto, log: list[str]
                             ) -> Exception:
    """A ValueError naming what ORT's artifact builder could not do (and the module), for an
    exception it raised; the ORT message's first line is kept for reference."""
    text = "\n".join([str(error), *log])
    ops = {n.op_type for n in model.graph.node}
    found = _NO_GRADIENT.search(text)
    first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    if found:
        op, node_name = found.group(1), found.group(2)
        module = module_of(onnx.helper.make_node(op, [], [], name=node_name))
        return UnsupportedOperatorError(
            f"module {module!r} uses the ONNX operator {op}, for which onnxruntime-training "
            f"1.19.2 builds no gradient. Replace that layer with one that trains (docs/byom.md "
            "lists them). Nothing was written.")
    first = first.split(" was false.")[-1].strip() or first[-300:]
    return UnsupportedOperatorError(
        f"onnxruntime-training could not build the training graph of this model ({first}). "
        f"Its operators: {', '.join(sorted(ops))}; docs/byom.md lists what trains. Nothing "
        "was written.")
