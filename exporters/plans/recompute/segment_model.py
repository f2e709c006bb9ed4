"""The segment model: activation bytes and recompute cost of a checkpoint plan, and an exact
search over all plans by dynamic programming (used by the budget planner)."""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Callable

from exporters.plans.recompute.analysis import Forward

if TYPE_CHECKING:  # planners.py imports this module
    from exporters.plans.recompute.planners import PlanRequest


class SegmentModel:
    """Activation bytes and recompute cost of a plan, segment by segment.

    With checkpoints c_1 < ... < c_k the forward nodes split into segments S_0..S_k. Backward
    runs through S_k, then rebuilds and runs through S_{k-1}, and so on. While backward is in
    S_j, alive are: the checkpoints before S_j (P_j), the saved tensors of S_j (R_j, rebuilt
    if j < k) and the gradient working set (G_j: twice the largest tensor of S_j). The
    model's peak is max_j P_j + R_j + G_j; a plan costs the node_cost (FLOPs or predicted
    time) of the nodes its copies repeat. Exact search over all 2^n subsets of the n cut
    points by dynamic programming: after each checkpoint only (P, cost so far) matters, and
    a state no better in both is dropped."""

    def __init__(self, fwd: Forward, req: PlanRequest):
        self.fwd = fwd
        size = req.tensor_bytes
        nodes = fwd.nodes
        self.cut_pos = [fwd.position[c] for c in fwd.cuts]
        self.cut_bytes = [size.get(c, 0) for c in fwd.cuts]
        saved = [sum(size.get(o, 0) for o in n.output if o in fwd.saved) for n in nodes]
        self._saved_prefix = [0]
        for b in saved:
            self._saved_prefix.append(self._saved_prefix[-1] + b)
        self._largest = [max([size.get(o, 0) for o in n.output if o] + [0]) for n in nodes]
        self._node_cost = [req.node_cost.get(n.name, 0) for n in nodes]
        self._cost: dict[tuple, int] = {}

    def _bounds(self, a: int, b: int | None) -> tuple[int, int]:
        """Node index range [lo, hi) of the segment after cut a (-1: start) up to cut b
        (None: the end)."""
        lo = self.cut_pos[a] + 1 if a >= 0 else 0
        hi = self.cut_pos[b] + 1 if b is not None else len(self.fwd.nodes)
        return lo, hi

    def segment_bytes(self, a: int, b: int | None) -> int:
        lo, hi = self._bounds(a, b)
        return (self._saved_prefix[hi] - self._saved_prefix[lo]
                + 2 * max(self._largest[lo:hi], default=0))

    def segment_cost(self, a: int, b: int) -> int:
        """The cost of the copies that rebuild segment (a, b]'s saved tensors."""
        if (a, b) not in self._cost:
            lo, hi = self._bounds(a, b)
            out = self.fwd.cuts[b]
            targets = [o for n in self.fwd.nodes[lo:hi] for o in n.output
                       if o in self.fwd.saved and o != out]
            self._cost[(a, b)] = self._cost_of_computing(targets, lo, hi)
        return self._cost[(a, b)]

    def _cost_of_computing(self, targets: list[str], lo: int, hi: int) -> int:
        """The cost of the nodes among [lo, hi) that compute `targets` (their ancestors there):
        one walk back over the range, the forward nodes being in execution order."""
        wanted, total = set(targets), 0
        for k in range(hi - 1, lo - 1, -1):
            n = self.fwd.nodes[k]
            if any(o in wanted for o in n.output if o):
                total += self._node_cost[k]
                wanted.update(x for x in n.input if x)
        return total

    def _index(self, checkpoints: tuple[str, ...]) -> list[int]:
        return sorted(self.fwd.cuts.index(c) for c in checkpoints)

    def peak(self, checkpoints: tuple[str, ...], rebuilt: tuple[str, ...] = ()) -> int:
        """The model's activation peak for a plan. A `rebuilt` checkpoint (a nested plan,
        rewrite.py) is alive only while backward is between the kept checkpoint before it
        and the next kept one."""
        chosen, prefix, group, peak, a = self._index(checkpoints), 0, 0, 0, -1
        nested = {self.fwd.cuts.index(c) for c in rebuilt}
        for b in chosen + [None]:
            peak = max(peak, prefix + group + self.segment_bytes(a, b))
            if b is not None:
                if b in nested:
                    group += self.cut_bytes[b]
                else:
                    prefix, group = prefix + self.cut_bytes[b], 0
                a = b
        return peak

    def cost(self, checkpoints: tuple[str, ...], rebuilt: tuple[str, ...] = ()) -> int:
        """The cost of a plan's copies: each segment's, and for a nested plan each chain that
        rebuilds checkpoints (from the kept one before them to the last of them)."""
        chosen = self._index(checkpoints)
        nested = {self.fwd.cuts.index(c) for c in rebuilt}
        total = sum(self.segment_cost(a, b) for a, b in zip([-1] + chosen, chosen))
        for k, b in enumerate(chosen):
            after = chosen[k + 1] if k + 1 < len(chosen) else None
            if b in nested and after not in nested:  # the last rebuilt of its group
                kept = [c for c in chosen[:k] if c not in nested]
                total += self.chain_cost(kept[-1] if kept else -1, b)
        return total

    def chain_cost(self, a: int, b: int) -> int:
        """The cost of the nodes that rebuild cut b from cut a (-1: the input)."""
        if ("chain", a, b) not in self._cost:
            lo, hi = self._bounds(a, b)
            self._cost[("chain", a, b)] = self._cost_of_computing([self.fwd.cuts[b]], lo, hi)
        return self._cost[("chain", a, b)]

    def cheapest_within(self, peak_bytes: int) -> tuple[str, ...] | None:
        """The cheapest plan whose model peak is at most peak_bytes (None: none is)."""
        return self._search(peak_bytes, lambda cost, a, b, _: cost + (
            self.segment_cost(a, b) if b is not None else 0))

    def lowest_peak(self) -> tuple[str, ...]:
        """The plan with the smallest model peak (fewest checkpoints among equals)."""
        return self._search(math.inf, lambda peak, a, b, here: max(peak, here))

    def _search(self, limit: float, score: Callable[[int, int, int | None, int], int]
                ) -> tuple[str, ...] | None:
        """The plan with the lowest score whose segments all stay within `limit` bytes.

        A state after checkpoint b is (checkpoint bytes P, score so far, checkpoint indices);
        score(value, a, b, bytes) gives the value after segment (a, b] (b None: the last),
        whose model bytes are `bytes`. Only states no other beats in both P and score are
        kept, which is exact because a later segment sees nothing of a state but P."""
        states: dict[int, list[tuple[int, int, tuple[int, ...]]]] = {-1: [(0, 0, ())]}
        best = None
        for b in list(range(len(self.fwd.cuts))) + [None]:
            new = []
            for a, front in states.items():
                if b is not None and a >= b:
                    continue
                seg = self.segment_bytes(a, b)
                for prefix, value, path in front:
                    if prefix + seg > limit:
                        continue
                    value = score(value, a, b, prefix + seg)
                    if b is not None:
                        new.append((prefix + self.cut_bytes[b], value, path + (b,)))
                    elif best is None or (value, len(path)) < (best[0], len(best[1])):
                        best = (value, path)
            if b is not None:
                states[b] = _pareto(new)
        return None if best is None else tuple(self.fwd.cuts[i] for i in best[1])


def _pareto(states: list[tuple[int, int, tuple]]) -> list[tuple[int, int, tuple]]:
    """Keep the states no other state beats in both of the first two numbers."""
    front, lowest = [], None
    for s in sorted(states, key=lambda s: (s[0], s[1])):
        if lowest is None or s[1] < lowest:
            front.append(s)
            lowest = s[1]
    return front

