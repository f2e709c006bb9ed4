"""A step-time model: each node of the training graph takes a fixed time plus time per FLOP
and per byte moved, by operator, fitted to ORT's own per-node profile of training steps.

FLOPs alone are a poor stand-in for time where a graph has many small nodes: a transformer
encoder's `sqrt` plan had +38% FLOPs and measured 1.13x the step time; a MobileNet plan with
fewer recomputed FLOPs than another measured slower, its copies being more and smaller nodes.
The model is

    t(node) = overhead_s + base_s[op] + s_per_flop[op] * FLOPs + s_per_byte[op] * bytes

(FLOPs and bytes from cost.node_costs; overhead_s is the executor's time between kernels,
per node), with op-specific terms where the profile had enough nodes of that operator and the
fit over every node otherwise. `bench/time_model.py` profiles training steps of the built-in
networks and the probes, fits it (fit_time_model) and writes TIME_MODEL_FILE, which carries
the machine, threads and commit it was fitted at. Its times are the host's (a prediction for
the machine it was fitted on); the recompute planner uses only their ratios.
"""
from __future__ import annotations

import functools
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterable, Mapping

import numpy as np

TIME_MODEL_FILE = Path(__file__).with_name("time_model.json")
MIN_OP_SAMPLES = 12  # nodes of one operator the fit needs before it gives the op its own terms


@dataclass(frozen=True)
class OpTime:
    base_s: float
    s_per_flop: float
    s_per_byte: float

    def time_s(self, flops: int, nbytes: int) -> float:
        return self.base_s + self.s_per_flop * flops + self.s_per_byte * nbytes


@dataclass(frozen=True)
class TimeModel:
    overhead_s: float  # the executor's time per node outside its kernel
    default: OpTime  # operators the fit saw too few of
    ops: Mapping[str, OpTime] = field(default_factory=dict)
    fitted_on: Mapping[str, object] = field(default_factory=dict)  # machine, threads, commit

    def node_time_s(self, op: str, flops: int, nbytes: int) -> float:
        return self.overhead_s + self.ops.get(op, self.default).time_s(flops, nbytes)

    def step_time_s(self, costs: Iterable[tuple[str, str, int, int]]) -> float:
        """The predicted time of node_costs' rows (name, op, FLOPs, bytes)."""
        return sum(self.node_time_s(op, f, b) for _, op, f, b in costs)

    def to_dict(self) -> dict:
        return {"overhead_s": self.overhead_s, "default": asdict(self.default),
                "ops": {k: asdict(v) for k, v in sorted(self.ops.items())},
                "fitted_on": dict(self.fitted_on)}

    @classmethod
    def from_dict(cls, d: Mapping) -> "TimeModel":
        return cls(float(d["overhead_s"]), OpTime(**d["default"]),
                   {k: OpTime(**v) for k, v in d["ops"].items()}, dict(d.get("fitted_on", {})))


@functools.lru_cache(maxsize=1)
def host_time_model() -> TimeModel:
    """The fitted model the exporter plans with (TIME_MODEL_FILE)."""
    try:
        return TimeModel.from_dict(json.loads(TIME_MODEL_FILE.read_text()))
    except (OSError, KeyError, TypeError, ValueError) as e:
        raise RuntimeError(f"the step-time model {TIME_MODEL_FILE} cannot be read ({e}); "
                           "rebuild it with `.venv/bin/python bench/time_model.py`") from e


def _nonneg_lstsq(a: np.ndarray, t: np.ndarray) -> np.ndarray:
    """min |a x - t| over x >= 0, for the few columns here: the best of the least-squares
    solutions on every subset of columns that come out nonnegative (exact for small a)."""
    scale = np.maximum(np.abs(a).max(axis=0), 1e-30)
    a = a / scale
    best, best_err = np.zeros(a.shape[1]), float(np.sum(t ** 2))
    cols = a.shape[1]
    for mask in range(1, 2 ** cols):
        keep = [j for j in range(cols) if mask >> j & 1]
        x, *_ = np.linalg.lstsq(a[:, keep], t, rcond=None)
        if (x < 0).any():
            continue
        full = np.zeros(cols)
        full[keep] = x
        err = float(np.sum((a @ full - t) ** 2))
        if err < best_err:
            best, best_err = full, err
    return best / scale


def _fit_op(rows: list[tuple[int, int, float]]) -> OpTime:
    """Least squares in relative error (each row divided by its time), so that the many
    small nodes weigh as much as the few large ones."""
    t = np.array([max(s, 1e-9) for _, _, s in rows])
    a = np.array([[1.0, f, b] for f, b, _ in rows]) / t[:, None]
    base, per_flop, per_byte = (float(v) for v in _nonneg_lstsq(a, np.ones(len(rows))))
    return OpTime(base, per_flop, per_byte)


def fit_time_model(samples: Iterable[tuple[str, int, int, float]], overhead_s: float,
                   fitted_on: Mapping[str, object] | None = None) -> TimeModel:
    """The model of samples (op, FLOPs, bytes, kernel seconds), one per profiled node, with
    `overhead_s` per node outside kernels (measured: a step's time less its kernels', per
    node). Least squares in relative error with nonnegative terms, per operator with at least
    MIN_OP_SAMPLES nodes, the default over every node."""
    by_op: dict[str, list[tuple[int, int, float]]] = {}
    for op, f, b, s in samples:
        by_op.setdefault(op, []).append((int(f), int(b), float(s)))
    if not by_op:
        raise ValueError("no profiled nodes to fit the step-time model on")
    default = _fit_op([r for rows in by_op.values() for r in rows])
    ops = {op: _fit_op(rows) for op, rows in by_op.items() if len(rows) >= MIN_OP_SAMPLES}
    return TimeModel(max(0.0, float(overhead_s)), default, ops, dict(fitted_on or {}))
