"""Find external-data references in an ONNX file without the onnx package (not on the device).

An ONNX tensor may keep its bytes in another file (`data_location` EXTERNAL, with a
`location` path in `external_data`). ONNX Runtime then opens that path relative to the model,
and `../` walks out of the artifact folder: a hostile artifact could make the runtime read any
file, which the manifest's hashes do not cover. edgetrain artifacts never use external data,
so the loader refuses any graph that references some.

This walks the protobuf wire format along the fields that can hold a tensor (field numbers
from onnx.proto3): ModelProto.graph and functions, FunctionProto nodes and default attribute
values, GraphProto initializers, sparse initializers and nodes, NodeProto attributes,
AttributeProto tensors and subgraphs.
Everything else is skipped by its length, so a graph of many MB scans in milliseconds.
`outline` reads, along the same fields, what the operator check needs (edgetrain/graphcheck.py):
each main-graph node's operator, domain, integer attributes and whether it holds a subgraph.
"""
from __future__ import annotations

from dataclasses import dataclass

# (message, field number) -> message type of that field, for the fields that lead to tensors
_CHILDREN = {
    ("model", 7): "graph", ("model", 25): "function",
    ("function", 7): "node", ("function", 11): "attribute",  # attribute_proto: defaults
    ("graph", 1): "node", ("graph", 5): "tensor", ("graph", 15): "sparse",
    ("node", 5): "attribute",
    ("attribute", 5): "tensor", ("attribute", 6): "graph", ("attribute", 10): "tensor",
    ("attribute", 11): "graph", ("attribute", 22): "sparse", ("attribute", 23): "sparse",
    ("sparse", 1): "tensor", ("sparse", 2): "tensor",
    ("tensor", 13): "entry",
}
_TENSOR_EXTERNAL, _TENSOR_DATA_LOCATION, _TENSOR_NAME = 13, 14, 8
_MAX_DEPTH = 64


class MalformedOnnx(ValueError):
    pass


def _varint(buf: memoryview, i: int) -> tuple[int, int]:
    shift = value = 0
    while True:
        if i >= len(buf) or shift > 63:
            raise MalformedOnnx("truncated varint")
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, i
        shift += 7


def _fields(buf: memoryview):
    """(field number, wire type, value) of one message; value is a memoryview for wire type 2."""
    i = 0
    while i < len(buf):
        key, i = _varint(buf, i)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _varint(buf, i)
        elif wire == 1:
            value, i = None, i + 8
        elif wire == 5:
            value, i = None, i + 4
        elif wire == 2:
            n, i = _varint(buf, i)
            if i + n > len(buf):
                raise MalformedOnnx("a field runs past the end of its message")
            value, i = buf[i:i + n], i + n
        else:
            raise MalformedOnnx(f"unsupported wire type {wire}")
        yield field, wire, value


def external_data(data: bytes) -> list[tuple[str, str]]:
    """(tensor name, location) of every tensor stored outside the file ('' if unnamed)."""
    found: list[tuple[str, str]] = []

    def walk(buf: memoryview, kind: str, depth: int) -> None:
        if depth > _MAX_DEPTH:
            raise MalformedOnnx("graphs nested too deep")
        name, location, external = "", "", False
        for field, wire, value in _fields(buf):
            if kind == "tensor":
                if field == _TENSOR_NAME and wire == 2:
                    name = bytes(value).decode(errors="replace")
                elif field == _TENSOR_DATA_LOCATION and wire == 0:
                    external |= value == 1
                elif field == _TENSOR_EXTERNAL and wire == 2:
                    external = True
                    entry = {f: bytes(v).decode(errors="replace")
                             for f, w, v in _fields(value) if w == 2}
                    if entry.get(1) == "location":
                        location = entry.get(2, "")
                continue
            child = _CHILDREN.get((kind, field))
            if child is not None and wire == 2:
                walk(value, child, depth + 1)
        if kind == "tensor" and external:
            found.append((name, location))

    walk(memoryview(data), "model", 0)
    return found


