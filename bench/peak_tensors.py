"""What the `bias` plan holds at its fullest moment, tensor by tensor, and what bounds any plan.

    .venv/bin/python bench/peak_tensors.py            # ~2 min on 2 cores
    .venv/bin/python bench/peak_tensors.py --report   # the tables from saved results

The patch MobileNet at micro-batch 8 and 2 threads (exported untrained: the weights' values
change no byte), every plan of PLANS: `edgetrain export --update U --saved-activations S
--recompute R`, then `edgetrain measure` (the personalisation cycle, selection included; the
allocator's peak). For the LISTED rows, the buffers live at the training step's fullest
moment, one row a tensor, from the predictor's plan of the step (a prediction, beside the
measured activations), each with the node that wrote it, the backward nodes that read it and
why it is held.
Per-channel tensors under TENSOR_ROW_BYTES are summed by reason. `head` trains the last layer
alone, so backward reaches no convolution: its peak is what every plan holds (the parameters,
the forward and eval passes), the floor of the table's ratios. Results:
bench/results/peak_tensors.json; the tables in docs/update-plans.md (blocks `peak-tensors`,
`peak-tensors-plans`).
"""
from __future__ import annotations

import json
import tempfile
from pathlib import Path

from common import ROOT, measure_or_report, measured_at, replace_table, run

MODEL, BATCH, THREADS = "patch_mobilenet", 8, 2
# (update plan, saved activations, recompute plan)
PLANS = (("all", "fp32", "none"), ("head", "fp32", "none"), ("bias-only", "fp32", "none"),
         ("bias", "fp32", "none"), ("bias", "int8", "none"), ("bias", "fp32", "sqrt"))
LISTED = (("bias", "fp32", "none"), ("bias", "int8", "none"))  # tensors listed
TENSOR_ROW_BYTES = 8192  # smaller tensors are summed by reason
TARGET_RATIO = 5.0  # the update-plans issue's bar: bias's peak 5x below all's
DOC = ROOT / "docs" / "update-plans.md"
KEPT_INPUTS = ("norm input", "int8")  # every 8-bit copy here is a convolution's output

NORM_INPUT = ("a convolution's output, its BatchNorm's input: the norm scale's gradient "
              "sum(dY * x_hat) reads it in backward")
REASONS = {
    "mask": "a ReLU mask kept from forward, 1 byte an element (relu_grads): its gradient "
            "multiplies by it",
    "int8": "an 8-bit copy of a saved tensor (int8_saved_activations), rebuilt in float when "
            "backward reaches it",
    "norm input": NORM_INPUT,
    "gradient": "a gradient in flight: backward's working tensor",
    "forward": "a forward tensor backward reads",
}


def tensor_rows(art: Path) -> tuple[list[dict], dict]:
    """The buffers live at the step's fullest moment (the predictor's plan), one dict a
    tensor, and the plan's other parts of the step's activations."""
    from edgetrain import names
    from exporters.graph import is_backward
    from exporters.predictor import claimed_plan
    from exporters.predictor.ortgraph import node_arg_shapes, optimized_graph

    train, evalm = str(art / "training_model.onnx"), str(art / "eval_model.onnx")
    plan, acts = claimed_plan(train, evalm, BATCH, THREADS)
    graph = optimized_graph(train)
    producer = {o: n for n in graph.graph.node for o in n.output if o}
    readers: dict[str, list] = {}
    for n in graph.graph.node:
        for i in n.input:
            readers.setdefault(i, []).append(n)
    dims = node_arg_shapes(graph)
    rows = []
    for tensor, size in plan.peak_buffers:
        node = producer.get(tensor)
        backward = node is not None and is_backward(node)
        late = sorted({r.op_type for r in readers.get(tensor, []) if is_backward(r)})
        reason = ("mask" if names.RELU_MASK_SUFFIX in tensor else
                  "int8" if names.SAVED_INT8_SUFFIX in tensor else
                  "gradient" if backward else
                  "norm input" if node is not None and node.op_type == "Conv" and late else
                  "forward")
        rows.append({"tensor": tensor, "bytes": size, "shape": list(dims.get(tensor, ((),))[0]),
                     "written_by": node.op_type if node is not None else "",
                     "read_in_backward_by": late, "reason": reason})
    rows.sort(key=lambda r: -r["bytes"])
    other = {"pattern never live at once": plan.pattern_bytes - plan.live_peak_bytes,
             "run-time allocations": acts - plan.pattern_bytes}
    return rows, other


