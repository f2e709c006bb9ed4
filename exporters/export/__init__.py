"""Export: a torch model becomes an edgetrain artifact (artifact.py: export_artifact; what it
plans is ExportOptions, options.py; build.py builds it with the passes of exporters/passes/)."""
from exporters.export.artifact import export_artifact
from exporters.export.options import ExportOptions

__all__ = ["ExportOptions", "export_artifact"]
