"""Static predictor vs the runtime's allocator: the built-in networks and the layer families.

    .venv/bin/python bench/predictor.py              # about 50 minutes on 2 cores
    .venv/bin/python bench/predictor.py --batchnorm  # the statistics-pass table alone

Built-in networks (`edgetrain export --model NAME --epochs 0`: weights do not change memory)
at batch 1, 8, 32; the stack's sparse + recompute rows at their micro-batch (STACK_ROWS,
exported as bench/planner.py exports them); the layer families of tests/wearable_models.py
(exported through the Python API) at batch 4 and 32; the cycle with a BatchNorm statistics
pass first (`measure --adapt bn`): each network with BatchNorm at batch 8 in steps of 1 and 2
micro-batches (the moments graph then), with `--batchnorm-adapt exact`, and each device
tier's shipped plan as personalise runs it (`--adapt auto` at its micro-batch and
accumulation). Each is measured with `edgetrain measure --json` (a fresh torch-free process
per case). Writes bench/results/predictor.json (predictor_batchnorm.json for the last) and the
tables in docs/predictor.md (markers `table`, `stack`, `families`, `batchnorm`).
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from common import ROOT, load_results, replace_table, run, save_results

NETWORKS = ["mobilenet_v1", "patch_mobilenet", "resnet50", "imu_cnn", "imu_transformer"]
BATCHES = [1, 8, 32]
FAMILY_BATCHES = [4, 32]
STACK_ROWS = ("C4", "C5", "C6", "C7")  # sparse weights rebuilt by a recompute plan, batch 1
BATCHNORM_NETWORKS = ["mobilenet_v1", "patch_mobilenet", "resnet50", "imu_cnn"]
EXACT_NETWORKS = ["patch_mobilenet", "imu_cnn"]
BATCHNORM_BATCH = 8


def measured_row(name: str, art: Path, batch: int, *extra: str) -> dict:
    d = json.loads(run("measure", str(art), "--batch", str(batch), "--steps", "2", *extra,
                       "--json"))
    err = (d["predicted_peak_bytes"] - d["peak_bytes"]) / d["peak_bytes"]
    claim = ("complete" if d["predicted_complete"] else
             "range" if "Shape nodes" in d["prediction_caveat"] and
             "operators" not in d["prediction_caveat"] else "none")
    print(f"{name:28s} batch {batch:2d}: measured {d['peak_bytes']:>14,} predicted "
          f"{d['predicted_peak_bytes']:>14,} ({err:+.1%}, {claim})", flush=True)
    return {"model": name, "batch": batch, "peak_bytes": d["peak_bytes"],
            "predicted_peak_bytes": d["predicted_peak_bytes"], "error_ratio": round(err, 4),
            "claim": claim, "caveat": d["prediction_caveat"], "breakdown": d["breakdown"],
            "predicted_breakdown": d["predicted_breakdown"],
            "predicted_activations_range_bytes": d["predicted_activations_range_bytes"],
            "step_time_s": d["step_time_s"]}


def family_artifacts(tmp: Path):
    """(name, artifact folder, batch) for every layer family of the conformance test."""
    import torch

    sys.path.insert(0, str(ROOT / "tests"))
    from wearable_models import CASES, CLASSES

    from edgetrain.manifest import Plan
    from exporters.export import export_artifact

    for name, case in sorted(CASES.items()):
        for batch in FAMILY_BATCHES:
            torch.manual_seed(0)
            art = tmp / f"{name}_{batch}"
            export_artifact(case.build(), torch.zeros(2, *case.sample_shape), art,
                            classes=[str(k) for k in range(CLASSES)],
                            plan=Plan(micro_batch=batch), lr=1e-2, layout=case.layout,
                            freeze_batchnorm=case.freeze_batchnorm)
            yield name, art, batch


def main(only_batchnorm: bool = False) -> None:
    rows, stack, families = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        for net in NETWORKS:
            art = Path(tmp) / net
            if only_batchnorm and net not in BATCHNORM_NETWORKS:
                continue
            run("export", "--model", net, "--epochs", "0", "--no-cache", "--out", str(art))
            rows += [] if only_batchnorm else [measured_row(net, art, b) for b in BATCHES]
        if not only_batchnorm:
            stack = [measured_row(f"{c.name} {c.network} ({c.update})", art, c.micro_batch)
                     for c, art in stack_artifacts(Path(tmp))]
            families = [measured_row(n, a, b) for n, a, b in family_artifacts(Path(tmp))]
        batchnorm = list(batchnorm_rows(Path(tmp)))
    save_results("predictor_batchnorm", batchnorm)
    if not only_batchnorm:
        save_results("predictor", [{**r, "part": part} for part, rs in
                                   (("table", rows), ("stack", stack), ("families", families))
                                   for r in rs])
    report(only_batchnorm)


def report(only_batchnorm: bool = False) -> None:
    """The tables of docs/predictor.md from bench/results/predictor*.json."""
    write_table(load_results("predictor_batchnorm"), "batchnorm", "predictor_batchnorm")
    if only_batchnorm:
        return
    rows = load_results("predictor")
    if any("part" not in r for r in rows):
        raise SystemExit("bench/results/predictor.json is from before its rows named their "
                         "table: run bench/predictor.py again")
    for marker in ("table", "stack", "families"):
        write_table([r for r in rows if r["part"] == marker], marker, "predictor")


def batchnorm_rows(tmp: Path):
    """The cycle with a BatchNorm statistics pass first, measured and predicted."""
    from device_sim.profiles import TIER_PLANS

    b = BATCHNORM_BATCH
    for net in BATCHNORM_NETWORKS:  # exported by main()
        for k in (1, 2):
            yield measured_row(f"{net}, --adapt bn, steps of {k}", tmp / net, b,
                               "--adapt", "bn", "--accumulate", str(k))
    for net in EXACT_NETWORKS:
        art = tmp / f"{net}-exact"
        run("export", "--model", net, "--epochs", "0", "--no-cache", "--batchnorm-adapt",
            "exact", "--out", str(art))
        yield measured_row(f"{net}, --batchnorm-adapt exact", art, b, "--adapt", "bn")
    for tier in TIER_PLANS.values():
        art = tmp / f"tier-{tier.device}"
        run("export", *tier.export_args(), "--epochs", "0", "--no-cache", "--out", str(art))
        yield measured_row(f"{tier.device}: {tier.label}", art, tier.micro_batch, "--adapt",
                           "auto", "--accumulate", str(tier.accumulation))


def stack_artifacts(tmp: Path):
    """(configuration, artifact folder) for the stack rows in STACK_ROWS."""
    from planner import export
    from stack_config import STACK

    for c in (c for c in STACK if c.name in STACK_ROWS):
        yield c, export(tmp / c.name, c.network, c.sparse, c.recompute, c.micro_batch,
                        c.accumulation, c.update)


def write_table(rows: list[dict], marker: str, source: str) -> None:
    lines = ["| model | batch | measured peak | predicted peak | error | claim |",
             "|---|---:|---:|---:|---:|---|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['batch']} | {r['peak_bytes']:,} | "
                     f"{r['predicted_peak_bytes']:,} | {r['error_ratio']:+.1%} | {r['claim']} |")
    replace_table(ROOT / "docs" / "predictor.md", lines, marker, sources=[source])


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batchnorm", action="store_true", help="the statistics-pass table alone")
    ap.add_argument("--report", action="store_true",
                    help="only rebuild the tables from bench/results/predictor*.json")
    a = ap.parse_args()
    report(a.batchnorm) if a.report else main(only_batchnorm=a.batchnorm)
