"""The inference model the runtime's end-of-run check runs, made on the host the way the device
makes it (a prediction's input).

At the end of a cycle the runtime writes an inference model with ORT's training API
(`Module.export_model_for_inferencing`, edgetrain/runtime.py) and runs it one sample at a time
(edgetrain/inference.py). ORT writes that model in its own node order, which sets what its
session holds at once (an 8-bit weight rebuilt early stays live until its layer runs), so the
predictor plans the same file: the artifact's training and eval graphs and checkpoint loaded
into a Module here and the model exported from it. The weights the runtime binds are the
checkpoint's tensors, so the values do not matter, only the graph.
"""
from __future__ import annotations

import os
import sys
import tempfile
import types
from functools import lru_cache

from edgetrain import names
from exporters.predictor.evaluated import onnxruntime_module

_FOLDER = tempfile.TemporaryDirectory(prefix="edgetrain-inference-graphs-")


def inference_model(train: str, eval_model: str, checkpoint: str) -> str:
    """Path of the inference model a device exports from these artifact files."""
    stamps = tuple((os.path.abspath(p), os.stat(p).st_mtime_ns, os.stat(p).st_size)
                   for p in (train, eval_model, checkpoint))
    return _exported(stamps)


@lru_cache(maxsize=16)
def _exported(stamps: tuple) -> str:
    (train, _, _), (eval_model, _, _), (checkpoint, _, _) = stamps
    api = _training_api()
    ort = onnxruntime_module()
    ort.set_default_logger_severity(3)  # ORT warns of every unused constant it drops
    so = ort.SessionOptions()
    so.log_severity_level = 3
    module = api.Module(train, api.CheckpointState.load_checkpoint(checkpoint), eval_model,
                        session_options=so)
    out = os.path.join(_FOLDER.name, f"inference-{len(os.listdir(_FOLDER.name))}.onnx")
    module.export_model_for_inferencing(out, [names.LOGITS_NAME])
    return out


def _training_api():
    """onnxruntime.training.api without the package initialiser, which imports torch and
    ORTModule (edgetrain.ort_device does the same on the device, where torch must not load;
    here torch may be loaded already, by the exporter)."""
    ort = onnxruntime_module()
    if "onnxruntime.training" not in sys.modules:
        pkg = types.ModuleType("onnxruntime.training")
        pkg.__path__ = [os.path.join(os.path.dirname(ort.__file__), "training")]
        sys.modules["onnxruntime.training"] = pkg
    from onnxruntime.training import api

    return api


__all__ = ["inference_model"]
