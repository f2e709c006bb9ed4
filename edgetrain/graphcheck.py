"""An artifact's graphs checked for what they will do, before ONNX Runtime sees them.

The manifest's hashes say the bytes are the ones the exporter sealed; they say nothing about
a hand-made artifact sealed by someone else. So every ONNX file of an artifact is read here
(edgetrain/onnxscan.py, no onnx package) and refused, as an ArtifactError naming the file, the
node and the fix, if it:

- keeps a tensor in an external file (ORT would open any path the graph names);
- defines local functions, or has a node holding a subgraph (If, Loop, Scan: work and memory
  no check can bound before they run);
- has a node whose operator is not on the device's allowlist (edgetrain/operators.py);
- sets a window attribute out of range (a zero kernel, stride or dilation; a negative pad);
- makes a tensor from constants (ConstantOfShape, Expand, Reshape, Tile, Range, OneHot,
  Resize) larger than MAX_CONSTANT_TENSOR_BYTES, or with a zero Range step.

What no static check can bound (a shape that depends on the data) is allocated at run time
from the capped arena: the sessions run with ORT's constant folding off
(edgetrain/sessions.py), so no graph computes a tensor at load time outside the cap.
"""
from __future__ import annotations

from pathlib import Path

from edgetrain.onnxscan import GraphOutline, MalformedOnnx, Node, external_data, outline
from edgetrain.operators import OPERATOR_ATTRIBUTES, WINDOW_ATTRIBUTES, allowed
from edgetrain.specs import ArtifactError

# The largest tensor a graph may make from its constants alone, counted at 4 bytes an
# element: the largest budget of any device profile (watch-app-high, 256 MiB). The exporter's
# graphs make shape vectors and masks this way, a few KB at most.
MAX_CONSTANT_TENSOR_BYTES = 256 << 20
_ITEM_BYTES = 4

# operator -> index of the input whose constant value sizes its output (elements = product)
_SIZED_BY = {"ConstantOfShape": 0, "Expand": 1, "Reshape": 1, "Tile": 1, "Resize": 3,
             "Upsample": 1}


def _where(role: str, path: Path, node: Node) -> str:
    name = f" {node.name!r}" if node.name else ""
    return f"{role} file {path} node{name} ({node.domain or 'ai.onnx'}.{node.op_type})"


def _refuse(role: str, path: Path, node: Node, what: str) -> None:
    raise ArtifactError(f"{_where(role, path, node)} {what}. edgetrain never exports such a "
                        "node; the artifact is refused (re-export it with `edgetrain export`)")


def _elements(values: tuple[int, ...]) -> int:
    n = 1
    for v in values:
        n *= max(v, 1)
    return n


def _constant_size(node: Node, consts: dict) -> int | None:
    """Elements of the tensor `node` makes, where constants alone decide it (else None)."""
    if node.op_type == "Range" and len(node.inputs) == 3:
        start, limit, delta = (consts.get(i) for i in node.inputs)
        if None in (start, limit, delta) or not (len(start) == len(limit) == len(delta) == 1):
            return None
        if delta[0] == 0:
            return -1
        return max(0, -(-(limit[0] - start[0]) // delta[0]))
    if node.op_type == "OneHot" and len(node.inputs) >= 2:
        depth = consts.get(node.inputs[1])
        return _elements(depth) if depth else None
    index = _SIZED_BY.get(node.op_type)
    if index is None or index >= len(node.inputs) or node.inputs[index] not in consts:
        return None
    return _elements(consts[node.inputs[index]])


def _check_node(role: str, path: Path, node: Node, consts: dict) -> None:
    if node.has_subgraph:
        _refuse(role, path, node, "holds a subgraph (control flow), whose work and memory "
                "cannot be bounded before it runs")
    if not allowed(node.domain, node.op_type):
        _refuse(role, path, node, "is not on the device's list of operators "
                "(edgetrain/operators.py)")
    limits = {**WINDOW_ATTRIBUTES, **OPERATOR_ATTRIBUTES.get(node.op_type, {})}
    for key, (lo, hi) in limits.items():
        bad = [v for v in node.ints.get(key, ()) if not lo <= v <= hi]
        if bad:
            _refuse(role, path, node, f"sets {key} to {list(node.ints[key])[:8]}; each value "
                    f"must lie in [{lo}, {hi}]")
    n = _constant_size(node, consts)
    if n == -1:
        _refuse(role, path, node, "counts with a step of 0")
    if n is not None and n * _ITEM_BYTES > MAX_CONSTANT_TENSOR_BYTES:
        _refuse(role, path, node, f"makes a tensor of {n:,} elements from constants "
                f"({n * _ITEM_BYTES:,} bytes or more; at most {MAX_CONSTANT_TENSOR_BYTES:,})")


def check_model_bytes(role: str, path: Path, data: bytes) -> GraphOutline:
    """Refuse (ArtifactError) an ONNX file of an artifact that would do more than the exporter's
    graphs do; return its outline."""
    try:
        refs = external_data(data)
        graph = outline(data)
    except MalformedOnnx as e:
        raise ArtifactError(f"{role} file {path} is not a readable ONNX model ({e}); "
                            "re-export the artifact") from e
    if refs:
        name, location = refs[0]
        raise ArtifactError(
            f"{role} file {path} keeps tensor {name!r} in an external file {location!r} "
            f"({len(refs)} external tensor(s)); edgetrain artifacts carry no external data, and "
            "a path outside the artifact folder would let the graph read any file. The "
            "artifact is refused; re-export it with edgetrain")
    if graph.functions:
        raise ArtifactError(f"{role} file {path} defines {graph.functions} local function(s); "
                            "edgetrain never exports one, and their nodes would escape this "
                            "check. The artifact is refused; re-export it with edgetrain")
    for node in graph.nodes:
        _check_node(role, path, node, graph.int_constants)
    return graph


def check_model_file(role: str, path: Path) -> GraphOutline:
    return check_model_bytes(role, path, Path(path).read_bytes())
