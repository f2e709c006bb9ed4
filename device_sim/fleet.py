"""A fleet of personalisations on Ray: one task per user x device, each in its own capped
runtime process, on an embedded local Ray (nothing to start) or a running cluster.

    run_fleet(spec, out)                      # local Ray with one worker per core
    run_fleet(spec, out, address="auto")      # the cluster `ray start` made (docs/fleet.md)

The fleet folder `out`:
  fleet-spec.json            the spec it runs (a re-run with another spec is refused)
  plans/<device>.json        the planner's choice where the spec says micro_batch "auto"
  runs/<device>/u<user>/     each run's folder: resume points, checkpoint, attempts.txt
  results/<device>/u<user>.json   one record per user x device, written atomically
  fleet.json                 every record, merged (device_sim/fleetreport.py reads it)
Each task declares the CPUs it runs (the spec's threads) and the memory it will hold (the
device's budget plus PROCESS_BASE_BYTES, the run process's own RSS), so Ray never
overcommits a node. A Ray worker runs many tasks but never a runtime: each run is a process
of its own, forked from the worker's fork server (device_sim/fleetproc.py). A run whose
process or worker dies is retried (max_retries) and continues from its resume point; a run
that cannot fit its device, diverges or has bad data is recorded and never retried. A re-run skips every
user x device with a record and writes no second one.
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from device_sim.fleetproc import RunProcessDied, run_in_child
from device_sim.fleetspec import FleetSpec, SpecError
from device_sim.fleettask import RESULTS, result_path, run_dir, run_task
from device_sim.profiles import PROFILES
from device_sim.raycluster import start_ray
from device_sim.synthusers import is_synthetic
from edgetrain import datasets
from edgetrain.atomicfile import atomic_write_bytes, remove_stale_temporaries
from edgetrain.personalise import Interrupted, StopRequests
from edgetrain.manifest import load_manifest
from edgetrain.runfolder import check_placement
from edgetrain.targets import check_runs_on

MiB = 1 << 20
# A run process's own resident memory before the runtime allocates (Python, numpy, ONNX
# Runtime, the recordings, shared with its fork server: about 90 MiB measured); every record's
# peak_rss_bytes minus its budget stays below this, and the report flags any that does not.
PROCESS_BASE_BYTES = 512 * MiB
SPEC_FILE, MERGED_FILE, PLANS = "fleet-spec.json", "fleet.json", "plans"
IN_FLIGHT_PER_CPU = 4
WAIT_S = 0.5  # the driver looks for SIGINT/SIGTERM at least this often


class StopOnSignals(StopRequests):
    """SIGINT and SIGTERM stop the fleet driver cleanly: noted by personalise's handler,
    acted on between waits (check) by raising Interrupted, which the CLI turns into exit 130
    / 143. Finished runs keep their records; runs in flight keep their resume points, and the
    same command continues them."""

    def check(self, in_flight: int) -> None:
        if self.signum is not None:
            name = signal.Signals(self.signum).name
            raise Interrupted(f"the fleet was stopped by {name} with {in_flight} runs in "
                              "flight: finished runs keep their records and the others their "
                              "resume points; run the same command again to continue",
                              self.signum)


@dataclass(frozen=True)
class FleetRun:
    out: str
    scheduled: int  # tasks sent to Ray this time
    skipped: int  # user x device pairs with a record already
    failed: list  # (user, device, error) of tasks whose retries ran out: no record
    records: list  # every record in the folder, merged
    wall_s: float
    workers: int | None  # CPUs of the Ray cluster used


def check_users(spec: FleetSpec) -> None:
    """No fleet user (real, or the source of a synthetic one) may be in the artifact's
    pretraining population: their gains would be optimistic."""
    m = load_manifest(spec.artifact)  # verifies every file once, before any task starts
    seen = set(m.provenance.get("population_subjects", []))
    bad = sorted(seen & set(spec.real_users + (spec.sources if spec.synthetic_users else ())))
    if bad:
        raise SpecError(f"subjects {bad} were in the artifact's pretraining population "
                        f"{sorted(seen)}; choose fleet users and sources outside it (export "
                        f"with --holdout-user)")
    if m.input.preprocess not in ("imu_gasf", "imu_window"):
        raise SpecError(f"the fleet's users are IMU recordings; {spec.artifact} takes "
                        f"{m.input.preprocess!r} input")
    name = m.provenance.get("dataset", "watch")  # the fleet's users are this data set's
    subjects = set(int(s) for s in datasets.recordings(name).subject)
    missing = sorted(set(spec.real_users + (spec.sources if spec.synthetic_users else ()))
                     - subjects)
    if missing:
        raise SpecError(f"users {missing} are not subjects of the {name} data set the artifact "
                        f"pretrained on ({min(subjects)}..{max(subjects)})")


def prepare(spec: FleetSpec, out: Path) -> None:
    """Write the spec into `out`, or check it is the one already there."""
    path = out / SPEC_FILE
    doc = {"fingerprint": spec.fingerprint(), "spec": spec.to_dict()}
    if path.is_file():
        old = json.loads(path.read_text())
        if old.get("fingerprint") != doc["fingerprint"]:
            raise SpecError(f"{out} holds a fleet run of another spec (fingerprint "
                            f"{old.get('fingerprint')}, this one {doc['fingerprint']}); use "
                            "another --out folder, or the spec it ran. Nothing was changed")
        for folder in (out, out / PLANS, *(out / RESULTS / d for d in spec.devices)):
            remove_stale_temporaries(folder)  # what a killed driver left half-written
        return
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, json.dumps(doc, indent=1).encode())


def micro_batches(spec: FleetSpec, out: Path) -> dict[str, int | None]:
    """device -> the micro-batch its runs use (None: the artifact's plan; 0: no plan fits)."""
    from device_sim.planner import plan  # the planner's capped runs, cached per device

    chosen = {}
    for device in sorted(spec.devices):
        want = spec.micro_batch_for(device)
        if want != "auto":
            chosen[device] = None if want == "artifact" else int(want)
            continue
        path = out / PLANS / f"{device}.json"
        if not path.is_file():
            r = plan(spec.artifact, PROFILES[device].ram_budget_bytes, threads=spec.threads)
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_bytes(path, json.dumps(r.to_dict(), indent=1).encode())
        c = json.loads(path.read_text())["chosen"]
        chosen[device] = c["micro_batch"] if c else 0
    return chosen


def merged(out: Path) -> list[dict]:
    recs = [json.loads(p.read_text()) for p in sorted((out / RESULTS).glob("*/u*.json"))]
    atomic_write_bytes(out / MERGED_FILE, json.dumps(recs, indent=1).encode())
    return recs


def run_fleet(spec: FleetSpec, out: str | os.PathLike, address: str | None = None,
              workers: int | None = None, progress=None) -> FleetRun:
    """Run every user x device of `spec` without a record in `out`; merge the records."""
    import ray

    t0 = time.perf_counter()
    out = Path(out)
    check_placement(out, spec.artifact)  # never write runs into the artifact's folder
    check_users(spec)
    m = load_manifest(spec.artifact, verify=False)
    for device in sorted(spec.devices):  # a host export cannot run on a watch's ORT
        check_runs_on(spec.artifact, {r: e.path for r, e in m.files.items()},
                      PROFILES[device].target, f"device {device}")
    prepare(spec, out)
    mbs = micro_batches(spec, out)
    pairs = spec.pairs()
    todo = [(u, d) for u, d in pairs if not result_path(out, u, d).is_file()]
    failed, cpus = [], None
    if progress and len(pairs) > len(todo):
        progress(len(pairs) - len(todo))
    started = bool(todo) and not ray.is_initialized()
    stack = contextlib.ExitStack()
    if started:
        start_ray(address, workers)
    try:
        if todo:
            stop = stack.enter_context(StopOnSignals())
            cpus = int(ray.cluster_resources().get("CPU", 0))
            if spec.threads > cpus:  # a task asking more CPUs than exist waits forever
                raise SpecError(f"threads is {spec.threads}, but the Ray cluster has {cpus} "
                                f"CPUs: no run could ever start; set \"threads\" to at most "
                                f"{cpus} (nothing was started)")
            failed = _schedule(ray, spec, out, todo, mbs, progress, cpus, stop)
    finally:
        stack.close()  # the old signal handlers back
        if started:
            ray.shutdown()  # on a stop too: in-flight runs die with their workers, keeping
            # their resume points
    return FleetRun(str(out), len(todo), len(pairs) - len(todo), failed, merged(out),
                    time.perf_counter() - t0, cpus)


def ray_task(spec: FleetSpec, out: str, user: int, device: str, micro_batch: int | None,
             declared_memory_bytes: int) -> dict:
    """The Ray task: `user` on `device` in a process forked for it (fleetproc.run_in_child);
    its record."""
    import ray

    done = result_path(out, user, device)
    if not done.is_file():
        node = ray.get_runtime_context().get_node_id()
        run_in_child(run_task, (spec, out, user, device, micro_batch, declared_memory_bytes,
                                node, os.getpid()), run_dir(out, user, device), done)
    return json.loads(done.read_text())


def _schedule(ray, spec: FleetSpec, out: Path, todo: list, mbs: dict, progress,
              cpus: int, stop: "StopOnSignals") -> list:
    """Run each (user, device) of `todo` on Ray, at most IN_FLIGHT_PER_CPU tasks per cluster
    CPU submitted at a time (a million users never means a million ObjectRefs, and each wait
    looks at a short list); the ones whose retries ran out."""
    task = ray.remote(ray_task)
    refs, failed = {}, []
    queue = iter(todo)
    limit = max(2, IN_FLIGHT_PER_CPU * cpus)

    def submit_next() -> bool:
        for u, d in queue:
            if mbs[d] == 0:  # no micro-batch fits: a record, no task
                _record_unplannable(out, u, d)
                if progress:
                    progress(1)
                continue
            declared = PROFILES[d].ram_budget_bytes + PROCESS_BASE_BYTES
            ref = task.options(num_cpus=spec.threads, memory=declared,
                               max_retries=spec.max_retries, retry_exceptions=[RunProcessDied],
                               name=f"u{u}@{d}").remote(spec, str(out), u, d, mbs[d], declared)
            refs[ref] = (u, d)
            return True
        return False

    while len(refs) < limit and submit_next():
        pass
    while refs:
        ready, _ = ray.wait(list(refs), num_returns=1, timeout=WAIT_S)
        stop.check(len(refs))
        for ref in ready:
            u, d = refs.pop(ref)
            try:
                ray.get(ref)
            except Exception as e:  # noqa: BLE001 - retries ran out: reported, no record
                failed.append((u, d, f"{type(e).__name__}: {str(e).splitlines()[0]}"))
            if progress:
                progress(1)
            submit_next()
    return failed


def _record_unplannable(out: Path, user: int, device: str) -> None:
    plan = json.loads((out / PLANS / f"{device}.json").read_text())
    budget = PROFILES[device].ram_budget_bytes
    rec = {"user": user, "kind": "synthetic" if is_synthetic(user) else "real", "device": device,
           "budget_bytes": budget, "micro_batch": None, "status": "does not fit",
           "error": f"no micro-batch trains within {device}'s {budget} bytes: "
                    f"{plan['reason']}", "pid": None, "started_at": None, "ended_at": None}
    path = result_path(out, user, device)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, json.dumps(rec, indent=1).encode())
