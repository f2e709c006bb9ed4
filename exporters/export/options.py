"""What an export plans, as data: the one object `edgetrain export` and the Python API build.

`export_artifact(model, example, out, classes=..., options=ExportOptions(...))` exports a
model of one's own; `exporters.models.pretrain.export_named(cfg, out, options)` a built-in
network (what `edgetrain export` runs). Every option of the command exists here under the
same name (`--update auto --budget 64MiB` is `update="auto", update_budget_bytes=64 << 20`);
`--device P` is its profile's budget and target (device_sim/profiles.py), which the command
resolves to these fields.
"""
from __future__ import annotations

import dataclasses
import math
from pathlib import Path

from edgetrain.manifest import Plan


@dataclasses.dataclass(frozen=True)
class ExportOptions:
    """plan: micro-batch, accumulation, threads, dense build, weight gradient (edgetrain's
    Plan; the export fills in what it plans). lr: the on-device learning rate.
    trainable: parameter names to train (default all); or update: an update plan
    (exporters/plans/updateplans.py: all, head, bias, last:K, names, or "auto": the plan that
    fits update_budget_bytes and helps most, exporters/plans/updatesearch.py).
    freeze_batchnorm: BatchNorm as a fixed affine map. recompute: none, sqrt, budget
    (planned for recompute_budget_bytes) or optimal (the lowest peak whose step is predicted
    at most recompute_time_ratio times the step without recompute: steptime.py). density,
    mask_allocation, mask_init, mask_seed: sparse masks (exporters/plans/sparse.py).
    int8_frozen: frozen weights in 8 bits.
    target: portable (default), arm64 or host (edgetrain/targets.py); nchwc: this machine's
    NCHWc kernels (host only). sign_key: an Ed25519 private key file (edgetrain/signing.py).
    masking_check: export_named measures what masking a trained model costs (host, torch)."""
    plan: Plan = Plan()
    lr: float = 1e-3
    trainable: tuple[str, ...] | None = None
    update: str | None = None
    update_budget_bytes: int | None = None
    freeze_batchnorm: bool = False
    recompute: str = "none"
    recompute_budget_bytes: int | None = None
    recompute_time_ratio: float = 1.3  # optimal's budget: x the step's predicted time
    density: float = 1.0
    mask_allocation: str = "erk"
    mask_init: str = "magnitude"
    mask_seed: int = 0
    int8_frozen: bool = False
    target: str | None = None
    nchwc: bool | None = None
    sign_key: str | None = None
    masking_check: bool = True

    def __post_init__(self):
        if self.trainable is not None:
            object.__setattr__(self, "trainable", tuple(self.trainable))
        if self.sign_key is not None:
            object.__setattr__(self, "sign_key", str(Path(self.sign_key)))
        if self.update is not None and self.trainable is not None:
            raise ValueError("give an update plan or a list of trainable names, not both")
        if self.update == "auto" and self.update_budget_bytes is None:
            raise ValueError("update 'auto' chooses what trains for a budget; give "
                             "update_budget_bytes (the CLI: --device or --budget)")
        ratio = self.recompute_time_ratio
        if not (isinstance(ratio, (int, float)) and math.isfinite(ratio) and ratio >= 1.0):
            raise ValueError(f"recompute_time_ratio must be a number of at least 1.0 (the step "
                             f"may not get faster by recomputing), got {ratio!r}")
        if self.plan.saved_activations == "int8" and self.recompute != "none":
            raise ValueError(f"saved activations in 8 bits and recompute {self.recompute!r} do "
                             "not combine (recompute rebuilds the tensors int8 would round); "
                             "choose one")
        if self.recompute == "budget" and self.recompute_budget_bytes is None:
            raise ValueError("recompute 'budget' needs a byte budget: give "
                             "recompute_budget_bytes (the CLI: --device or --budget)")

    def replace(self, **changes) -> ExportOptions:
        return dataclasses.replace(self, **changes)


FIELDS = tuple(f.name for f in dataclasses.fields(ExportOptions))


def options_from(options: ExportOptions | None, fields: dict) -> ExportOptions:
    """`options`, or one made of keyword `fields` (export_artifact's older spelling); both
    at once is refused, as is a name ExportOptions does not have."""
    unknown = sorted(set(fields) - set(FIELDS))
    if unknown:
        raise TypeError(f"export options {unknown} do not exist; ExportOptions has {FIELDS}")
    if options is not None and fields:
        raise TypeError(f"give options=ExportOptions(...) or the keywords {sorted(fields)}, "
                        "not both")
    return options if options is not None else ExportOptions(**fields)
