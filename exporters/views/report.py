"""Pictures of a training step's memory (host side, matplotlib), one activations figure in all.

* timeline.png: what is live over the step, stacked: the measured parameters, gradients,
  optimizer state and other bytes, then the activations live after each node in ORT's
  execution order (the prediction's plan), beside the measured peak and the budget; forward
  and backward marked.
* graph.png: where the activations go, a bar per block of the network and per remaining part,
  in proportion to bytes with its share; graph.svg (exporters/views/graphview.py) is the same split
  with every forward node under its block.
Every picture splits the same figure, `measure`'s activations, into the parts of
exporters/views/activationparts.py, and says so in a caption; each PNG carries the figure and its
parts as text (`Description`), so a test checks that they sum.
"""
from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from exporters.views.activationparts import ActivationParts  # noqa: E402

COLORS = {"parameters": "#4c72b0", "gradients": "#dd8452", "optimizer_state": "#55a868",
          "activations": "#c44e52", "other": "#8172b3"}


def _mib(n: float) -> str:
    return f"{n / 2**20:.2f} MiB" if abs(n) >= 2**20 else f"{n / 1024:.1f} KiB"


def _save(fig, path: Path, parts: ActivationParts) -> Path:
    """Save a picture with its activations figure and parts as PNG text (what a test reads)."""
    meta = {"activations_bytes": parts.total_bytes, "parts": parts.rows()}
    fig.savefig(path, dpi=120, metadata={"Description": json.dumps(meta)})
    plt.close(fig)
    return path


def plot_timeline(parts: ActivationParts, state: dict, measured_peak: int,
                  budget_bytes: int | None, out: Path, batch: int) -> Path:
    """What is live over the step, stacked: the measured parameters, gradients, optimizer
    state and other bytes (flat), then the activations live after each node in ORT's order
    (the prediction's plan: pattern buffers and run-time allocations). The caption splits
    `measure`'s activations figure into the parts every picture shows."""
    plan = parts.plan
    n = len(plan.timeline)
    x = np.arange(n)
    runtime = np.zeros(n)
    for _, size, first, last in plan.dynamic:
        runtime[first:last + 1] += size
    live = np.asarray(plan.timeline, dtype=float) + runtime
    keys = ("parameters", "gradients", "optimizer_state", "other")
    bands = [np.full(n, state[k], dtype=float) for k in keys] + [live]
    labels = [f"{k.replace('_', ' ')} {_mib(state[k])} (measured)" for k in keys]
    labels.append(f"activations live after each node (predicted; most {_mib(live.max())})")
    colors = [COLORS[k] for k in keys] + [COLORS["activations"]]
    fig, ax = plt.subplots(figsize=(10, 6.5))
    ax.stackplot(x, [b / 2**20 for b in bands], labels=labels, colors=colors, alpha=0.9)
    ax.axhline(measured_peak / 2**20, color="black", ls="--", lw=1.2,
               label=f"measured peak {_mib(measured_peak)} (allocator)")
    if budget_bytes:
        ax.axhline(budget_bytes / 2**20, color="red", lw=1.5,
                   label=f"budget {_mib(budget_bytes)}")
    top = max(measured_peak, budget_bytes or 0, sum(state[k] for k in keys) + live.max())
    backward = next((i for i, name in enumerate(plan.order) if "_Grad" in name), None)
    if backward is not None:
        ax.axvline(backward, color="0.3", lw=1, ls=":")
        ax.text(backward / 2, top / 2**20 * 1.02, "forward", ha="center", fontsize=9)
        ax.text((backward + n) / 2, top / 2**20 * 1.02, "backward, then the optimizer step",
                ha="center", fontsize=9)
    ax.set_ylim(0, top / 2**20 * 1.1)
    ax.set_xlim(0, max(1, n - 1))
    ax.set_xlabel("node of the training step, in ORT's execution order")
    ax.set_ylabel("MiB")
    ax.set_title(f"What is live during a training step at batch {batch}")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=2, fontsize=8)
    fig.text(0.01, 0.01, parts.sentence(), fontsize=7.5, wrap=True)
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    return _save(fig, out / "timeline.png", parts)


def plot_graph(parts: ActivationParts, out: Path, batch: int) -> Path:
    """Where the activations go, one bar per part in proportion to its bytes (the blocks of
    the network at the step's fullest moment, then the rest), each with its share."""
    rows = parts.rows()
    total = parts.total_bytes
    fig, ax = plt.subplots(figsize=(9, max(3.0, 0.34 * len(rows) + 1.5)))
    y = np.arange(len(rows))[::-1]
    values = [v / 2**20 for _, v in rows]
    colours = [COLORS["activations"] if i < len(parts.blocks) else "#8c8c8c"
               for i in range(len(rows))]
    ax.barh(y, values, color=colours)
    for yi, (label, v) in zip(y, rows):
        ax.text(max(v, 0) / 2**20, yi, f"  {_mib(v)}, {100 * v / max(1, total):.1f}%",
                va="center", fontsize=8)
    ax.set_yticks(y, [label for label, _ in rows], fontsize=8)
    ax.set_xlabel("MiB")
    ax.set_xlim(min(0, min(values)) * 1.1, max(values + [0]) * 1.35 + 1e-9)
    source = "measured" if parts.measured_bytes is not None else "predicted"
    ax.set_title(f"Where a step's activations go at batch {batch}: {_mib(total)} ({source})\n"
                 "red: the network's blocks at the step's fullest moment; grey: the rest",
                 fontsize=10)
    fig.tight_layout()
    return _save(fig, out / "graph.png", parts)


def plot_frontier(result: dict, path: str | Path) -> Path:
    """A plan search (device_sim/planner.PlanResult.to_dict()): each micro-batch's predicted
    peak against its step time (predicted; measured where a capped run confirmed it), the
    budget as a line, the chosen plan ringed."""
    fig, ax = plt.subplots(figsize=(8, 5))
    cands = result["candidates"]
    claimed = [c for c in cands if c["predicted_peak_bytes"] is not None]
    ax.scatter([c["predicted_step_time_s"] for c in claimed],
               [c["predicted_peak_bytes"] / 2**20 for c in claimed], s=18, color="0.6",
               label="predicted (peak, step time)")
    for state, colour in (("fits", "#55a868"), ("over budget", "#c44e52")):
        ran = [c for c in cands if c["confirmed"] == state and c["measured_peak_bytes"]]
        ax.scatter([c["measured_step_time_s"] or c["predicted_step_time_s"] for c in ran],
                   [c["measured_peak_bytes"] / 2**20 for c in ran], s=40, color=colour,
                   label=f"capped run: {state} (measured)")
    for c in claimed:
        ax.annotate(str(c["micro_batch"]), (c["predicted_step_time_s"],
                                            c["predicted_peak_bytes"] / 2**20), fontsize=7,
                    xytext=(3, 3), textcoords="offset points")
    ax.axhline(result["budget_bytes"] / 2**20, color="red", lw=1.2,
               label=f"budget {_mib(result['budget_bytes'])}")
    chosen = result["chosen"]
    if chosen:
        ax.scatter([chosen["measured_step_time_s"]], [chosen["measured_peak_bytes"] / 2**20],
                   s=160, facecolors="none", edgecolors="black", lw=1.5,
                   label=f"plan: micro-batch {chosen['micro_batch']} x "
                         f"{chosen['accumulation_steps']}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(f"step time on this machine, s ({result['effective_batch']} items a step)")
    ax.set_ylabel("peak, MiB")
    ax.set_title("Plans: peak against step time (numbers: micro-batch)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return Path(path)
