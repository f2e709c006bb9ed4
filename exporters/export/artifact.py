"""torch.nn.Module -> edgetrain artifact (ORT training/eval/optimizer graphs, checkpoint, manifest).

Works for any module built from operators the legacy ONNX exporter and ORT's gradient builder
support (docs/byom.md lists them); anything else is refused with the module, the operator and
what to use instead (exporters/export/operators.py). What the export does is data
(ExportOptions, options.py); how it builds the artifact is build.py, whose rewrites are the
named passes of exporters/passes/.
An export is atomic: everything is written into a temporary folder beside `out`, which is
renamed to `out` only when the manifest is complete; a failure leaves no folder behind.
"""
from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import torch

from edgetrain import signing
from edgetrain.manifest import Manifest
from exporters.export.arguments import (check_export_arguments, replace_folder, resolve_target,
                                        work_folder)
from exporters.export.build import ModelInfo, build_artifact
from exporters.export.dryrun import export_within_budget
from exporters.export.options import ExportOptions, options_from
from exporters.plans import updatesearch


def export_artifact(model: torch.nn.Module, example_input: torch.Tensor, out: str | Path, *,
                    classes: list[str] | tuple[str, ...], options: ExportOptions | None = None,
                    model_name: str = "custom", image_shape: tuple[int, ...] | None = None,
                    preprocess: str = "none", preprocess_args: dict | None = None,
                    provenance: dict | None = None, layout: str | None = None,
                    update_score: updatesearch.UpdateScore | None = None,
                    **option_fields) -> Manifest:
    """Export `model` to an artifact folder `out` and return its manifest.

    example_input: one batch [B, *sample_shape]; the batch axis is exported as dynamic.
    classes: the logits' class names. options: what the export plans (ExportOptions: the
    plan, what trains, recompute, masks, int8, target, signing); its fields may be given as
    keywords instead (`density=0.1`), not both. model_name, image_shape, preprocess,
    preprocess_args, provenance, layout: what the manifest says about the model and its
    input (layout: the sample's axes, one letter each, "CHW", "CT", "TF"; default "CHW" for
    a 3-D sample, else unnamed).
    update "auto": each update plan is exported and priced by the predictor, those that fit
    options.update_budget_bytes are scored by `update_score` (default: the share of
    parameter bytes they train, as no data is given; export_named scores by a host replay
    on inner subjects) and the best is exported; the search goes into the provenance.
    """
    options = options_from(options, option_fields)
    out = Path(out)
    check_export_arguments(example_input, out, classes, options.lr, layout)
    key = signing.private_key(options.sign_key) if options.sign_key else None  # before any work
    target, nchwc = resolve_target(options.target, options.nchwc)
    options = options.replace(target=target, nchwc=nchwc,
                              plan=dataclasses.replace(options.plan, target=target))
    info = ModelInfo(tuple(classes), model_name, image_shape, preprocess, preprocess_args,
                     dict(provenance or {}), layout)
    if options.update == "auto":
        result = choose_update(model, example_input, options, info, update_score)
        options = options.replace(update=result.chosen)
        info = dataclasses.replace(info, provenance={**info.provenance,
                                                     "update_search": result.to_dict()})
    out.parent.mkdir(parents=True, exist_ok=True)
    work = work_folder(out)  # and what a killed export to `out` left is swept
    try:
        manifest = export_within_budget(  # a budget plan that overruns: planned again
            lambda target: build_artifact(work, model, example_input, options, info,
                                          planning_budget_bytes=target),
            lambda: (shutil.rmtree(work), work.mkdir()), options.recompute_budget_bytes)
        if key is not None:
            signing.sign(work, key)  # manifest.sig: the manifest's bytes, signed
        replace_folder(work, out)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return manifest


def choose_update(model: torch.nn.Module, example_input: torch.Tensor, options: ExportOptions,
                  info: ModelInfo, score: updatesearch.UpdateScore | None
                  ) -> updatesearch.SearchResult:
    """The update search (exporters/plans/updatesearch.py) for `model` under `options`: every
    candidate plan exported with the same options into a scratch folder."""
    def export_one(update: str, folder) -> Manifest:
        return export_artifact(model, example_input, folder, classes=info.classes,
                               options=options.replace(update=update, sign_key=None),
                               model_name=info.model_name, image_shape=info.image_shape,
                               preprocess=info.preprocess, preprocess_args=info.preprocess_args,
                               provenance=info.provenance, layout=info.layout)

    score = score or updatesearch.trained_share(model)
    layers = sum(p.dim() >= 2 for p in model.parameters())
    return updatesearch.search(export_one, layers, options.update_budget_bytes, score)
