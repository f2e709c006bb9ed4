"""One training step of a finished artifact, run in a child process as the device will run it.

ORT can build and load a training graph whose kernels then kill the process when they run
(GRUGrad with its weight gradients left out died with SIGSEGV; AveragePoolGrad with SIGFPE).
In the device's process that is a crash with no message, so the export runs the step first,
in a child: forward and backward at micro-batch DRY_RUN_BATCH on zeros, the side graphs the
artifact carries, an optimizer step and an eval forward. A child killed by a signal, or one
that fails, fails the export with what happened; nothing is written.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

DRY_RUN_BATCH = 2  # at least 2: batch statistics need two samples
DRY_RUN_TIMEOUT_S = 600

_STEP = """
import numpy as np
from edgetrain import names
from edgetrain.runtime import DeviceRuntime
rt = DeviceRuntime({folder!r})
rt.set_micro_batch(min({batch}, rt.manifest.plan.micro_batch))
rt.preflight(mask_gradients=names.MASK_GRAD_MODEL in rt.manifest.files,
             batchnorm_stats=names.BATCHNORM_STATS_MODEL in rt.manifest.files)
x = np.zeros((rt.micro_batch, *rt.manifest.input.sample_shape), np.float32)
rt.train_micro_batch(x, np.zeros(rt.micro_batch, np.int64))
rt.optimizer_step()
rt.eval_logits(x)
"""


class DryRunError(ValueError):
    """One training step of the exported artifact failed or killed its process."""


def dry_run_step(folder: Path, operators: set[str]) -> None:
    """Run the step in a child process; raise DryRunError if it fails. `operators`: the
    training graph's operators, named in the error."""
    import edgetrain

    code = _STEP.format(folder=str(folder), batch=DRY_RUN_BATCH)
    home = str(Path(edgetrain.__file__).resolve().parents[1])  # wherever this one came from
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [home] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])}
    try:
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              timeout=DRY_RUN_TIMEOUT_S, env=env)
    except subprocess.TimeoutExpired as e:
        raise DryRunError(f"one training step of the exported model did not finish in "
                          f"{DRY_RUN_TIMEOUT_S} s in ONNX Runtime. Nothing was written.") from e
    if done.returncode == 0:
        return
    ops = ", ".join(sorted(operators))
    if done.returncode < 0:
        name = signal.Signals(-done.returncode).name
        raise DryRunError(
            f"one training step of the exported model killed ONNX Runtime's process with "
            f"{name}: a kernel of onnxruntime-training 1.19.2 crashes on this graph (its "
            f"operators: {ops}). Replace the layers docs/byom.md does not list. Nothing was "
            "written.")
    last = [line for line in done.stderr.strip().splitlines() if line.strip()][-1:]
    raise DryRunError(
        f"one training step of the exported model failed in ONNX Runtime "
        f"({last[0][-400:] if last else 'exit ' + str(done.returncode)}); its operators: "
        f"{ops}. Nothing was written.")
