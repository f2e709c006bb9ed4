"""Measure a training cycle's peak bytes with ONNX Runtime's own allocator.

A fresh, torch-free child process (`python -m device_sim.measure ARTIFACT ...`) replays the
personalisation cycle at the given micro-batch on random data: load, preflight, an eval batch,
optimizer steps, a checkpoint write, an eval batch, the inference export and an inference
batch. ORT's arena logs every time an arena grows ("Extending BFCArena ... rounded_bytes:R",
"Extended allocation by E bytes.", "Total allocated bytes: T"); the parent reads that log.

  * env arena (capped; gradients, optimizer state, activations and temporaries): it grows by
    exactly what is requested (arena_extend_strategy 1) and never shrinks, so its final total is
    its high-water mark. Its growth is attributed to the phase in which it happened.
  * other arenas (checkpoint tensors, the API's scalars): one allocation each, counted at the
    chunk size requested (R).
  * the training Module's graph constants: reserved in the env arena ("Reserving memory in
    BFCArena ... size: S") when it opens; counted under "other".
  * the inference session on the exported model (no memory pattern, edgetrain/sessions.py):
    its weights and its run are ordinary env-arena allocations, attributed to "activations"
    when they grow the arena (they often fit in space training has freed).
peak_bytes = env arena total + other arenas' chunks: every byte of the training working set
that ORT allocates. Not counted: the Python interpreter, numpy batches, ORT's code and graph
structures (process RSS is reported beside it as `process_peak_rss_bytes`).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from device_sim.fleetproc import die_with_parent
from device_sim.layout import fix_address_layout
from edgetrain.watchdog import STALLED, StalledError
from edgetrain.arenalog import CATEGORIES, MARK, parse_arena_log  # noqa: F401 (re-exported)

def _child_setup() -> None:
    """In the measuring child before it runs: the address layout fixed, and a SIGKILL when
    the process that started it ends (a killed `measure` leaves no child spinning)."""
    fix_address_layout()
    die_with_parent()


@dataclass(frozen=True)
class Measurement:
    peak_bytes: int
    arena_bytes: int  # the capped env arena's high-water mark
    outside_arena_bytes: int  # checkpoint tensors and API scalars
    breakdown: dict  # category -> bytes; sums to peak_bytes
    batch: int
    step_time_s: float  # median wall time of one optimizer step of `accumulation` micro-batches
    process_peak_rss_bytes: int
    torch_loaded: bool
    threads: int  # ORT intra-op threads the runtime ran with
    # every timed step in order (the first includes the arena's growth: a steady-state time
    # is the median of the rest)
    step_times_s: tuple[float, ...] = ()
    optimizer_steps: int = 0  # the cycle's: the timed ones and the restarted candidate's one

    def to_dict(self) -> dict:
        return asdict(self)


def check_settings(batch: int, budget_bytes: int | None, accumulation: int, steps: int,
                   threads: int | None) -> None:
    """Refuse settings a measurement cannot run with (ValueError naming the value and the
    fix), before any process starts: 0 is no setting here (a budget of 0 is not uncapped,
    nor 0 threads the plan's)."""
    from edgetrain.sessions import check_threads

    if batch <= 0:
        raise ValueError(f"batch must be a positive number of samples, got {batch}")
    if budget_bytes is not None and budget_bytes <= 0:
        raise ValueError(f"budget_bytes must be above 0, got {budget_bytes}; give None to "
                         "measure uncapped")
    if accumulation < 1:
        raise ValueError(f"accumulate must be at least 1 micro-batch a step, got "
                         f"{accumulation}")
    if steps < 1:
        raise ValueError(f"steps must be at least 1 (the optimizer steps timed), got {steps}")
    if threads is not None:
        check_threads(threads)


def measure(artifact: str | os.PathLike, batch: int, budget_bytes: int | None = None,
            accumulation: int = 1, steps: int = 3, threads: int | None = None,
            timeout_s: float = 1800, select: bool = True, adapt: str = "none") -> Measurement:
    """Run the probe in a child process and read its allocator log. Raises BudgetError."""
    from edgetrain.budget import BudgetError

    check_settings(batch, budget_bytes, accumulation, steps, threads)
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "ort.log"
        cmd = [sys.executable, "-m", "device_sim.measure", str(artifact), str(batch),
               str(budget_bytes or 0), str(accumulation), str(steps), str(threads or 0), tmp,
               str(int(select)), adapt]
        with open(log, "wb") as f:
            proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=f, timeout=timeout_s,
                                  preexec_fn=_child_setup)
        text = log.read_text(errors="replace")
        result_path = Path(tmp) / "probe.json"
        if proc.returncode != 0 or not result_path.exists():
            err = Path(tmp) / "error.json"
            if err.exists():
                e = json.loads(err.read_text())
                if e["kind"] == "BudgetError":
                    raise BudgetError(e["message"], e["budget_bytes"], e["needed_bytes"],
                                      e.get("micro_batch"), e.get("threads"),
                                      e.get("predicted", False))
                raise {"MemoryError": MemoryError, "ValueError": ValueError}.get(
                    e["kind"], RuntimeError)(e["message"])
            said = [ln for ln in text.splitlines() if ln.startswith("error: ") and STALLED in ln]
            if proc.returncode == -9 and said:  # the child's watchdog stopped it
                raise StalledError(said[-1][len("error: "):])
            tail = "\n".join(text.splitlines()[-5:])
            raise RuntimeError(f"measurement process failed (exit {proc.returncode}):\n{tail}")
        probe = json.loads(result_path.read_text())
    arena, outside, per = parse_arena_log(text)
    result = Measurement(peak_bytes=arena + outside, arena_bytes=arena,
                         outside_arena_bytes=outside,
                         breakdown=per, batch=batch, step_time_s=probe["step_time_s"],
                         process_peak_rss_bytes=probe["peak_rss_bytes"],
                         torch_loaded=probe["torch_loaded"], threads=probe["threads"],
                         step_times_s=tuple(probe["step_times_s"]),
                         optimizer_steps=probe["optimizer_steps"])
    if budget_bytes is not None and result.peak_bytes > budget_bytes:
        # The runtime's cap is exact (edgetrain/budget.py); this check guards what it rests
        # on (ORT reserving bytes past the arena's limit), so a run can never be reported as
        # fitting a budget it exceeded.
        over = result.peak_bytes - budget_bytes
        raise BudgetError(
            f"batch {batch} reached {result.peak_bytes} bytes, {over} over the budget of "
            f"{budget_bytes} (graph constants ONNX Runtime reserves beside its capped arena); "
            f"it does not fit. It needs at least {result.peak_bytes} bytes.",
            budget_bytes, result.peak_bytes)
    return result


