"""One fleet task: one user personalised on one device, in this process, its record written
atomically to results/<device>/u<user>.json of the fleet folder.

The fleet (device_sim/fleet.py) runs each task in a process of its own, forked for it by a
Ray worker (device_sim/fleetproc.py): the runtime's memory cap belongs to the process
(edgetrain/budget.py), so a process holds one capped runtime, and every record carries its
process id (and its worker's) to show it. The
run folder runs/<device>/u<user> holds the run's resume points: a retried task (its worker
died) continues from the newest (edgetrain/resume.py) and ends with the same weights as an
undisturbed run. A task whose result file exists returns it and trains nothing.
"""
from __future__ import annotations

import json
import os
import socket
import sys
import time
from pathlib import Path

from device_sim.faults import kill_at
from device_sim.fleetspec import WORKER_DRILL, FleetSpec
from device_sim.measure import peak_rss_bytes
from device_sim.profiles import PROFILES
from device_sim.synthusers import is_synthetic, synthetic_recordings
from edgetrain import data, datasets
from edgetrain.atomicfile import atomic_write_bytes
from edgetrain.budget import BudgetError
from edgetrain.faultpoints import install_hook
from edgetrain.manifest import load_manifest
from edgetrain.personalise import TrainConfig, TrainingDiverged, personalise
from edgetrain.intervals import UserTest, gain_interval
from edgetrain.userdata import UserData, recordings_split

RESULTS, RUNS, ATTEMPTS = "results", "runs", "attempts.txt"
# what a record must equal between a disturbed and an undisturbed run (timings, process ids
# and a resumed run's own peak differ by nature)
OUTCOME_KEYS = ("user", "device", "status", "micro_batch", "optimizer_steps",
                "accuracy_before", "accuracy_after", "test_correct_before",
                "test_correct_after", "guard", "error")


def result_path(out: str | os.PathLike, user: int, device: str) -> Path:
    return Path(out) / RESULTS / device / f"u{user}.json"


def run_dir(out: str | os.PathLike, user: int, device: str) -> Path:
    return Path(out) / RUNS / device / f"u{user}"


def user_windows(spec: FleetSpec, user: int) -> tuple[UserData, dict | None]:
    """The user's (train, validation, test) windows, checked against the artifact's input, and
    for a synthetic user how it was drawn. Real users: the data set the artifact pretrained on,
    split by its protocol (edgetrain/datasets.py); synthetic ones: the same split of their
    transformed recordings. Recordings are read once per process (a fork server reads them for
    all its runs: fleetwarm.py); nothing downstream changes them."""
    m = load_manifest(spec.artifact, verify=False)
    shape, k = m.input.data_shape(), m.num_classes
    name = m.provenance.get("dataset", "watch")
    recs, wearer = datasets.recordings(name), None
    if is_synthetic(user):
        recs, w = synthetic_recordings(recs, user, spec.seed, spec.sources)
        wearer = w.to_dict()
    val = spec.personalise.get("val_fraction", 0.25)
    return recordings_split(recs, user, datasets.protocol_of(name), shape, k,
                            val if spec.personalise.get("select", True) else None), wearer


def train_config(spec: FleetSpec, micro_batch: int | None) -> TrainConfig:
    p = spec.personalise
    lrs = p.get("lr_grid")
    return TrainConfig(epochs=p.get("epochs", 3), lr=p.get("lr"), micro_batch=micro_batch,
                       accumulation_steps=p.get("accumulation_steps"), seed=p.get("seed", 0),
                       checkpoint_every=p.get("checkpoint_every", 100),
                       lrs=tuple(lrs) if lrs else None, patience=p.get("patience", 2),
                       guard_margin=p.get("guard_margin", 1), adapt=p.get("adapt", "none"),
                       labels_per_class=p.get("labels_per_class"))


