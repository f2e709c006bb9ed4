"""The fastest plan that fits: micro-batch x accumulation for an effective batch, ranked by
the predicted step time on this machine, filtered by the predicted peak, confirmed by capped
runs (host side; drives the runtime from outside, as measure does).

For an effective batch of N items (for a patch artifact an item is one patch: a window is
`patches_per_sample` of them), each micro-batch m gives ceil(N / m) micro-batches a step.
  * peak: the static prediction at m (accumulation does not change it);
  * time: the calibrated latency model, per micro-batch the roofline of the training graph
    at this machine's measured FLOP/s and bandwidth, plus ORT's measured cost per node and
    per call (device_sim/hostprofile.py), times the micro-batches, plus one AdamW update.
Candidates predicted to fit are confirmed fastest first by capped runs (`measure` at the
plan, under the budget) until two pass: the faster of those measured is the plan. A
candidate whose capped run fails its budget is recorded as failed and never chosen.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import onnx

from device_sim.hostprofile import HostSpeed, host_speed
from device_sim.measure import measure
from edgetrain.budget import BudgetError
from edgetrain.manifest import load_manifest
from edgetrain.sessions import check_threads
from exporters.predictor.cost import ADAMW_BYTES_PER_VALUE, ADAMW_FLOPS_PER_VALUE, node_costs
from exporters.graph import attributes, load_graph
from exporters.predictor import predict_manifest
from edgetrain import names

CONFIRM = 2  # plans confirmed by capped runs: the winner and the runner-up
MAX_CANDIDATES = 24


@dataclass(frozen=True)
class PlanCandidate:
    micro_batch: int
    accumulation_steps: int
    predicted_peak_bytes: int | None  # None: the predictor makes no claim at this size
    predicted_step_time_s: float
    measured_peak_bytes: int | None = None
    measured_step_time_s: float | None = None
    confirmed: str = "not run"  # "fits", "over budget" or "not run"


@dataclass(frozen=True)
class PlanResult:
    artifact: str
    budget_bytes: int
    effective_batch: int  # items per optimizer step (patches, for a patch artifact)
    threads: int
    host: dict
    candidates: tuple[PlanCandidate, ...]  # every size looked at, fastest predicted first
    chosen: PlanCandidate | None
    runner_up: PlanCandidate | None
    reason: str

    def to_dict(self) -> dict:
        return asdict(self)


def items_per_sample(manifest) -> int:
    """Forward-call rows one sample makes: its patches for a patch artifact, else 1."""
    p = manifest.plan.patch_size
    if not p:
        return 1
    h, w = manifest.input.image_shape[-2:]
    return (h // p) * (w // p)


def sizes(effective_batch: int, limit: int = MAX_CANDIDATES) -> list[int]:
    """Micro-batches worth trying: the divisors of the effective batch (no ragged last
    micro-batch) and the powers of two below it, at most `limit`, spread over the range."""
    found = {d for d in range(1, effective_batch + 1) if effective_batch % d == 0}
    found |= {1 << k for k in range(effective_batch.bit_length()) if 1 << k <= effective_batch}
    ordered = sorted(found)
    if len(ordered) <= limit:
        return ordered
    step = (len(ordered) - 1) / (limit - 1)
    return sorted({ordered[round(i * step)] for i in range(limit)})


DENSE_OPS = {"Conv", "ConvGrad", "Gemm", "MatMul", "FusedMatMul"}


def node_time_s(op: str, group: int, flops: int, nbytes: int, speed: HostSpeed) -> float:
    """One node's predicted time on the host: a roofline at the measured rates (grouped
    convolutions at the depthwise rate) plus the measured dispatch cost of its kind."""
    memory = nbytes / speed.memory_bandwidth_bytes_per_s
    if op in DENSE_OPS:
        rate = speed.depthwise_flops_per_s if group > 1 else speed.compute_flops_per_s
        return max(flops / rate, memory) + speed.compute_node_overhead_s
    return max(flops / speed.compute_flops_per_s, memory) + speed.node_overhead_s


def predicted_time_s(training_model: str | onnx.ModelProto, m: int, accumulation: int,
                     trained_values: int, speed: HostSpeed) -> float:
    """A step of `accumulation` micro-batches of m items, and one AdamW update. Pass the
    loaded graph when predicting several sizes: it is read once."""
    model = training_model if isinstance(training_model, onnx.ModelProto) else \
        load_graph(training_model)
    groups = {n.name: int(attributes(n).get("group", 1)) for n in model.graph.node
              if n.op_type in ("Conv", "ConvGrad")}
    per_call = sum(node_time_s(op, groups.get(name, 1), f, b, speed)
                   for name, op, f, b in node_costs(model, m))
    adamw = max(ADAMW_FLOPS_PER_VALUE * trained_values / speed.compute_flops_per_s,
                ADAMW_BYTES_PER_VALUE * trained_values / speed.memory_bandwidth_bytes_per_s)
    return accumulation * (per_call + speed.call_overhead_s) + adamw


def plan(artifact: str | Path, budget_bytes: int, effective_batch: int | None = None,
         threads: int | None = None, steps: int = 2, confirm: int = CONFIRM,
         speed: HostSpeed | None = None, progress=None) -> PlanResult:
    """The fastest plan that fits `budget_bytes`, confirmed by capped runs; progress(text):
    told as each capped run starts."""
    m = load_manifest(artifact)
    threads = m.plan.threads if threads is None else threads
    check_threads(threads)
    n = (m.plan.micro_batch * m.plan.accumulation_steps if effective_batch is None
         else effective_batch)
    if n <= 0:
        raise ValueError(f"effective batch must be a positive number of items, got {n}")
    speed = speed or host_speed(threads)
    train = load_graph(str(Path(artifact) / m.files[names.TRAINING_MODEL].path))
    trained = sum(math.prod(t.shape) for t in m.trainable)
    cands = []
    for b in sizes(n):
        p = predict_manifest(artifact, m, b, threads)
        acc = -(-n // b)
        cands.append(PlanCandidate(b, acc, p.peak_bytes if p.complete else None,
                               predicted_time_s(train, b, acc, trained, speed)))
    cands.sort(key=lambda c: c.predicted_step_time_s)
    done: dict[int, PlanCandidate] = {}
    for c in cands:
        if len([d for d in done.values() if d.confirmed == "fits"]) >= confirm:
            break
        if c.predicted_peak_bytes is not None and c.predicted_peak_bytes > budget_bytes:
            continue  # predicted not to fit: never run
        if progress:
            progress(f"{c.micro_batch} x {c.accumulation_steps}")
        try:
            r = measure(artifact, c.micro_batch, budget_bytes, c.accumulation_steps, steps,
                        threads)  # replaying selection, as personalise runs by default
            done[c.micro_batch] = replace(c, measured_peak_bytes=r.peak_bytes,
                                          measured_step_time_s=r.step_time_s, confirmed="fits")
        except BudgetError as e:
            done[c.micro_batch] = replace(c, measured_peak_bytes=e.needed_bytes,
                                          confirmed="over budget")
    cands = [done.get(c.micro_batch, c) for c in cands]
    ok = sorted((c for c in cands if c.confirmed == "fits"),
                key=lambda c: c.measured_step_time_s)
    reason = ("fastest measured of the plans predicted fastest that fit" if ok else
              "no micro-batch trains within the budget (confirmed by capped runs)" if done else
              "no micro-batch is predicted to fit the budget")
    return PlanResult(str(artifact), budget_bytes, n, threads, speed.to_dict(), tuple(cands),
                      ok[0] if ok else None, ok[1] if len(ok) > 1 else None, reason)


def write_plan(artifact: str | Path, result: PlanResult) -> None:
    """Make the chosen plan the artifact's: the manifest's micro-batch and accumulation, the
    prediction at that micro-batch, and the search in provenance["plan_search"]."""
    if result.chosen is None:
        raise ValueError(f"no plan to write: {result.reason}")
    m = load_manifest(artifact)
    c = result.chosen
    pred = predict_manifest(artifact, m, c.micro_batch, result.threads)
    new = replace(m, plan=replace(m.plan, micro_batch=c.micro_batch,
                                  accumulation_steps=c.accumulation_steps,
                                  threads=result.threads),
                  predicted=pred.to_dict(),
                  provenance={**m.provenance, "plan_search": result.to_dict()})
    new.write(Path(artifact))


def best_variant(results: dict[str, PlanResult]) -> str | None:
    """Of plan searches over artifacts that differ in one export knob (e.g. the recompute
    plan), the one whose confirmed plan measured fastest; None if none has a plan."""
    timed = {k: r.chosen.measured_step_time_s for k, r in results.items() if r.chosen}
    return min(timed, key=timed.get) if timed else None
