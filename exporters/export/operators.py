"""Which operators an artifact may contain, and a clear refusal for the rest.

Checked on the forward ONNX graph before ORT builds any training graph: an operator listed in
REFUSED fails with the module that produced it, the operator, and what to use instead. An
operator ORT's gradient builder rejects for another reason is explained the same way from its
error (explain_artifact_failure). Either way nothing is written to the artifact folder.
"""
from __future__ import annotations

import re
from pathlib import Path

import onnx

from edgetrain.graphcheck import check_model_file
from edgetrain.specs import ArtifactError

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


# ONNX operator ORT builds no gradient for -> what to use instead (exporters/models/rewrites.py
# rewrites the modules; their functional forms reach ORT as these operators).
NO_GRADIENT_ADVICE: dict[str, str] = {
    "ReduceMax": "for a max over an axis (amax, max(dim)) use nn.AdaptiveMaxPool1d(1) / "
                 "AdaptiveMaxPool2d(1) or F.max_pool1d over the whole axis (MaxPool trains)",
    "GlobalMaxPool": "use the nn.AdaptiveMaxPool1d/2d(1) module (rewritten into a MaxPool "
                     "that trains) rather than F.adaptive_max_pool1d/2d",
    "Elu": "use the nn.ELU module (rewritten into ReLU and Exp) rather than F.elu",
    "Celu": "use the nn.CELU module (rewritten into ReLU and Exp) rather than F.celu",
    "Selu": "use the nn.SELU module (rewritten into ReLU and Exp) rather than F.selu",
    "PRelu": "use the nn.PReLU module (rewritten into ReLU) rather than F.prelu",
    "Softplus": "use the nn.Softplus or nn.Mish module (rewritten into ReLU, Exp and Log) "
                "rather than F.softplus or F.mish",
}


class UnsupportedOperatorError(ValueError):
    """The model uses an operator edgetrain cannot train."""


def module_of(node: onnx.NodeProto) -> str:
    """The PyTorch module that produced a node, from the legacy exporter's scoped node name
    ("/encoder/layers.0/self_attn/MatMul_3" -> "encoder.layers.0.self_attn"; a gradient
    node's "/body/body.1/Resize_Grad/ResizeGrad_0" -> "body.1")."""
    parts = [p for p in node.name.split("/") if p and not p.endswith("_Grad")][:-1]
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
            f"1.19.2 builds no gradient. " + (f"Instead, {NO_GRADIENT_ADVICE[op]}" if op in
                                              NO_GRADIENT_ADVICE else "Replace that layer with "
                                              "one that trains (docs/byom.md lists them)")
            + ". Nothing was written.")
    first = first.split(" was false.")[-1].strip() or first[-300:]
    return UnsupportedOperatorError(
        f"onnxruntime-training could not build the training graph of this model ({first}). "
        f"Its operators: {', '.join(sorted(ops))}; docs/byom.md lists what trains. Nothing "
        "was written.")


_NO_KERNEL = re.compile(r"Could not find an implementation for (\w+)\(\d+\) node with name "
                        r"'([^']*)'")
_FORWARD_ONLY = re.compile(r"(\w+) and \w+ kernel only supports the forward direction")


def check_loads(folder, files: dict[str, str], forward: onnx.ModelProto) -> None:
    """Open the artifact's training Module (without its eval graph, which the export fixes
    later) and Optimizer as the device will (no cap), right after ORT built them, and raise
    UnsupportedOperatorError when ONNX Runtime cannot: a gradient that has no CPU kernel
    (Resize's), a recurrent cell ORT trains only forward (bidirectional LSTM/GRU). Without
    this the export would succeed and every device run fail. The finished artifact is opened
    again by the export's dry run (dryrun.py)."""
    from pathlib import Path

    from onnxruntime.training import api

    from edgetrain import names
    from exporters.export.torchonnx import native_stderr_captured

    path = {role: str(Path(folder) / name) for role, name in files.items()}
    log: list[str] = []
    try:
        with native_stderr_captured(log):
            state = api.CheckpointState.load_checkpoint(path[names.CHECKPOINT])
            module = api.Module(path[names.TRAINING_MODEL], state)
            api.Optimizer(path[names.OPTIMIZER_MODEL], module)
    except Exception as e:  # noqa: BLE001 - ORT raises bare RuntimeErrors
        raise explain_load_failure(e, forward) from e


def explain_load_failure(error: Exception, forward: onnx.ModelProto) -> Exception:
    """An UnsupportedOperatorError naming the operator and module ORT could not load."""
    text = str(error)
    missing = _NO_KERNEL.search(text)
    if missing:
        op, node_name = missing.groups()
        module = module_of(onnx.helper.make_node(op, [], [], name=node_name))
        return UnsupportedOperatorError(
            f"module {module!r} needs the operator {op} in training, which onnxruntime-training "
            "1.19.2 has no CPU kernel for. Replace that layer with one that trains "
            "(docs/byom.md lists them). Nothing was written.")
    forward_only = _FORWARD_ONLY.search(text)
    if forward_only:
        cell = forward_only.group(1).removesuffix("Training")  # GRUTraining: the GRU
        nodes = [n for n in forward.graph.node if n.op_type == cell and any(
            a.name == "direction" and a.s != b"forward" for a in n.attribute)]
        where = f"module {module_of(nodes[0])!r}" if nodes else "the model"
        return UnsupportedOperatorError(
            f"{where} runs a bidirectional {cell}, which onnxruntime-training 1.19.2 trains "
            f"only in the forward direction; use bidirectional=False (or two {cell}s, one on "
            "the time-reversed input). Nothing was written.")
    first = text.strip().splitlines()[0][-300:] if text.strip() else type(error).__name__
    return UnsupportedOperatorError(
        f"onnxruntime-training cannot load this model's training graph ({first}); "
        "docs/byom.md lists what trains. Nothing was written.")


def check_device_graphs(folder: Path, files: dict[str, str]) -> None:
    """Every graph the export wrote passes the device's own check (edgetrain/graphcheck.py:
    the operator allowlist, no subgraphs, bounded attributes and constant-made tensors), so
    an artifact the exporter finishes always loads; else UnsupportedOperatorError."""
    for role, name in files.items():
        if not name.endswith(".onnx"):
            continue
        try:
            check_model_file(role, folder / name)
        except ArtifactError as e:
            raise UnsupportedOperatorError(
                f"the exported graph would be refused on the device: "
                f"{str(e).split('. edgetrain never exports')[0]}. Rewrite the layer with "
                "operators docs/byom.md lists; nothing was written") from e