def install_drill(fault: str, worker_pid: int | None) -> None:
    """A fault drill of spec.faults: "<point>:<n>" SIGKILLs the run's own process there;
    "worker:<point>:<n>" SIGKILLs the worker process that started the run (which takes the
    run's process down with it, device_sim/fleetproc.py)."""
    if fault.startswith(WORKER_DRILL):
        if worker_pid is None:
            raise ValueError(f"fault {fault!r} kills the run's worker; this run has none")
        install_hook(kill_at(fault[len(WORKER_DRILL):], pid=worker_pid, then_wait_s=60))
    else:
        install_hook(kill_at(fault))


def run_task(spec: FleetSpec, out: str, user: int, device: str, micro_batch: int | None,
             declared_memory_bytes: int, ray_node: str | None = None,
             worker_pid: int | None = None) -> dict:
    """Personalise `user` on `device` in this process; write and return the record. ray_node
    and worker_pid: the Ray node and worker process that started this one, if any."""
    done = result_path(out, user, device)
    if done.is_file():
        return json.loads(done.read_text())
    run = run_dir(out, user, device)
    fault = spec.faults.get(f"{user}@{device}")
    if fault and not (run / ATTEMPTS).exists():  # a drill: kill the first attempt only
        install_drill(fault, worker_pid)
    run.mkdir(parents=True, exist_ok=True)
    with open(run / ATTEMPTS, "a") as f:
        f.write(f"{os.getpid()}\n")
    budget = PROFILES[device].ram_budget_bytes
    rec = {"user": user, "kind": "synthetic" if is_synthetic(user) else "real",
           "device": device, "budget_bytes": budget, "micro_batch": micro_batch,
           "declared_memory_bytes": declared_memory_bytes, "pid": os.getpid(),
           "node": socket.gethostname(), "ray_node": ray_node,
           "worker_pid": worker_pid, "started_at": time.time(),
           "status": "trained",
           "error": None, "optimizer_steps": None, "accuracy_before": None,
           "accuracy_after": None, "test_correct_before": None, "test_correct_after": None,
           "guard": None, "wearer": None}
    try:
        d, rec["wearer"] = user_windows(spec, user)
        r = personalise(spec.artifact, d.train, d.test, run, budget,
                        train_config(spec, micro_batch), threads=spec.threads, resume=True,
                        val=d.val, test_groups=d.test_groups)
        g = gain_interval([UserTest.of(r.test_correct_before, r.test_correct_after,
                                       r.test_recordings)])
        gain, lo, hi = g.gain_points, g.low_points, g.high_points
        rec.update(micro_batch=r.micro_batch, accumulation_steps=r.accumulation_steps,
                   optimizer_steps=r.optimizer_steps, accuracy_before=r.accuracy_before,
                   accuracy_after=r.accuracy_after, gain_points=gain,
                   gain_interval_points=[lo, hi], test_correct_before=r.test_correct_before,
                   test_correct_after=r.test_correct_after, test_recordings=r.test_recordings,
                   guard=None if r.guard is None else
                   ("kept population" if r.guard["kept_population"] else "personalised"),
                   measured_peak_bytes=r.measured_peak_bytes, train_time_s=r.train_time_s,
                   select_time_s=r.select_time_s, resumed_from_step=r.resumed_from_step,
                   step_time_s=r.train_time_s / max(1, r.optimizer_steps
                                                     - (r.resumed_from_step or 0)))
    except BudgetError as e:  # the device cannot train this: recorded, never retried
        rec.update(status="does not fit", error=str(e), needed_bytes=e.needed_bytes)
    except TrainingDiverged as e:
        rec.update(status="diverged", error=str(e))
    except (data.DataError, ValueError) as e:
        rec.update(status="error", error=f"{type(e).__name__}: {e}")
    rec.update(ended_at=time.time(), peak_rss_bytes=peak_rss_bytes(),
               attempts=len((run / ATTEMPTS).read_text().split()),
               torch_loaded=sys.modules.get("torch") is not None)
    done.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(done, json.dumps(rec, indent=1).encode())
    return rec
