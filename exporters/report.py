"""Pictures of a training step's memory (host side, matplotlib).

* timeline: bytes over the step's execution order, stacked by category. State parts are
  measured; activations are the prediction's own (its plan, threads and Shape-node order):
  the memory-pattern block ORT allocates whole, and the arena space the run-time
  allocations outside it take (lines show what of each is live after every node), so the
  stack's top is the predicted peak, beside the measured peak and the budget. Forward and
  backward are marked.
* graph: the forward part of the training graph, in the spirit of an autograd graph. Each
  node is annotated with the bytes of its output. Outputs that backward needs are *saved*
  (kept alive until their gradient is computed); the others are freed once consumed.
  Recomputed tensors get their own colour once recompute plans exist.
"""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from exporters.graph import load_graph, without_identities  # noqa: E402
from edgetrain.budget import arena_rounded  # noqa: E402
from exporters.predictor import activation_plans, known_shapes  # noqa: E402
from exporters.predictor.shapes import runtime_shapes  # noqa: E402
from exporters.recompute import analyse  # noqa: E402

COLORS = {"parameters": "#4c72b0", "gradients": "#dd8452", "optimizer_state": "#55a868",
          "activations": "#c44e52", "other": "#8172b3"}


def _mib(n: float) -> str:
    return f"{n / 2**20:.2f} MiB" if n >= 2**20 else f"{n / 1024:.1f} KiB"


def plot_timeline(training_model: str, batch: int, state: dict, measured_peak: int,
                  budget_bytes: int | None, out: Path, *, eval_model: str, threads: int
                  ) -> Path:
    """state: the measured bytes of parameters, gradients, optimizer_state and other (flat
    bands). Activations are the prediction's (eval_model and threads as it uses them): the
    memory-pattern block and the arena space of the run-time allocations, flat bands as ORT
    holds them, with lines for what is live. Forward and backward are marked."""
    plan, acts = max(activation_plans(training_model, batch, threads,
                                      known_shapes(eval_model, batch)), key=lambda pa: pa[1])
    block = arena_rounded(plan.pattern_bytes)
    n = len(plan.timeline)
    x = np.arange(n)
    runtime = np.zeros(n)
    for _, size, first, last in plan.dynamic:
        runtime[first:last + 1] += size
    keys = ("parameters", "gradients", "optimizer_state", "other")
    bands = [np.full(n, state[k], dtype=float) for k in keys]
    bands += [np.full(n, block, dtype=float), np.full(n, acts - block, dtype=float)]
    top_bytes = max(measured_peak, budget_bytes or 0, sum(state[k] for k in keys) + acts)
    labels = [f"{k.replace('_', ' ')} {_mib(state[k])}"
              + (" (a hairline at this scale)" if state[k] < top_bytes / 200 else "")
              for k in keys]
    labels += [f"activations: memory-pattern block {_mib(block)} (predicted)",
               f"activations: run-time allocations' arena space {_mib(acts - block)} "
               f"(predicted; at most {_mib(runtime.max())} live at once)"]
    colors = [COLORS[k] for k in keys] + [COLORS["activations"], "#e8a0a2"]
    fig, ax = plt.subplots(figsize=(10, 6.5))
    ax.stackplot(x, [b / 2**20 for b in bands], labels=labels, colors=colors, alpha=0.9)
    base = sum(state[k] for k in keys)
    ax.plot(x, (base + np.asarray(plan.timeline)) / 2**20, color="black", lw=0.8,
            label="of the block, live after each node")
    ax.plot(x, (base + block + runtime) / 2**20, color="#8c2d2f", lw=0.8,
            label="run-time allocations live after each node")
    ax.axhline(measured_peak / 2**20, color="black", ls="--", lw=1.2,
               label=f"measured peak {_mib(measured_peak)} (allocator)")
    if budget_bytes:
        ax.axhline(budget_bytes / 2**20, color="red", lw=1.5,
                   label=f"budget {_mib(budget_bytes)}")
    backward = next((i for i, name in enumerate(plan.order) if "_Grad" in name), None)
    top = top_bytes / 2**20
    if backward is not None:
        ax.axvline(backward, color="0.3", lw=1, ls=":")
        ax.text(backward / 2, top * 1.02, "forward", ha="center", fontsize=9)
        ax.text((backward + n) / 2, top * 1.02, "backward (then the optimizer step)",
                ha="center", fontsize=9)
    ax.set_ylim(0, top * 1.1)
    ax.set_xlabel("node of the training step, in ORT's execution order")
    ax.set_ylabel("MiB")
    ax.set_title(f"Training step memory at batch {batch} (the stack's top: the predicted peak)")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=2, fontsize=8)
    ax.set_xlim(0, max(1, n - 1))
    fig.tight_layout()
    path = out / "timeline.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_graph(training_model: str, batch: int, out: Path, max_nodes: int = 400) -> Path:
    model, _ = without_identities(load_graph(training_model))
    shapes = runtime_shapes(model, batch)
    fwd = analyse(model)  # forward nodes that depend on the data, and what backward reads
    nodes = fwd.nodes[:max_nodes]
    forward = list(range(len(nodes)))
    producer = {o: i for i in forward for o in nodes[i].output}
    depth: dict[int, int] = {}
    for i in forward:  # forward is in execution order, so producers come first
        ups = [depth[producer[x]] for x in nodes[i].input if x in producer]
        depth[i] = 1 + max(ups, default=-1)
    levels: dict[int, list[int]] = {}
    for i in forward:
        levels.setdefault(depth[i], []).append(i)
    pos = {i: (k - (len(v) - 1) / 2, -d) for d, v in levels.items() for k, i in enumerate(v)}
    height = max(4.0, 0.32 * len(levels))
    fig, ax = plt.subplots(figsize=(9, height))
    for i in forward:
        for x in nodes[i].input:
            if x in producer:
                (x0, y0), (x1, y1) = pos[producer[x]], pos[i]
                ax.plot([x0, x1], [y0, y1], color="#999999", lw=0.6, zorder=1)
    saved_total = 0
    for i in forward:
        out_name = nodes[i].output[0]
        size = int(np.prod(shapes[out_name][0])) * shapes[out_name][1] if out_name in shapes else 0
        saved = out_name in fwd.saved
        saved_total += size if saved else 0
        color = "#dd8452" if saved else "#dddddd"
        ax.scatter(*pos[i], s=60, color=color, edgecolors="black", linewidths=0.4, zorder=2)
        ax.annotate(f"{nodes[i].op_type} {_mib(size)}", pos[i], xytext=(6, -3),
                    textcoords="offset points", fontsize=6)
    ax.scatter([], [], color="#dd8452", edgecolors="black", label="saved for backward")
    ax.scatter([], [], color="#dddddd", edgecolors="black", label="freed after forward")
    ax.set_title(f"Forward graph at batch {batch}: {_mib(saved_total)} saved for backward")
    ax.legend(loc="upper right", fontsize=8)
    ax.axis("off")
    fig.tight_layout()
    path = out / "graph.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


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