def measure() -> list[dict]:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for update, saved, recompute in PLANS:
            art = Path(tmp) / f"{update}-{saved}-{recompute}"
            exp = json.loads(run("export", "--model", MODEL, "--update", update, "--epochs", "0",
                                 "--micro-batch", str(BATCH), "--threads", str(THREADS),
                                 "--saved-activations", saved, "--recompute", recompute,
                                 "--out", str(art), "--json"))
            meas = json.loads(run("measure", str(art), "--batch", str(BATCH), "--threads",
                                  str(THREADS), "--json"))
            row = {"update": update, "saved_activations": saved, "recompute": recompute,
                   "peak_bytes": meas["peak_bytes"], "breakdown": meas["breakdown"],
                   "predicted_peak_bytes": exp["predicted"]["peak_bytes"]}
            if (update, saved, recompute) in LISTED:
                row["tensors"], row["other_parts"] = tensor_rows(art)
            rows.append(row)
            print(json.dumps({k: row[k] for k in ("update", "saved_activations", "peak_bytes")}),
                  flush=True)
    return rows


def plans_table(rows: list[dict]) -> list[str]:
    full = next(r for r in rows if r["update"] == "all")["peak_bytes"]
    lines = [f"`all` measured {full:,} bytes; {TARGET_RATIO:g}× below it is "
             f"{full / TARGET_RATIO:,.0f}.", "",
             "| plan | saved activations | recompute | measured peak | × below `all` | "
             "parameters | "
             "gradients + optimizer | activations | BatchNorm inputs kept for backward at the "
             "step's fullest moment, float or 8-bit (predicted) |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        b = r["breakdown"]
        norm = (f"{sum(t['bytes'] for t in r['tensors'] if t['reason'] in KEPT_INPUTS):,}"
                if "tensors" in r else "-")
        lines.append(f"| `{r['update']}` | {r['saved_activations']} | "
                     f"{r.get('recompute', 'none')} | {r['peak_bytes']:,} | "
                     f"{full / r['peak_bytes']:.2f}× | {b['parameters']:,} | "
                     f"{b['gradients'] + b['optimizer_state']:,} | {b['activations']:,} | "
                     f"{norm} |")
    return lines


def tensors_table(rows: list[dict]) -> list[str]:
    lines = ["| plan | tensor (at the step's fullest moment) | shape | bytes | written by | "
             "read in backward by | why it is held |", "|---|---|---|---:|---|---|---|"]
    for r in rows:
        if "tensors" not in r:
            continue
        plan = f"`{r['update']}` {r['saved_activations']}"
        small: dict[str, list[int]] = {}
        for t in r["tensors"]:
            if t["bytes"] < TENSOR_ROW_BYTES:
                small.setdefault(t["reason"], []).append(t["bytes"])
                continue
            lines.append(f"| {plan} | `{t['tensor']}` | {'×'.join(map(str, t['shape']))} | "
                         f"{t['bytes']:,} | {t['written_by']} | "
                         f"{', '.join(t['read_in_backward_by']) or '-'} | "
                         f"{REASONS[t['reason']]} |")
        for reason, sizes in small.items():
            lines.append(f"| {plan} | {len(sizes)} smaller tensors | | {sum(sizes):,} | | | "
                         f"{REASONS[reason]} |")
        for part, size in r["other_parts"].items():
            lines.append(f"| {plan} | {part} | | {size:,} | | | ORT's memory pattern and "
                         "kernels (not a tensor of the graph) |")
        live = sum(t["bytes"] for t in r["tensors"]) + sum(r["other_parts"].values())
        b = r["breakdown"]
        lines.append(f"| {plan} | **the step's activations, predicted** | | **{live:,}** | | | "
                     f"measured over the cycle: {b['activations']:,} |")
    return lines


def report(rows: list[dict]) -> None:
    at = measured_at(["peak_tensors"])
    replace_table(DOC, [at, "", *plans_table(rows)], "peak-tensors-plans")
    replace_table(DOC, [at, "", *tensors_table(rows)], "peak-tensors")
    print("\n".join(plans_table(rows)))


if __name__ == "__main__":
    measure_or_report("peak_tensors", measure, report, __doc__.split("\n")[0])
