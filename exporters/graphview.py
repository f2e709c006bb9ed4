"""The forward graph grouped by block, as an SVG a browser opens and zooms (host side).

One box per block of the network, in execution order. A block is a numbered child module
that holds modules of its own (`blocks.3`, `stages.0.1`: the repeated units of a network),
or a top-level module (`stem`, `classifier`); nodes outside any module (the pooling and the loss the
exporter adds) form "(top level)". Inside a box, each forward node is a square, coloured by
the bytes of its output that backward keeps (white: freed after forward). Hovering a square
shows its operator, output and bytes. Each box is labelled with the bytes its nodes keep for
backward; the title gives the total, which the boxes' labels sum to.
"""
from __future__ import annotations

from html import escape
from pathlib import Path

import numpy as np

from exporters.graph import load_graph, without_identities
from exporters.predictor.shapes import runtime_shapes
from exporters.recompute import analyse

TOP_LEVEL = "(top level)"
WIDTH, SQUARE, PER_ROW, BOX_GAP = 1100, 14, 64, 26


def module_path(node_name: str) -> tuple[str, ...]:
    """'/stages/stages.0/Conv' -> ('stages', 'stages.0'); () for nodes outside modules."""
    return tuple(node_name.strip("/").split("/")[:-1]) if node_name.startswith("/") else ()


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


def forward_blocks(training_model: str, batch: int) -> list[dict]:
    """[{"block", "nodes": [(op, first output, bytes, kept)], "saved_bytes"}] in execution
    order; a node's bytes are those backward keeps of its outputs, or all of them if none."""
    model, _ = without_identities(load_graph(training_model))
    shapes = runtime_shapes(model, batch)
    fwd = analyse(model)
    paths = {module_path(n.name) for n in fwd.nodes}  # forward only: no "..._Grad" paths
    containers = {p[:i] for p in paths for i in range(1, len(p))}
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


def _colour(saved_bytes: int, most: int) -> str:
    if not saved_bytes:
        return "#ffffff"
    t = 0.25 + 0.75 * np.sqrt(saved_bytes / max(1, most))  # light to deep orange
    r, g, b = (np.array([255, 235, 205]) * (1 - t) + np.array([200, 70, 20]) * t).astype(int)
    return f"#{r:02x}{g:02x}{b:02x}"


def _mib(n: int) -> str:
    return f"{n / 2**20:.2f} MiB" if n >= 2**20 else f"{n / 1024:.1f} KiB"


def write_graph_svg(training_model: str, batch: int, out: Path) -> Path:
    blocks = forward_blocks(training_model, batch)
    total = sum(b["saved_bytes"] for b in blocks)
    most = max((s for b in blocks for *_, s, keep in b["nodes"] if keep), default=1)
    parts, y = [], 56
    for b in blocks:
        rows = -(-len(b["nodes"]) // PER_ROW)
        height = 30 + rows * (SQUARE + 4)
        parts.append(f'<g class="block" data-block="{escape(b["block"])}" '
                     f'data-saved-bytes="{b["saved_bytes"]}">'
                     f'<rect x="10" y="{y}" width="{WIDTH - 20}" height="{height}" rx="6" '
                     f'fill="#f6f6f6" stroke="#999"/>'
                     f'<text x="20" y="{y + 18}" font-size="13">{escape(b["block"])}: '
                     f'{_mib(b["saved_bytes"])} kept for backward, {len(b["nodes"])} '
                     f'node{"s" if len(b["nodes"]) != 1 else ""}</text>')
        for k, (op, name, size, keep) in enumerate(b["nodes"]):
            cx = 20 + (k % PER_ROW) * (SQUARE + 2)
            cy = y + 26 + (k // PER_ROW) * (SQUARE + 4)
            tip = f"{op} -> {name}: {_mib(size)}, {'kept for backward' if keep else 'freed'}"
            parts.append(f'<rect class="node" x="{cx}" y="{cy}" width="{SQUARE}" '
                         f'height="{SQUARE}" fill="{_colour(size if keep else 0, most)}" '
                         f'stroke="#555" stroke-width="0.5"><title>{escape(tip)}</title></rect>')
        parts.append("</g>")
        y += height + BOX_GAP
        parts.append(f'<line x1="{WIDTH / 2}" y1="{y - BOX_GAP}" x2="{WIDTH / 2}" y2="{y}" '
                     'stroke="#666" marker-end="url(#arrow)"/>')
    svg = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{y}" '
           f'viewBox="0 0 {WIDTH} {y}" data-saved-bytes="{total}" font-family="sans-serif">'
           '<defs><marker id="arrow" markerWidth="8" markerHeight="8" refX="4" refY="4" '
           'orient="auto"><path d="M0,0 L8,4 L0,8 z" fill="#666"/></marker></defs>'
           f'<text x="10" y="24" font-size="16">Forward graph at batch {batch}, by block: '
           f'{_mib(total)} kept for backward</text><text x="10" y="44" font-size="11" '
           'fill="#555">colour: bytes of a node\'s output kept for backward (white: freed '
           'after forward); hover a square for its operator and bytes</text>'
           + "".join(parts[:-1]) + "</svg>")  # no arrow after the last block
    path = out / "graph.svg"
    path.write_text(svg)
    return path
