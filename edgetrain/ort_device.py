"""Import ONNX Runtime's on-device training API without torch.

`onnxruntime.training/__init__.py` imports torch (through its `amp` and `optim` helpers for the
host-side ORTModule), which costs 250-290 MB of RSS that no watch has. The on-device API in
`onnxruntime.training.api` needs only the compiled core and numpy. We register a bare package
object for `onnxruntime.training` that points at the real folder, so importing
`onnxruntime.training.api` loads those modules from disk and never runs the torch-importing
package initialiser. A `None` entry for torch in sys.modules makes any accidental torch import
fail loudly instead of silently loading it.
"""
from __future__ import annotations

import os
import sys
import types


def onnxruntime():
    """Return the `onnxruntime` module, imported so that torch never loads.

    `import onnxruntime` (training build) probes for ORTModule, which imports torch; with the
    guard in place that probe fails quietly and the package finishes importing without it.
    """
    loaded = sys.modules.get("torch")
    if loaded is not None:
        raise RuntimeError("torch is already loaded in this process; the device-side runtime "
                           "must run in a process without torch (use the `edgetrain` CLI)")
    sys.modules["torch"] = None  # type: ignore[assignment]  # guard: `import torch` now fails
    first = "onnxruntime" not in sys.modules
    import onnxruntime as ort

    if first:  # ORT's own warnings (e.g. 32 "Removing initializer" lines per reset-bn) are
        # not the user's to read; EDGETRAIN_ORT_LOG_LEVEL=0..2 shows them for debugging
        ort.set_default_logger_severity(int(os.environ.get("EDGETRAIN_ORT_LOG_LEVEL", "3")))
    return ort


def training_api():
    """Return the `onnxruntime.training.api` module, imported without torch."""
    ort = onnxruntime()
    pkg = sys.modules.get("onnxruntime.training")
    if pkg is None:
        pkg = types.ModuleType("onnxruntime.training")
        pkg.__path__ = [os.path.join(os.path.dirname(ort.__file__), "training")]
        sys.modules["onnxruntime.training"] = pkg
    from onnxruntime.training import api

    return api
