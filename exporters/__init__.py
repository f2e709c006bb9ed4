"""Host side: a torch model becomes an edgetrain artifact.

  export/     export_artifact, ExportOptions, the build, its checks, the dry run
  passes/     the graph rewrites, one module each, run in order by passes/pipeline.py
  plans/      what is planned before the graphs exist: update, sparse, int8, recompute
  predictor/  the static memory and cost predictor
  models/     the built-in networks, population pretraining, host replays
  views/      pictures of graphs and timelines
  graph.py    the one graph walk the others share

Modules that lived at the top level before this grouping (`exporters.networks`,
`exporters.pretrain`, ...) are still importable under their old names (MOVED): each old
name is the moved module itself, so scripts written against them keep working.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys

MOVED = {
    "activationparts": "views.activationparts", "arguments": "export.arguments",
    "convbn": "passes.convbn", "cost": "predictor.cost", "densebuild": "passes.densebuild",
    "dryrun": "export.dryrun", "dst": "models.dst", "graphview": "views.graphview",
    "hostfinetune": "models.hostfinetune", "logits": "export.logits",
    "maskfidelity": "models.maskfidelity", "nchwc": "passes.nchwc",
    "networks": "models.networks", "norms": "models.norms", "operators": "export.operators",
    "pointwisegrad": "passes.pointwisegrad", "popfit": "models.popfit",
    "pretrain": "models.pretrain", "quantize": "plans.quantize",
    "recompute": "plans.recompute", "report": "views.report", "rewrites": "models.rewrites",
    "sparse": "plans.sparse", "sparsegrad": "passes.sparsegrad",
    "stackedgrad": "passes.stackedgrad", "summary": "export.summary",
    "updateplans": "plans.updateplans", "updatesearch": "plans.updatesearch",
}


class MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports `exporters.<old>[.<sub>]` as the module now at `exporters.<MOVED[old]>[.<sub>]`
    (the same module object, so both names see one state)."""

    @staticmethod
    def new_name(fullname: str) -> str | None:
        parts = fullname.split(".")
        if len(parts) < 2 or parts[0] != __name__ or parts[1] not in MOVED:
            return None
        return ".".join([__name__, MOVED[parts[1]], *parts[2:]])

    def find_spec(self, fullname, path=None, target=None):
        new = self.new_name(fullname)
        return importlib.util.spec_from_loader(fullname, self) if new else None

    def create_module(self, spec):
        return importlib.import_module(self.new_name(spec.name))

    def exec_module(self, module) -> None:
        """The module ran under its new name already."""


if not any(isinstance(f, MovedModules) for f in sys.meta_path):
    sys.meta_path.append(MovedModules())
