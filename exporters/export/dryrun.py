"""One training step of a finished artifact, run in a child process as the device will run it.

ORT can build and load a training graph whose kernels then kill the process when they run
(GRUGrad with its weight gradients left out died with SIGSEGV; AveragePoolGrad with SIGFPE).
In the device's process that is a crash with no message, so the export runs the step first,
in a child: forward and backward at micro-batch DRY_RUN_BATCH on zeros (three calls), an
optimizer step, an eval forward, then the side graphs the artifact carries (uncapped runs
only: a budget plan is made for training, which the side graphs are not part of). A child
killed by a signal, or one that fails, fails the export with what happened; nothing is
written. A budget recompute plan's step runs at the plan's micro-batch, capped at the budget.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import onnx

from edgetrain.budget import BudgetError

DRY_RUN_BATCH = 2  # at least 2: batch statistics need two samples
DRY_RUN_TIMEOUT_S = 600
OVER_BUDGET_EXIT = 3  # the child's exit status when the capped step did not fit

_STEP = """
import json, sys
import numpy as np
from edgetrain import names
from edgetrain.budget import BudgetError
from edgetrain.runtime import DeviceRuntime
try:
    rt = DeviceRuntime({folder!r}, budget_bytes={budget!r})
    rt.set_micro_batch({batch} if {budget!r} else min({batch}, rt.manifest.plan.micro_batch))
    # as personalise runs: steps (ORT plans its memory pattern after the first), eval
    rt.preflight()
    x = np.zeros((rt.micro_batch, *rt.manifest.input.sample_shape), np.float32)
    y = np.zeros(rt.micro_batch, np.int64)
    for _ in range(2):
        rt.train_micro_batch(x, y)
    rt.optimizer_step()
    rt.eval_logits(x)
    rt.train_micro_batch(x, y)
    side = not {budget!r}  # then, uncapped, the side graphs (RigL's dense gradients, BN
    if side and names.MASK_GRAD_MODEL in rt.manifest.files:  # statistics): a run may use
        rt.dense_gradients([(x, y)])  # them, and a budget plan is for training alone
    if side and rt.manifest.batchnorm_adapt_role is not None:
        # RESET of one micro-batch, and over a step's micro-batches: any group of 2 or more
        # runs the same graph and code, at layers x group passes (C6's 1,568 took minutes)
        for group in {{1, min(2, rt.manifest.plan.accumulation_steps)}}:
            rt.reset_batchnorm(lambda: [x] * group, group)
except BudgetError as e:
    sys.stderr.write(json.dumps({{"error": str(e), "needed_bytes": e.needed_bytes}}) + chr(10))
    sys.exit({over_budget_exit})
"""


class DryRunError(ValueError):
    """One training step of the exported artifact failed or killed its process."""


BUDGET_PLAN_ATTEMPTS = 3  # a budget recompute plan is planned again for less this often


class BudgetOverrunError(DryRunError, BudgetError):
    """The step, capped at the budget its plan was made for, did not fit (the message is the
    runtime's budget error). A BudgetError: the CLI exits 3 for it."""

    def __init__(self, message: str, needed_bytes: int | None = None,
                 predicted_bytes: int | None = None, budget_bytes: int = 0):
        BudgetError.__init__(self, message, budget_bytes, needed_bytes)
        self.predicted_bytes = predicted_bytes

    def next_planning_budget(self, planned_for: int, last: bool) -> int:
        """The budget to plan for next: this one shrunk by how far the prediction fell short
        of the need (the capped run's), or raise this error when no attempt remains."""
        if last or not self.needed_bytes or not self.predicted_bytes:
            raise self
        return int(planned_for * min(0.95, self.predicted_bytes / self.needed_bytes))


def dry_run_step(folder: Path, training_model: Path, budget_bytes: int | None = None,
                 micro_batch: int = DRY_RUN_BATCH) -> None:
    """Run the step in a child process; raise DryRunError if it fails, naming the operators
    of `training_model` (read only then). With `budget_bytes`, the step runs at
    `micro_batch` capped at the budget, as a device would: a recompute plan chosen by its
    predicted peak is confirmed by the allocator (BudgetOverrunError when it does not fit)."""
    from edgetrain import names

    code = _STEP.format(folder=str(folder), batch=micro_batch if budget_bytes else
                        DRY_RUN_BATCH, budget=budget_bytes,
                        over_budget_exit=OVER_BUDGET_EXIT)
    # wherever this edgetrain came from, by a module's own file: the package's __file__ is None
    # when a folder named edgetrain/ (a clone) in the working directory shadows it
    home = str(Path(names.__file__).resolve().parents[1])
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
    if budget_bytes and done.returncode == OVER_BUDGET_EXIT:
        report = json.loads(done.stderr.strip().splitlines()[-1])
        raise BudgetOverrunError(report["error"], report["needed_bytes"],
                                 budget_bytes=budget_bytes)
    ops = ", ".join(sorted({n.op_type for n in onnx.load(str(training_model)).graph.node}))
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


def dry_run_artifact(folder: Path, manifest, budget_bytes: int | None) -> None:
    """dry_run_step for a finished artifact folder. With `budget_bytes` (a recompute plan
    chosen for that budget by its predicted peak) the step runs at the plan's micro-batch,
    capped at the budget."""
    from edgetrain import names

    train = folder / manifest.files[names.TRAINING_MODEL].path
    try:
        dry_run_step(folder, train, budget_bytes, manifest.plan.micro_batch)
    except BudgetOverrunError as e:
        predicted = manifest.predicted.get("peak_bytes")
        raise BudgetOverrunError(
            f"the recompute plan chosen for a budget of {budget_bytes:,} bytes (predicted "
            f"peak {predicted or 0:,}) does not fit it when run: {e} Raise the budget, or use "
            "export --plan auto (plans confirmed by capped runs). Nothing was written.",
            e.needed_bytes, predicted, budget_bytes) from e


def export_within_budget(export, reset, budget_bytes: int | None):
    """export(planning_budget_bytes) -> manifest, planned for less after each
    BudgetOverrunError (next_planning_budget), up to BUDGET_PLAN_ATTEMPTS times; reset()
    empties the work folder between attempts. When no plan fits a smaller planning budget,
    the overrun is what the user sees: their budget, not the planner's working figure."""
    target, overrun = budget_bytes, None
    for attempt in range(BUDGET_PLAN_ATTEMPTS):
        try:
            return export(target)
        except BudgetOverrunError as e:
            overrun = e
            target = e.next_planning_budget(target, attempt + 1 == BUDGET_PLAN_ATTEMPTS)
        except ValueError:
            if overrun is None:
                raise
            raise overrun from None
        reset()
    raise AssertionError("unreachable: the last attempt raises")
