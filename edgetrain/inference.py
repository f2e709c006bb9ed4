"""The inference check: the exported inference model, run inside the cap on the checkpoint's
own tensors.

After training, the run exports an inference-only model and checks it predicts what the
training graph's eval pass predicts. A plain InferenceSession would hold a second copy of
every weight, and ORT's graph optimisations would derive more (frozen BatchNorm folded into
the convolutions makes new weights): on a network whose update plan trains only its head,
those copies are a third of the run's peak (measured, patch MobileNet: 2.26 MB against
1.74 MB). So the check runs in two parts that together cover the file:

1. every weight the file stores is compared byte for byte with the checkpoint's tensor of the
   same name (no copy in the arena: the file's bytes are read as ORT would read them);
2. the session is opened with graph optimisations off and the checkpoint's buffers bound as
   its initializers (`SessionOptions.add_initializer`, no copy), and runs one sample at a time,
   so its activations fit in the space training has freed.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from edgetrain.graphcheck import check_model_bytes
from edgetrain.onnxscan import constant_bytes, initializer_data


def check_stored_weights(model_path: Path, params, names: list[str], max_bytes: int) -> None:
    """Raise ValueError unless the file passes the operator check (edgetrain/graphcheck.py)
    and stores each of `names` with the checkpoint's bytes,
    and no more than `max_bytes` of weights and constants in all (what this artifact's
    inference model holds: a bigger file is not the one this run exported)."""
    data = Path(model_path).read_bytes()
    check_model_bytes("inference model", Path(model_path), data)  # what it will do, first
    if constant_bytes(data) > max_bytes:
        raise ValueError(f"the inference model {model_path} holds {constant_bytes(data)} bytes "
                         f"of weights and constants, more than the {max_bytes} bytes this "
                         "artifact's inference model holds; use the one this run exported")
    stored = initializer_data(data)
    for name in names:
        if name not in stored:
            raise ValueError(f"the inference model {model_path} does not store {name!r}; it is "
                             "not the model this run exported")
        if stored[name] != params[name].data.tobytes():
            raise ValueError(f"the inference model {model_path} stores {name!r} with other "
                             "values than the checkpoint; it is not the model this run exported")


def open_bound_session(ort, model_path: Path, options, params, names: list[str]):
    """An InferenceSession whose initializers are the checkpoint's buffers. Returns (session,
    the bound values, which must live as long as the session)."""
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    bound = []
    for name in names:
        array = params[name].data  # a view of ORT's buffer
        value = ort.OrtValue.ortvalue_from_numpy(array)
        options.add_initializer(name, value)
        bound.append((array, value))
    return ort.InferenceSession(str(model_path), options,
                                providers=["CPUExecutionProvider"]), bound


def one_at_a_time(run, x: np.ndarray) -> np.ndarray:
    """Logits of each row of x, run alone (batch 1: the least activation memory)."""
    return np.concatenate([run(x[i:i + 1]) for i in range(len(x))]) if len(x) else \
        np.zeros((0, 0), np.float32)


__all__ = ["check_stored_weights", "one_at_a_time", "open_bound_session"]