# onnx TensorProto data_type -> bytes per element (strings are not counted)
_ITEMSIZE = {1: 4, 2: 1, 3: 1, 4: 2, 5: 2, 6: 4, 7: 8, 9: 1, 10: 2, 11: 8, 12: 4, 13: 8,
             14: 8, 15: 16, 16: 2}
_TENSOR_DIMS, _TENSOR_DATA_TYPE = 1, 2


def _tensor_bytes(tensor: memoryview) -> int:
    numel, itemsize = 1, 0
    for field, wire, value in _fields(tensor):
        if field == _TENSOR_DIMS and wire == 0:
            numel *= value
        elif field == _TENSOR_DIMS and wire == 2:  # packed dims
            i = 0
            while i < len(value):
                d, i = _varint(value, i)
                numel *= d
        elif field == _TENSOR_DATA_TYPE and wire == 0:
            itemsize = _ITEMSIZE.get(value, 0)
    return numel * itemsize


def stored_tensor_bytes(data: bytes) -> list[int]:
    """Bytes of each tensor the main graph stores: its initializers and its Constant nodes'
    values (element count x element size). Raises MalformedOnnx."""
    sizes: list[int] = []
    for field, wire, graph in _fields(memoryview(data)):
        if field != 7 or wire != 2:  # ModelProto.graph
            continue
        for gfield, gwire, item in _fields(graph):
            if gfield == 5 and gwire == 2:  # GraphProto.initializer
                sizes.append(_tensor_bytes(item))
            elif gfield == 1 and gwire == 2:  # GraphProto.node
                fields = list(_fields(item))
                if any(f == 4 and w == 2 and bytes(v) == b"Constant" for f, w, v in fields):
                    for f, w, attr in fields:  # NodeProto.attribute -> AttributeProto.t
                        if f == 5 and w == 2:
                            sizes.extend(_tensor_bytes(t) for af, aw, t in _fields(attr)
                                         if af == 5 and aw == 2)
    return sizes


def constant_bytes(data: bytes) -> int:
    """Bytes of the main graph's stored tensors (stored_tensor_bytes): a session holds these;
    exporting a model for inference turns Constant nodes into initializers."""
    return sum(stored_tensor_bytes(data))


_TENSOR_RAW_DATA = 9


def initializer_data(data: bytes) -> dict[str, bytes]:
    """name -> raw_data of each main-graph initializer that stores its values as raw bytes
    (how ONNX Runtime writes float tensors). Raises MalformedOnnx."""
    found: dict[str, bytes] = {}
    for field, wire, graph in _fields(memoryview(data)):
        if field != 7 or wire != 2:  # ModelProto.graph
            continue
        for gfield, gwire, item in _fields(graph):
            if gfield != 5 or gwire != 2:  # GraphProto.initializer
                continue
            name = raw = None
            for f, w, v in _fields(item):
                if f == _TENSOR_NAME and w == 2:
                    name = bytes(v).decode("utf-8", "replace")
                elif f == _TENSOR_RAW_DATA and w == 2:
                    raw = bytes(v)
            if name is not None and raw is not None:
                found[name] = raw
    return found


# NodeProto, AttributeProto and ModelProto fields read by nodes() (onnx.proto3)
_NODE_INPUT, _NODE_OUTPUT, _NODE_NAME, _NODE_OP, _NODE_ATTR, _NODE_DOMAIN = 1, 2, 3, 4, 5, 7
_ATTR_NAME, _ATTR_INT, _ATTR_GRAPH, _ATTR_INTS, _ATTR_GRAPHS = 1, 3, 6, 8, 11
_MODEL_GRAPH, _MODEL_FUNCTIONS, _INT64, _TENSOR_INT64_DATA = 7, 25, 7, 7
_MAX_INT_VALUES = 64  # an integer constant longer than this is no shape


def _signed(v: int) -> int:
    return v - (1 << 64) if v >= 1 << 63 else v


def _ints(wire: int, value) -> list[int]:
    if wire == 0:
        return [_signed(value)]
    out, i = [], 0
    while i < len(value):
        v, i = _varint(value, i)
        out.append(_signed(v))
    return out


