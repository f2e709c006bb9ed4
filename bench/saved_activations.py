"""What holding the saved activations in 8 bits buys, measured: the peak and its breakdown.

    .venv/bin/python bench/saved_activations.py            # ~10 min on 2 cores
    .venv/bin/python bench/saved_activations.py --report   # the table from saved results
    .venv/bin/python bench/saved_activations.py --peaks    # what holds the 8-bit step's bytes

For each network of NETWORKS (population model of held-out user 10, as bench/update_plans.py)
and each update plan of PLANS, at micro-batch 8 and 2 threads: exported with
`--saved-activations fp32` and `int8`, then `edgetrain measure` (the personalisation cycle,
selection included). The activations column is the allocator's; "predicted" is the static
predictor's error on the peak. Results: bench/results/saved_activations.json; the table in
docs/update-plans.md (block `saved-activations`).

--peaks: for PEAK_ROWS, exported untrained with `--saved-activations int8` at micro-batch 8
(the weights' values change no byte), what holds
the step's activation bytes at its fullest moment, from the predictor's plan of the step (a
prediction, beside the allocator's activations): the 8-bit copies, the floats rebuilt from
them for backward, the other forward tensors kept, the weights the graph rebuilds each step
(a trained weight with BatchNorm folded in), backward's gradients in flight, the pattern's
space never live at once, and the run-time allocations outside the pattern (a weight
gradient before it is summed, MLAS and ConvGrad buffers). Results:
bench/results/saved_activations_peaks.json; the table in docs/update-plans.md (block
`saved-activations-peaks`).
"""
from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from common import ROOT, load_results, replace_table, run, save_results, stamp

NETWORKS = ("imu_cnn", "imu_transformer", "patch_mobilenet")
PLANS = ("all", "bias", "bias-only")
BATCHES = (8, 32)
PEAK_ROWS = (("imu_cnn", "all"), ("imu_cnn", "bias"), ("patch_mobilenet", "all"),
             ("patch_mobilenet", "bias"))
PEAK_PARTS = ("8-bit copies", "floats rebuilt from them", "other forward tensors kept",
              "weights rebuilt in the graph", "gradients in flight", "pattern never live at once",
              "run-time allocations")
DOC = ROOT / "docs" / "update-plans.md"


def measure(tmp: Path, model: str, update: str, saved: str, batch: int, *extra: str) -> dict:
    out = tmp / f"{model}-{update}-{saved}-{batch}"
    m = json.loads(run("export", "--model", model, "--update", update, "--micro-batch",
                       str(batch), "--threads", "2", "--saved-activations", saved, "--out",
                       str(out), *extra, "--json"))
    meas = json.loads(run("measure", str(out), "--batch", str(batch), "--threads", "2",
                          "--json"))
    return {"model": model, "update": update, "saved_activations": saved, "batch": batch,
            "rounded_tensors": m["provenance"].get("passes", {}).get("int8_saved_activations",
                                                                      0),
            "predicted_peak_bytes": meas["predicted_peak_bytes"],
            "predicted_complete": meas["predicted_complete"], "peak_bytes": meas["peak_bytes"],
            "breakdown": meas["breakdown"]}


def main() -> None:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for model in NETWORKS:
            for update in PLANS:
                for batch in BATCHES:
                    for saved in ("fp32", "int8"):
                        rows.append(measure(Path(tmp), model, update, saved, batch))
                        print(json.dumps({k: rows[-1][k] for k in (
                            "model", "update", "batch", "saved_activations", "peak_bytes")}),
                            flush=True)
    save_results("saved_activations", [{**stamp(), "rows": rows}])
    report()


