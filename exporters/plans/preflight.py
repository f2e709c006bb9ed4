"""Which runs first where a run adapts BatchNorm: the statistics pass or a training step.

ONNX Runtime's capped arena grows by a region of exactly a request's size and never gives one
back (exporters/predictor/cycle.py). A run that adapts BatchNorm (`personalise --adapt bn`,
label-free personalisation) runs a statistics pass, whose side graph allocates each of its
buffers apart, and training steps, whose memory pattern is one block: whichever runs first
leaves the regions the other must fit in. The step first lets the pass's buffers take the
block the step freed (imu_cnn's head at micro-batch 2 x 4: measured 1,005,568 -> 902,912
bytes); the pass first wins where its regions hold the step's block (the width-0.25 imu_cnn
of `mcu-256kb`: 184,320 against 197,632). The exporter writes into the plan the order whose
predicted cycle peak is lower (`Plan.preflight_order`); the runtime's preflight runs that
order (edgetrain/runtime.py), and every later pass and step repeats its requests into the
same regions.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

from edgetrain.manifest import PREFLIGHT_ORDERS, Manifest
from exporters.predictor import predict_manifest


def order_peaks(folder: Path, manifest: Manifest) -> dict[str, int | None]:
    """Each preflight order's predicted peak of the cycle with a statistics pass at the
    plan's micro-batch and accumulation (None: the predictor makes no claim)."""
    peaks = {}
    for order in PREFLIGHT_ORDERS:
        m = with_order(manifest, order)
        p = predict_manifest(folder, m, m.plan.micro_batch, batchnorm_stats=True,
                             batchnorm_group=m.plan.accumulation_steps)
        peaks[order] = p.peak_bytes if p.complete else None
    return peaks


def choose_preflight_order(folder: Path, manifest: Manifest) -> Manifest:
    """`manifest` with the preflight order of the lower predicted peak in its plan (the first
    of PREFLIGHT_ORDERS on a tie or without a claim for both) and the peaks in
    `predicted["preflight_orders"]`; unchanged for an artifact with no statistics graph."""
    if manifest.batchnorm_adapt_role is None:
        return manifest
    peaks = order_peaks(folder, manifest)
    claimed = {o: p for o, p in peaks.items() if p is not None}
    order = (min(PREFLIGHT_ORDERS, key=lambda o: (claimed[o], PREFLIGHT_ORDERS.index(o)))
             if len(claimed) == len(PREFLIGHT_ORDERS) else PREFLIGHT_ORDERS[0])
    return dataclasses.replace(with_order(manifest, order),
                               predicted={**manifest.predicted, "preflight_orders": peaks})


def with_order(manifest: Manifest, order: str) -> Manifest:
    return dataclasses.replace(manifest, plan=dataclasses.replace(manifest.plan,
                                                                  preflight_order=order))


__all__ = ["choose_preflight_order", "order_peaks", "with_order"]
