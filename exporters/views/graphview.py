"""The forward graph grouped by block, as an SVG a browser opens and zooms (host side).

One box per block of the network, in execution order. A block is a numbered child module
that holds modules of its own (`blocks.3`, `stages.0.1`: the repeated units of a network),
or a top-level module (`stem`, `classifier`); nodes outside any module (the pooling and the
loss the exporter adds) form "(top level)". Inside a box, each forward node is a square, coloured by
the bytes of its output that backward keeps (white: freed after forward). Hovering a square
shows its operator, output and bytes.

Each box is labelled with its share of the activations, in bytes and percent, with a bar in
proportion to its bytes: the memory-pattern buffers live at the step's fullest moment, by the
block of the node that wrote the tensor each holds then (a forward output backward still
needs, or a backward temporary such as a gradient being summed). Rows below the boxes hold
the rest (exporters/views/activationparts.py): the pattern's space never live all at once, the
run-time allocations outside it, and, beside a measurement, what the allocator measured
beyond the prediction. The labels sum to the title's figure: `measure`'s activations when
the view is drawn beside a measurement, else the predicted ones.
"""
from __future__ import annotations

import dataclasses
from html import escape
from pathlib import Path

import numpy as np

from exporters.views.activationparts import ActivationParts, activation_parts
from exporters.graph import load_graph, without_identities
from exporters.predictor.shapes import runtime_shapes
from exporters.plans.recompute import analyse

TOP_LEVEL = "(top level)"
WIDTH, SQUARE, PER_ROW, BOX_GAP = 1100, 14, 64, 26


def module_path(node_name: str) -> tuple[str, ...]:
    """'/stages/stages.0/Conv' -> ('stages', 'stages.0'); () for nodes outside modules. A
    gradient node's scope names its forward node ('/stem/Conv_Grad/ConvGrad_0'): the
    `_Grad` part is dropped, so a gradient belongs to its forward node's module."""
    if not node_name.startswith("/"):
        return ()
    return tuple(p for p in node_name.strip("/").split("/")[:-1] if not p.endswith("_Grad"))


def block_of(node_name: str, containers: set[tuple[str, ...]]) -> str:
    """The block a node belongs to: its top-level module, refined through numbered children
    that hold modules of their own (`containers`: every module path with a deeper one).
    '/stages/stages.0/stages.0.1/conv/conv.0/Conv' -> 'stages.0.1'; '/stem/stem.0/Conv' ->
    'stem' (stem.0 is a leaf conv); '/ReduceMean' -> '(top level)'."""
    parts = module_path(node_name)
    if not parts:
        return TOP_LEVEL
    key = parts[0]
    for i, seg in enumerate(parts[1:], 1):
        if not seg.startswith(key + ".") or parts[:i + 1] not in containers:
            break
        key = seg
    return key


def forward_graph(training_model: str):
    """(graph, its forward analysis, the module paths that hold deeper ones): read once, for
    the boxes and for the shares."""
    model, _ = without_identities(load_graph(training_model))
    fwd = analyse(model)
    paths = {module_path(n.name) for n in fwd.nodes}  # forward only: no "..._Grad" paths
    return model, fwd, {p[:i] for p in paths for i in range(1, len(p))}


def forward_blocks(forward, batch: int) -> list[dict]:
    """[{"block", "nodes": [(op, first output, bytes, kept)], "saved_bytes"}] in execution
    order; a node's bytes are those backward keeps of its outputs, or all of them if none.
    forward: forward_graph() of the training graph."""
    model, fwd, containers = forward
    shapes = runtime_shapes(model, batch)
    blocks: dict[str, dict] = {}
    def nbytes(t: str) -> int:
        return int(np.prod(shapes[t][0])) * shapes[t][1] if t in shapes else 0

    for node in fwd.nodes:  # a node's bytes: all its outputs; kept: those backward reads
        outs = [o for o in node.output if o]
        kept = sum(nbytes(o) for o in outs if o in fwd.saved)
        b = blocks.setdefault(block_of(node.name, containers), {"nodes": [], "saved_bytes": 0})
        b["nodes"].append((node.op_type, outs[0], kept or sum(map(nbytes, outs)), kept > 0))
        b["saved_bytes"] += kept
    return [{"block": k, **v} for k, v in blocks.items()]


def parts_of(training_model: str, forward, eval_model: str, batch: int, threads: int,
             measured_bytes: int | None = None) -> ActivationParts:
    """The step's activations in parts by block (exporters/views/activationparts.py); forward:
    forward_graph(training_model)."""
    _, fwd, containers = forward
    parts = activation_parts(training_model, lambda name: block_of(name, containers),
                             {o for n in fwd.nodes for o in n.output}, eval_model, batch,
                             threads, measured_bytes)
    order = list(dict.fromkeys(block_of(n.name, containers) for n in fwd.nodes))
    rank = {b: k for k, b in enumerate(order)}  # blocks in execution order, as the boxes
    blocks = dict(sorted(parts.blocks.items(), key=lambda kv: rank.get(kv[0], len(rank))))
    return dataclasses.replace(parts, blocks=blocks)


def _colour(saved_bytes: int, most: int) -> str:
    if not saved_bytes:
        return "#ffffff"
    t = 0.25 + 0.75 * np.sqrt(saved_bytes / max(1, most))  # light to deep orange
    r, g, b = (np.array([255, 235, 205]) * (1 - t) + np.array([200, 70, 20]) * t).astype(int)
    return f"#{r:02x}{g:02x}{b:02x}"


