"""Static predictor vs the runtime's allocator: the built-in networks and the layer families.

    .venv/bin/python bench/predictor.py              # its time: bench/all.py --list
    .venv/bin/python bench/predictor.py --batchnorm  # the statistics-pass table alone
    .venv/bin/python bench/predictor.py --heavy      # ResNet-50's rows alone (bench/heavy.py)

Built-in networks (`edgetrain export --model NAME --epochs 0`: weights do not change memory)
at batch 1, 8, 32; the stack's sparse + recompute rows at their micro-batch (STACK_ROWS,
exported as bench/planner.py exports them); the layer families of tests/wearable_models.py
(exported through the Python API) at batch 4 and 32; the cycle with a BatchNorm statistics
pass first (`measure --adapt bn`): each network with BatchNorm at batch 8 in steps of 1 and 2
micro-batches (the moments graph then), with `--batchnorm-adapt exact`, and each device
tier's shipped plan as personalise runs it (`--adapt auto` at its micro-batch and
accumulation). Each is measured with `edgetrain measure --json` (a fresh torch-free process
per case), two cases at a time: the tables hold bytes only (common.side_by_side). Writes
bench/results/predictor.json (predictor_batchnorm.json for the last) and the
tables in docs/predictor.md (markers `table`, `stack`, `families`, `batchnorm`).
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from common import ROOT, load_results, replace_table, run, save_results, side_by_side
from heavy import HEAVY_HELP, kept_rows, part, why_mixed

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
    claim = "complete" if d["predicted_complete"] else "none"
    print(f"{name:28s} batch {batch:2d}: measured {d['peak_bytes']:>14,} predicted "
          f"{d['predicted_peak_bytes']:>14,} ({err:+.1%}, {claim})", flush=True)
    return {"model": name, "batch": batch, "peak_bytes": d["peak_bytes"],
            "predicted_peak_bytes": d["predicted_peak_bytes"], "error_ratio": round(err, 4),
            "claim": claim, "caveat": d["prediction_caveat"], "breakdown": d["breakdown"],
            "predicted_breakdown": d["predicted_breakdown"],
            "step_time_s": d["step_time_s"]}


def family_artifacts(tmp: Path) -> list[tuple[str, Path, int]]:
    """(name, artifact folder, batch) for every layer family of the conformance test, exported
    here in turn (torch's exporter is not one to run on two threads)."""
    import torch

    sys.path.insert(0, str(ROOT / "tests"))
    from wearable_models import CASES, CLASSES

    from edgetrain.manifest import Plan
    from exporters.export import export_artifact

    out = []
    for name, case in sorted(CASES.items()):
        for batch in FAMILY_BATCHES:
            torch.manual_seed(0)
            art = tmp / f"{name}_{batch}"
            export_artifact(case.build(), torch.zeros(2, *case.sample_shape), art,
                            classes=[str(k) for k in range(CLASSES)],
                            plan=Plan(micro_batch=batch), lr=1e-2, layout=case.layout,
                            freeze_batchnorm=case.freeze_batchnorm)
            out.append((name, art, batch))
    return out


def network_rows(tmp: Path, net: str, only_batchnorm: bool) -> dict[str, list[dict]]:
    """A built-in network exported untrained: its rows of the table (batch 1, 8, 32) and of
    the cycle with a BatchNorm statistics pass first (steps of 1 and 2 micro-batches)."""
    art = tmp / net
    run("export", "--model", net, "--epochs", "0", "--no-cache", "--out", str(art))
    return {"table": [] if only_batchnorm else [measured_row(net, art, b) for b in BATCHES],
            "batchnorm": [measured_row(f"{net}, --adapt bn, steps of {k}", art,
                                       BATCHNORM_BATCH, "--adapt", "bn", "--accumulate", str(k))
                          for k in (1, 2) if net in BATCHNORM_NETWORKS]}


def main(only_batchnorm: bool = False, heavy: bool = False) -> None:
    """This run's part of the cases (bench/heavy.py) exported and measured, two at a time
    (side_by_side: bytes only), the other part's saved rows kept; each job gives its rows by
    table, and each table keeps the order of a run of every case."""
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        nets = [n for n in part(NETWORKS, heavy) if not only_batchnorm or n in BATCHNORM_NETWORKS]
        jobs = [lambda n=n: network_rows(tmp, n, only_batchnorm) for n in nets]
        if not heavy:
            jobs += [lambda job=job: {"batchnorm": [job()]} for job in batchnorm_jobs(tmp)]
        if not only_batchnorm:
            jobs += [lambda c=c: {"stack": [stack_row(tmp, c)]}
                     for c in part(stack_configs(), heavy)]
            if not heavy:
                jobs += [lambda f=f: {"families": [measured_row(*f)]}
                         for f in family_artifacts(tmp)]
        done = side_by_side(jobs)
    rows = {p: [r for d in done for r in d.get(p, [])]
            for p in ("table", "batchnorm", "stack", "families")}
    save_results("predictor_batchnorm", in_order(
        rows["batchnorm"] + kept_rows("predictor_batchnorm", heavy, network_of)))
    if not only_batchnorm:
        kept = kept_rows("predictor", heavy, network_of)
        save_results("predictor", in_order(
            [{**r, "part": p} for p in ("table", "stack", "families") for r in rows[p]]
            + kept))
    report(only_batchnorm)


def network_of(row: dict) -> str:
    """The built-in network a row measures (its name leads the row's model, or follows a
    stack row's name), or the layer family or tier it measures."""
    words = row["model"].replace(",", " ").replace(":", " ").split()
    return words[1] if words[0] in STACK_ROWS else words[0]


def in_order(rows: list[dict]) -> list[dict]:
    """Rows in the order of a run of every case: by table, a built-in network's rows in
    NETWORKS order, a stack row's in STACK_ROWS order, the rest as they came."""
    parts = ("table", "stack", "families")

    def key(r: dict) -> tuple:
        net, first = network_of(r), r["model"].split()[0]
        rank = (STACK_ROWS.index(first) if first in STACK_ROWS else
                NETWORKS.index(net) if net in NETWORKS and "exact" not in r["model"]
                else len(NETWORKS))
        return parts.index(r.get("part", "table")), rank

    return sorted(rows, key=key)


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


def batchnorm_jobs(tmp: Path) -> list:
    """The rest of the cycle with a BatchNorm statistics pass first, measured and predicted:
    `--batchnorm-adapt exact`, and each device tier's shipped plan as personalise runs it
    (`--adapt auto` at its micro-batch and accumulation). One function per row."""
    from device_sim.profiles import TIER_PLANS

    def exact(net: str) -> dict:
        art = tmp / f"{net}-exact"
        run("export", "--model", net, "--epochs", "0", "--no-cache", "--batchnorm-adapt",
            "exact", "--out", str(art))
        return measured_row(f"{net}, --batchnorm-adapt exact", art, BATCHNORM_BATCH,
                            "--adapt", "bn")

    def tier_row(tier) -> dict:
        art = tmp / f"tier-{tier.device}"
        run("export", *tier.export_args(), "--epochs", "0", "--no-cache", "--out", str(art))
        return measured_row(f"{tier.device}: {tier.label}", art, tier.micro_batch, "--adapt",
                            "auto", "--accumulate", str(tier.accumulation))

    return ([lambda n=n: exact(n) for n in EXACT_NETWORKS]
            + [lambda t=t: tier_row(t) for t in TIER_PLANS.values()])


def stack_configs() -> list:
    from stack_config import STACK

    return [c for c in STACK if c.name in STACK_ROWS]


def stack_row(tmp: Path, c) -> dict:
    """A stack row (sparse weights rebuilt by a recompute plan), exported as bench/planner.py
    exports it, at its micro-batch."""
    from planner import export

    art = export(tmp / c.name, c.network, c.sparse, c.recompute, c.micro_batch,
                 c.accumulation, c.update)
    return measured_row(f"{c.name} {c.network} ({c.update})", art, c.micro_batch)


def write_table(rows: list[dict], marker: str, source: str) -> None:
    lines = ["| model | batch | measured peak | predicted peak | error | claim |",
             "|---|---:|---:|---:|---:|---|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['batch']} | {r['peak_bytes']:,} | "
                     f"{r['predicted_peak_bytes']:,} | {r['error_ratio']:+.1%} | {r['claim']} |")
    replace_table(ROOT / "docs" / "predictor.md", lines, marker, sources=[source],
                  why_mixed=why_mixed(source, network_of))


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batchnorm", action="store_true", help="the statistics-pass table alone")
    ap.add_argument("--report", action="store_true",
                    help="only rebuild the tables from bench/results/predictor*.json")
    ap.add_argument("--heavy", action="store_true", help=HEAVY_HELP)
    a = ap.parse_args()
    report(a.batchnorm) if a.report else main(only_batchnorm=a.batchnorm, heavy=a.heavy)