def report() -> None:
    saved = load_results("saved_activations")[0]
    rows = saved["rows"]
    lines = [f"Measured at commit `{saved['commit']}`, {saved['date']}, {saved['machine']}; "
             "`bench/saved_activations.py` (2 threads).", "",
             "| network | plan | micro-batch | saved activations | tensors in 8 bits | "
             "measured peak | predicted | activations | × fewer activation bytes |",
             "|---|---|---:|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        base = next(a for a in rows if a["saved_activations"] == "fp32" and all(
            a[k] == r[k] for k in ("model", "update", "batch")))
        act = r["breakdown"]["activations"]
        pred = (f"{100 * (r['predicted_peak_bytes'] / r['peak_bytes'] - 1):+.1f}%"
                if r["predicted_complete"] else "no claim")
        lines.append(f"| {r['model']} | `{r['update']}` | {r['batch']} | "
                     f"{r['saved_activations']} | {r['rounded_tensors']} | "
                     f"{r['peak_bytes']:,} | {pred} | {act:,} | "
                     f"{base['breakdown']['activations'] / act:.2f}× |")
    replace_table(DOC, lines, "saved-activations")
    print("\n".join(lines))


def peak_parts(art: Path, batch: int) -> dict:
    """PEAK_PARTS of the step's activations at its fullest moment (the predictor's plan)."""
    from edgetrain import names
    from exporters.graph import is_backward
    from exporters.predictor import claimed_plan
    from exporters.predictor.ortgraph import node_arg_shapes, optimized_graph

    train, evalm = str(art / "training_model.onnx"), str(art / "eval_model.onnx")
    plan, acts = claimed_plan(train, evalm, batch, 2)
    graph = optimized_graph(train)
    backward = {o for n in graph.graph.node if is_backward(n) for o in n.output}
    dims = node_arg_shapes(graph)
    parts = dict.fromkeys(PEAK_PARTS, 0)
    for tensor, size in plan.peak_buffers:
        first = (dims.get(tensor, (None, 0))[0] or (None,))[0]
        # the pass's PassThrough aliases name the buffer they alias (int8saved.py): `_gate`
        # a gradient, `_ready`/`_reader`/`_after` a float forward tensor, the rest the copy
        alias = names.SAVED_INT8_SUFFIX in tensor and tensor.rsplit("_", 1)[-1]
        part = ("floats rebuilt from them" if alias == "dequantized" else
                "gradients in flight" if alias == "gate" else
                "other forward tensors kept" if alias in ("ready", "reader", "after") else
                "8-bit copies" if alias else
                "gradients in flight" if tensor in backward else
                "other forward tensors kept" if isinstance(first, str) else
                "weights rebuilt in the graph")
        parts[part] += size
    parts["pattern never live at once"] = plan.pattern_bytes - plan.live_peak_bytes
    parts["run-time allocations"] = acts - plan.pattern_bytes
    return parts


def peaks() -> None:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for model, update in PEAK_ROWS:
            row = measure(Path(tmp), model, update, "int8", 8, "--epochs", "0")  # untrained:
            # the weights' values change no byte
            row["parts"] = peak_parts(Path(tmp) / f"{model}-{update}-int8-8", 8)
            rows.append(row)
            print(json.dumps({k: row[k] for k in ("model", "update", "parts")}), flush=True)
    save_results("saved_activations_peaks", [{**stamp(), "rows": rows}])
    peaks_report()


def peaks_report() -> None:
    saved = load_results("saved_activations_peaks")[0]
    rows = saved["rows"]
    lines = [f"Measured at commit `{saved['commit']}`, {saved['date']}, {saved['machine']}; "
             "`bench/saved_activations.py --peaks` (micro-batch 8, 2 threads; the parts are "
             "the predictor's plan of the step at its fullest moment, a prediction).", "",
             "| network | plan | " + " | ".join(PEAK_PARTS) + " | predicted step | measured "
             "activations (cycle) |", "|---|---|" + "---:|" * (len(PEAK_PARTS) + 2)]
    for r in rows:
        p = r["parts"]
        lines.append(f"| {r['model']} | `{r['update']}` | "
                     + " | ".join(f"{p[k]:,}" for k in PEAK_PARTS)
                     + f" | {sum(p.values()):,} | {r['breakdown']['activations']:,} |")
    replace_table(DOC, lines, "saved-activations-peaks")
    print("\n".join(lines))


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--report", action="store_true")
    ap.add_argument("--peaks", action="store_true")
    args = ap.parse_args()
    if args.peaks:
        peaks_report() if args.report else peaks()
    else:
        report() if args.report else main()