def _mib(n: int) -> str:
    return f"{n / 2**20:.2f} MiB" if abs(n) >= 2**20 else f"{n / 1024:.1f} KiB"


def _share(nbytes: int, total: int) -> str:
    return f"{_mib(nbytes)}, {100 * nbytes / max(1, total):.1f}%"


def _bar(x: float, y: float, nbytes: int, widest: int) -> str:
    """A bar in proportion to bytes (all bars of the picture to one scale); red if negative."""
    w = max(1.0, 500 * abs(nbytes) / widest)
    return (f'<rect class="bar" x="{x}" y="{y}" width="{w:.1f}" height="8" '
            f'fill="{"#c44e52" if nbytes >= 0 else "#999999"}"/>')


def _square(k: int, op: str, name: str, size: int, keep: bool, y: float, most: int) -> str:
    cx = 20 + (k % PER_ROW) * (SQUARE + 2)
    cy = y + 38 + (k // PER_ROW) * (SQUARE + 4)
    tip = f"{op} -> {name}: {_mib(size)}, {'kept for backward' if keep else 'freed'}"
    return (f'<rect class="node" x="{cx}" y="{cy}" width="{SQUARE}" height="{SQUARE}" '
            f'fill="{_colour(size if keep else 0, most)}" stroke="#555" stroke-width="0.5">'
            f'<title>{escape(tip)}</title></rect>')


def write_graph_svg(training_model: str, batch: int, out: Path, *, eval_model: str,
                    threads: int, measured_activations: int | None = None,
                    parts: ActivationParts | None = None) -> Path:
    """graph.svg in `out` for the training graph at `batch`; eval_model and threads as the
    prediction uses them (the artifact's eval graph, the runtime's intra-op threads). With
    measured_activations (`measure`'s), the parts sum to it (exporters/views/activationparts.py);
    parts: those parts, already made."""
    forward = forward_graph(training_model)
    blocks = forward_blocks(forward, batch)
    parts = parts or parts_of(training_model, forward, eval_model, batch, threads,
                              measured_activations)
    shares = parts.blocks
    for name in shares.keys() - {b["block"] for b in blocks}:  # only backward nodes: a box too
        blocks.append({"block": name, "nodes": [], "saved_bytes": 0})
    total = parts.total_bytes
    most = max((s for b in blocks for *_, s, keep in b["nodes"] if keep), default=1)
    widest = max([abs(v) for _, v in parts.rows()] + [1])
    svg_parts, y = [], 74
    for b in blocks:
        share = shares.get(b["block"], {"forward": 0, "backward": 0})
        nbytes = sum(share.values())
        rows = max(1, -(-len(b["nodes"]) // PER_ROW))
        height = 42 + rows * (SQUARE + 4)
        svg_parts.append(
            f'<g class="block" data-block="{escape(b["block"])}" '
            f'data-saved-bytes="{b["saved_bytes"]}" data-activation-bytes="{nbytes}">'
            f'<rect x="10" y="{y}" width="{WIDTH - 20}" height="{height}" rx="6" '
            f'fill="#f6f6f6" stroke="#999"/>'
            f'<text x="20" y="{y + 18}" font-size="13">{escape(b["block"])}: '
            f'{_share(nbytes, total)} of the activations ({_mib(share["forward"])} forward '
            f'outputs backward needs, {_mib(share["backward"])} backward temporaries); '
            f'{len(b["nodes"])} forward node{"s" if len(b["nodes"]) != 1 else ""}</text>'
            + _bar(20, y + 24, nbytes, widest) + "".join(
                _square(k, op, name, size, keep, y, most)
                for k, (op, name, size, keep) in enumerate(b["nodes"])) + "</g>")
        y += height + BOX_GAP
        svg_parts.append(f'<line x1="{WIDTH / 2}" y1="{y - BOX_GAP}" x2="{WIDTH / 2}" y2="{y}" '
                         'stroke="#666" marker-end="url(#arrow)"/>')
    svg_parts.pop()  # no arrow after the last block
    for what, nbytes in parts.rows()[len(parts.blocks):]:
        svg_parts.append(f'<g class="rest" data-what="{escape(what)}" data-activation-bytes='
                         f'"{nbytes}"><text x="20" y="{y + 4}" font-size="13">{escape(what)}: '
                         f'{_share(nbytes, total)} of the activations</text>'
                         + _bar(560, y - 6, nbytes, widest) + '</g>')
        y += 22
    source = ("measured by the allocator, as `edgetrain measure` reports"
              if parts.measured_bytes is not None else "predicted")
    svg = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{y + 10}" '
           f'viewBox="0 0 {WIDTH} {y + 10}" data-activation-bytes="{total}" '
           f'data-saved-bytes="{sum(b["saved_bytes"] for b in blocks)}" '
           'font-family="sans-serif">'
           '<defs><marker id="arrow" markerWidth="8" markerHeight="8" refX="4" refY="4" '
           'orient="auto"><path d="M0,0 L8,4 L0,8 z" fill="#666"/></marker></defs>'
           f'<text x="10" y="24" font-size="16">Training step at batch {batch}, by block: '
           f'{_mib(total)} of activations ({source}, {threads} threads)</text>'
           f'<text x="10" y="44" font-size="11" fill="#555">{escape(parts.sentence())}</text>'
           '<text x="10" y="62" font-size="11" fill="#555">bars: bytes, to one scale; '
           'squares: forward nodes, coloured by the bytes of their output kept for backward '
           '(white: freed after forward); hover a square for its operator and bytes</text>'
           + "".join(svg_parts) + "</svg>")
    path = out / "graph.svg"
    path.write_text(svg)
    return path
