"""The forward graph grouped by block, as an SVG a browser opens and zooms (host side).

One box per block of the network, in execution order. A block is a numbered child module
that holds modules of its own (`blocks.3`, `stages.0.1`: the repeated units of a network),
or a top-level module (`stem`, `classifier`); nodes outside any module (the pooling and the loss the
exporter adds) form "(top level)". Inside a box, each forward node is a square, coloured by
the bytes of its output that backward keeps (white: freed after forward). Hovering a square
shows its operator, output and bytes.

Each box is labelled with its share of the predicted activations (the breakdown's
category): the memory-pattern buffers live at the step's fullest moment, by the block of the
node that wrote the tensor each holds at that moment (a forward output backward still
needs, or a backward temporary such as a gradient being summed). Two rows below the boxes hold the rest: the pattern
block's space that is never live all at once (ORT places buffers once for the whole step),
and the run-time allocations outside the pattern. The labels sum to the breakdown's
activations; the title gives that sum.
"""
from __future__ import annotations

from html import escape
from pathlib import Path

import numpy as np

from edgetrain.budget import arena_rounded
from exporters.graph import load_graph, without_identities
from exporters.predictor import activation_plans, known_shapes
from exporters.predictor.ortgraph import optimized_graph
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


def activation_shares(training_model: str, forward, eval_model: str, batch: int, threads: int
                      ) -> tuple[dict[str, dict[str, int]], dict[str, int]]:
    """The predicted activations split into parts that sum to them: per block
    {"forward": bytes, "backward": bytes} live at the pattern's fullest moment, and
    {"pattern never live at once": ..., "run-time allocations": ...}. Uses the prediction's
    own plan (the Shape-node order it claims), so the sum is its breakdown's activations.
    forward: forward_graph(training_model)."""
    plan, acts = max(activation_plans(training_model, batch, threads,
                                      known_shapes(eval_model, batch)), key=lambda pa: pa[1])
    graph = optimized_graph(training_model)
    producer = {o: n.name for n in graph.graph.node for o in n.output if o}
    _, fwd, containers = forward
    outputs = {o for n in fwd.nodes for o in n.output}
    shares: dict[str, dict[str, int]] = {}
    for tensor, size in plan.peak_buffers:
        name = producer.get(tensor, "").removeprefix("AccumulateGrad_")
        part = shares.setdefault(block_of(name, containers), {"forward": 0, "backward": 0})
        part["forward" if tensor in outputs else "backward"] += size
    rest = {"pattern never live at once": arena_rounded(plan.pattern_bytes) - plan.live_peak_bytes,
            "run-time allocations": acts - arena_rounded(plan.pattern_bytes)}
    return shares, rest


def _colour(saved_bytes: int, most: int) -> str:
    if not saved_bytes:
        return "#ffffff"
    t = 0.25 + 0.75 * np.sqrt(saved_bytes / max(1, most))  # light to deep orange
    r, g, b = (np.array([255, 235, 205]) * (1 - t) + np.array([200, 70, 20]) * t).astype(int)
    return f"#{r:02x}{g:02x}{b:02x}"


def _mib(n: int) -> str:
    return f"{n / 2**20:.2f} MiB" if n >= 2**20 else f"{n / 1024:.1f} KiB"


def write_graph_svg(training_model: str, batch: int, out: Path, *, eval_model: str,
                    threads: int) -> Path:
    """graph.svg in `out` for the training graph at `batch`; eval_model and threads as the
    prediction uses them (the artifact's eval graph, the runtime's intra-op threads)."""
    forward = forward_graph(training_model)
    blocks = forward_blocks(forward, batch)
    shares, rest = activation_shares(training_model, forward, eval_model, batch, threads)
    for name in shares.keys() - {b["block"] for b in blocks}:  # only backward nodes: a box too
        blocks.append({"block": name, "nodes": [], "saved_bytes": 0})
    total = sum(sum(v.values()) for v in shares.values()) + sum(rest.values())
    most = max((s for b in blocks for *_, s, keep in b["nodes"] if keep), default=1)
    parts, y = [], 56
    for b in blocks:
        share = shares.get(b["block"], {"forward": 0, "backward": 0})
        rows = max(1, -(-len(b["nodes"]) // PER_ROW))
        height = 30 + rows * (SQUARE + 4)
        parts.append(f'<g class="block" data-block="{escape(b["block"])}" '
                     f'data-saved-bytes="{b["saved_bytes"]}" '
                     f'data-activation-bytes="{sum(share.values())}">'
                     f'<rect x="10" y="{y}" width="{WIDTH - 20}" height="{height}" rx="6" '
                     f'fill="#f6f6f6" stroke="#999"/>'
                     f'<text x="20" y="{y + 18}" font-size="13">{escape(b["block"])}: '
                     f'{_mib(sum(share.values()))} of the activations at the peak '
                     f'({_mib(share["forward"])} forward outputs, {_mib(share["backward"])} '
                     f'backward temporaries); {len(b["nodes"])} forward '
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
    parts.pop()  # no arrow after the last block
    for what, nbytes in rest.items():
        parts.append(f'<g class="rest" data-what="{escape(what)}" data-activation-bytes='
                     f'"{nbytes}"><text x="20" y="{y + 4}" font-size="13">{escape(what)}: '
                     f'{_mib(nbytes)} of the activations</text></g>')
        y += 22
    svg = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{y + 10}" '
           f'viewBox="0 0 {WIDTH} {y + 10}" data-activation-bytes="{total}" '
           f'data-saved-bytes="{sum(b["saved_bytes"] for b in blocks)}" '
           'font-family="sans-serif">'
           '<defs><marker id="arrow" markerWidth="8" markerHeight="8" refX="4" refY="4" '
           'orient="auto"><path d="M0,0 L8,4 L0,8 z" fill="#666"/></marker></defs>'
           f'<text x="10" y="24" font-size="16">Training step at batch {batch}, by block: '
           f'{_mib(total)} of activations (predicted, {threads} threads); each box says its '
           'share</text><text x="10" y="44" font-size="11" fill="#555">squares: forward '
           'nodes, coloured by the bytes of their output kept for backward (white: freed '
           'after forward); hover a square for its operator and bytes</text>'
           + "".join(parts) + "</svg>")
    path = out / "graph.svg"
    path.write_text(svg)
    return path
