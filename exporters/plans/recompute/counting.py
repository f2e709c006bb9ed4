"""What a recompute plan adds to the step, counted on a training graph's nodes (cost.node_costs'
rows, on the graph as it will ship): FLOPs, and predicted time by the step-time model
(exporters/predictor/steptime.py). The optimal planner's budget is the time; FLOPs are
reported beside it."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from edgetrain import names
from exporters.predictor.steptime import TimeModel

NS_PER_S = 1_000_000_000


@dataclass(frozen=True)
class StepCount:
    step_flops: int  # the step without the recompute copies
    extra_flops: int  # the copies'
    step_ns: int  # predicted time of the step without the copies
    extra_ns: int  # predicted time of the copies

    def time_ratio(self) -> float:
        """The step's predicted time with the copies over its time without."""
        return 1.0 + self.extra_ns / max(1, self.step_ns)

    def flops_ratio(self) -> float:
        return 1.0 + self.extra_flops / max(1, self.step_flops)


def node_time_ns(model: TimeModel, row: tuple[str, str, int, int]) -> int:
    """One node's predicted time in whole nanoseconds (the planner's integer cost)."""
    _, op, flops, nbytes = row
    return round(model.node_time_s(op, flops, nbytes) * NS_PER_S)


def count_step(rows: Iterable[tuple[str, str, int, int]], model: TimeModel) -> StepCount:
    """StepCount of node_costs' rows (name, op, FLOPs, bytes): the plan's nodes are its
    copies, rebuilt weights and the PassThroughs that order them (names.is_recompute_node)."""
    flops = extra_flops = step_ns = extra_ns = 0
    for row in rows:
        ns = node_time_ns(model, row)
        if names.is_recompute_node(row[0]):
            extra_flops, extra_ns = extra_flops + row[2], extra_ns + ns
        else:
            flops, step_ns = flops + row[2], step_ns + ns
    return StepCount(flops, extra_flops, step_ns, extra_ns)