def replays_batchnorm(manifest, adapt: str) -> bool:
    """Whether a cycle replaying personalise --adapt `adapt` runs a BatchNorm statistics pass
    (auto: where the artifact has a statistics graph)."""
    return adapt == "bn" or (adapt == "auto" and manifest.batchnorm_adapt_role is not None)


def peak_rss_bytes() -> int:
    """This process's peak resident set (VmHWM), in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def _probe(artifact: str, batch: int, budget: int, accumulation: int, steps: int,
           threads: int, tmp: str, select: bool = True, adapt: str = "none") -> None:
    """Child process: replay the personalisation cycle with phase marks on stderr. select:
    also what on-device selection does (edgetrain/trainloop.py): weights saved, a candidate
    restarted from them, the best loaded back. adapt "bn": BatchNorm statistics first; "auto":
    bn where the artifact has BatchNorm layers."""
    import numpy as np

    from edgetrain.budget import BudgetError
    from edgetrain import names, watchdog
    from edgetrain.ort_device import onnxruntime

    watchdog.enable()  # a stalled call ends this child with EXIT_STALLED (edgetrain/watchdog.py)

    ort = onnxruntime()
    ort.set_default_logger_severity(1)  # INFO: the arena's growth lines

    def mark(name: str) -> None:
        sys.stderr.write(f"\n{MARK}{name}\n")
        sys.stderr.flush()

    from edgetrain.runtime import DeviceRuntime

    try:
        rt = DeviceRuntime(artifact, budget_bytes=budget or None, threads=threads or None,
                           on_phase=mark)
        rt.set_micro_batch(batch)
        m = rt.manifest
        rng = np.random.default_rng(0)
        x = rng.standard_normal((batch, *m.input.sample_shape)).astype(np.float32)
        y = rng.integers(0, m.num_classes, batch)
        stats = replays_batchnorm(m, adapt)
        mark("preflight")
        rt.preflight(batchnorm_stats=stats, batchnorm_group=accumulation)
        mark("eval")
        rt.eval_logits(x)
        if stats:
            mark("other")
            rt.reset_batchnorm(lambda: [x] * accumulation, group=accumulation)
        times, stepped = [], [0]

        def train(timed: bool = True) -> None:
            mark("train")
            for _ in range(steps if timed else 1):
                t0 = time.perf_counter()
                for _ in range(accumulation):
                    rt.train_micro_batch(x, y)
                rt.optimizer_step(1.0 / accumulation)
                stepped[0] += 1
                if timed:  # --steps timed steps, the first candidate's
                    times.append(time.perf_counter() - t0)
        if select:
            mark("other")
            rt.save_checkpoint(Path(tmp) / "start", optimizer_state=False)
        train()
        if select:  # score, keep the best, restart the next candidate (one step: a step's
            # memory is the same every step, as the first candidate's are), load the best back
            mark("eval")
            rt.eval_logits(x)
            mark("other")
            rt.save_checkpoint(Path(tmp) / "best", optimizer_state=False)
            rt.load_checkpoint(Path(tmp) / "start")  # the runtime marks a reload itself
            train(timed=False)
            rt.load_checkpoint(Path(tmp) / "best")
        mark("other")
        rt.save_checkpoint(Path(tmp) / names.RUN_CHECKPOINT)
        mark("eval")
        rt.eval_logits(x)
        mark("other")
        path = rt.export_inference(Path(tmp) / names.RUN_INFERENCE_MODEL)
        rt.release_training()  # as personalise does before its inference check
        mark("inference")
        rt.inference_logits(path, x)
        mark("end")
    except BudgetError as e:
        Path(tmp, "error.json").write_text(json.dumps(
            {"kind": "BudgetError", "message": str(e), "budget_bytes": e.budget_bytes,
             "needed_bytes": e.needed_bytes, "micro_batch": e.micro_batch,
             "threads": e.threads, "predicted": e.predicted}))
        sys.exit(3)
    except Exception as e:  # reported to the parent, which re-raises it as its kind
        kind = ("MemoryError" if isinstance(e, MemoryError) else
                "ValueError" if isinstance(e, ValueError) else type(e).__name__)
        Path(tmp, "error.json").write_text(json.dumps({"kind": kind, "message": str(e)}))
        sys.exit(4)
    torch_loaded = sys.modules.get("torch") is not None
    Path(tmp, "probe.json").write_text(json.dumps({
        "step_time_s": float(np.median(times)), "step_times_s": times,
        "optimizer_steps": stepped[0], "peak_rss_bytes": peak_rss_bytes(),
        "torch_loaded": torch_loaded, "threads": rt.threads}))


if __name__ == "__main__":
    a = sys.argv[1:]
    _probe(a[0], int(a[1]), int(a[2]), int(a[3]), int(a[4]), int(a[5]), a[6], bool(int(a[7])),
           a[8])
