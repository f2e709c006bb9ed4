"""How the runtime opens and drives ONNX Runtime sessions: one place for session options, the
fixed-shape batching every session uses, and handing freed heap back to the OS.
"""
from __future__ import annotations

import ctypes
import os

import numpy as np

LOG_LEVEL_ENV = "EDGETRAIN_ORT_LOG_LEVEL"
MAX_THREADS = 64  # each thread has a stack outside the cap; 512 was accepted before


# ORT's buffer reuse in the training session. Off: each tensor gets its own block of the
# memory pattern, placed by lifetime. On (ORT's default), a freed buffer is handed to the next
# tensor of the same size, and the pattern then keeps that buffer for the whole chain: a
# sparse layer's forward dense weight stays placed until its backward copy is done with it.
# Measured (allocator, one call): MobileNetV1 at one image 38.7 -> 23.0 MB of activations,
# the patch MobileNet at one patch 13.7 -> 11.4 MB, and the step no slower.
TRAINING_MEMORY_REUSE = False

# ORT's graph optimizers the device runs without. Constant folding evaluates, while the
# session loads, every node whose inputs are all constants, with the plain heap rather than
# the capped arena: a hand-made graph computing 0 * ReduceSum(ConstantOfShape([2^28])) grew
# the process to 3.2 GB under an 8 MiB budget. Off, such a node runs in the step, from the
# arena, and the cap stops it (a BudgetError). The exporter's graphs fold nothing the step
# needs (the predictor models the same options: exporters/predictor/ortgraph.py).
DISABLED_OPTIMIZERS = ("ConstantFolding",)
DISABLED_OPTIMIZERS_KEY = "optimization.disable_specified_optimizers"


def check_threads(threads: int) -> None:
    """Refuse an intra-op thread count ORT should not be given (ValueError with the fix);
    None (the artifact's plan) is for the caller to resolve first."""
    if not 0 < threads <= MAX_THREADS:
        raise ValueError(f"threads is {threads}; ORT's intra-op threads must be 1 to "
                         f"{MAX_THREADS} (a watch has 2 to 8 cores): give --threads 1 or 2, "
                         "or leave it out for the artifact's plan")


def session_options(ort, threads: int, memory_pattern: bool = True):
    """SessionOptions for every session the runtime opens (training, side graphs, inference).

    All of them allocate from the process's capped env arena (edgetrain/budget.py) and run
    `threads` intra-op threads. Weight prepacking is off: ORT would take a packed copy of
    every constant MatMul/Gemm weight (MLAS pads its columns to 16, so a 3-class head packs 5x
    its size) with BFCArena::Reserve, past the arena's limit. memory_pattern False (sessions
    opened after training has grown the arena: side graphs, the inference model): with a
    pattern, ORT would also Reserve all the session's initializers in one buffer past the
    limit (measured); without, each is an ordinary, capped allocation. ORT's own error lines
    are suppressed: its errors reach the user translated (e.g. a BudgetError naming the
    bytes); EDGETRAIN_ORT_LOG_LEVEL=0..3 shows them for debugging. Constant folding is off
    (DISABLED_OPTIMIZERS)."""
    check_threads(threads)
    so = ort.SessionOptions()
    so.add_session_config_entry("session.use_env_allocators", "1")
    so.add_session_config_entry("session.disable_prepacking", "1")
    so.add_session_config_entry(DISABLED_OPTIMIZERS_KEY, ",".join(DISABLED_OPTIMIZERS))
    so.enable_mem_pattern = memory_pattern
    if memory_pattern:  # the training session (see TRAINING_MEMORY_REUSE)
        so.enable_mem_reuse = TRAINING_MEMORY_REUSE
    so.log_severity_level = int(os.environ.get(LOG_LEVEL_ENV, "4"))
    so.intra_op_num_threads = threads
    return so


def run_padded(fn, x: np.ndarray, batch: int, num_classes: int) -> np.ndarray:
    """Apply fn to x in batches of exactly `batch` rows (the last padded with zeros).

    A fixed shape keeps the runtime's memory plan, and so its peak, the same for every call.
    """
    out = []
    for i in range(0, len(x), batch):
        chunk = np.ascontiguousarray(x[i:i + batch], np.float32)
        n = len(chunk)
        if n < batch:
            chunk = np.concatenate([chunk, np.zeros((batch - n, *chunk.shape[1:]), np.float32)])
        out.append(np.array(fn(chunk)[:n]))
    return np.concatenate(out) if out else np.zeros((0, num_classes), np.float32)


def trim_heap() -> None:
    """Hand freed heap pages back to the OS. glibc keeps them otherwise: rebuilding the
    sessions at every mask update grew the process by about 1 MB of freed-but-held heap per
    update (patch MobileNet: 106 -> 243 MB RSS over 120 updates; flat at 102 MB with this)."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to do
        pass