@dataclass(frozen=True)
class Node:
    """One node of an ONNX graph, as much of it as the operator check reads."""
    op_type: str
    domain: str
    name: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    ints: dict  # integer attributes: name -> tuple of values
    has_subgraph: bool  # an attribute holds a graph (control flow: If, Loop, Scan)


@dataclass(frozen=True)
class GraphOutline:
    """What a model file asks ONNX Runtime to run: its main graph's nodes, how many local
    functions it defines, and the values of its short int64 constants (initializers and
    Constant nodes of at most _MAX_INT_VALUES elements: the shapes that size tensors)."""
    nodes: tuple[Node, ...]
    functions: int
    int_constants: dict  # tensor name -> tuple of int64 values


def _int64_values(tensor) -> tuple[str, tuple[int, ...]] | None:
    name, dtype, raw, packed, dims = "", None, None, [], []
    for f, w, v in _fields(tensor):
        if f == _TENSOR_NAME and w == 2:
            name = bytes(v).decode("utf-8", "replace")
        elif f == _TENSOR_DATA_TYPE and w == 0:
            dtype = v
        elif f == _TENSOR_DIMS:
            dims.extend(_ints(w, v))
        elif f == _TENSOR_RAW_DATA and w == 2:
            raw = bytes(v)
        elif f == _TENSOR_INT64_DATA and w in (0, 2):
            packed.extend(_ints(w, v))
    n = 1
    for d in dims:
        n *= max(d, 0)
    if dtype != _INT64 or n > _MAX_INT_VALUES:
        return None
    if raw is not None:
        if len(raw) != 8 * n:
            return None
        packed = [int.from_bytes(raw[i:i + 8], "little", signed=True)
                  for i in range(0, len(raw), 8)]
    return name, tuple(packed)


def _node(buf) -> tuple[Node, list]:
    op = domain = name = ""
    inputs, outputs, ints, sub, tensors = [], [], {}, False, []
    for f, w, v in _fields(buf):
        if w != 2:
            continue
        if f == _NODE_OP:
            op = bytes(v).decode("utf-8", "replace")
        elif f == _NODE_DOMAIN:
            domain = bytes(v).decode("utf-8", "replace")
        elif f == _NODE_NAME:
            name = bytes(v).decode("utf-8", "replace")
        elif f == _NODE_INPUT:
            inputs.append(bytes(v).decode("utf-8", "replace"))
        elif f == _NODE_OUTPUT:
            outputs.append(bytes(v).decode("utf-8", "replace"))
        elif f == _NODE_ATTR:
            key, values = "", []
            for af, aw, av in _fields(v):
                if af == _ATTR_NAME and aw == 2:
                    key = bytes(av).decode("utf-8", "replace")
                elif af in (_ATTR_INT, _ATTR_INTS) and aw in (0, 2):
                    values.extend(_ints(aw, av))
                elif af in (_ATTR_GRAPH, _ATTR_GRAPHS):
                    sub = True
                elif af == 5 and aw == 2:  # AttributeProto.t: a Constant node's value
                    tensors.append(av)
            if values:
                ints[key] = tuple(values)
    return Node(op, domain, name, tuple(inputs), tuple(outputs), ints, sub), tensors


def outline(data: bytes) -> GraphOutline:
    """The GraphOutline of a model file's bytes. Raises MalformedOnnx."""
    nodes, functions, consts = [], 0, {}
    for field, wire, value in _fields(memoryview(data)):
        if field == _MODEL_FUNCTIONS and wire == 2:
            functions += 1
        if field != _MODEL_GRAPH or wire != 2:
            continue
        for gfield, gwire, item in _fields(value):
            if gwire != 2:
                continue
            if gfield == 5:  # GraphProto.initializer
                found = _int64_values(item)
                if found:
                    consts[found[0]] = found[1]
            elif gfield == 1:  # GraphProto.node
                node, tensors = _node(item)
                nodes.append(node)
                for t in tensors if node.op_type == "Constant" and node.outputs else ():
                    found = _int64_values(t)
                    if found:
                        consts[node.outputs[0]] = found[1]
    return GraphOutline(tuple(nodes), functions, consts)
