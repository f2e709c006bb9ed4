"""Nested recompute plans for the optimal planner's search (optimal.py): some checkpoints
are not kept from forward but rebuilt in backward from the kept checkpoint before them, when
backward reaches them (rewrite.py; Chen et al. 2016's recursion, one level deep).

A rebuilt checkpoint is alive only while backward runs between its kept checkpoint and the
next kept one, so the checkpoints of early, large stages no longer sit beside every later
segment's recompute; each group of rebuilt checkpoints costs one more forward run from its
kept checkpoint to the last of them. The search moves from its best plan by nested_moves,
judging each round's most promising moves by the segment model's nested peak
(SegmentModel.peak with `rebuilt`), while a round improves on the predictor's best.
"""
from __future__ import annotations

from typing import Callable

from exporters.plans.recompute.analysis import Forward
from exporters.plans.recompute.segment_model import SegmentModel


def nested_rounds(fwd: Forward, model: SegmentModel, budget: int, consider, best,
                  done: Callable[[], bool]) -> bool:
    """Rounds of nested_moves from the best plan so far, each judging its NESTED_MOVES most
    promising moves (lowest segment-model peak within the budget), while a round improves
    the best and done() (the search's bound: plans judged, or its time) is False; returns
    whether the bound ended the rounds."""
    improved = True
    while improved:
        improved = False
        current = best()
        moves = [m for m in nested_moves(fwd.cuts, current.checkpoints, current.rebuilt)
                 if model.cost(*m) <= budget]
        for ck, rb in sorted(moves, key=lambda m: model.peak(*m))[:NESTED_MOVES]:
            if done():
                return True
            found = consider(ck, rb)
            if found is not None and found.improves_on(current):
                improved = True
    return False


def nested_moves(cuts: tuple[str, ...], checkpoints: tuple[str, ...],
                 rebuilt: tuple[str, ...]) -> list[tuple[tuple[str, ...], tuple[str, ...]]]:
    """Nested plans one move from (checkpoints, rebuilt): a checkpoint turned from kept to
    rebuilt or back, a cut added (kept or rebuilt), a checkpoint dropped or moved to the next
    free cut either side (keeping its kind); never with the last checkpoint rebuilt."""
    rb = set(rebuilt)
    out = [(checkpoints, tuple(rb ^ {c})) for c in checkpoints]
    out += [(checkpoints + (c,), tuple(rb | extra)) for c in cuts if c not in checkpoints
            for extra in (set(), {c})]
    out += [(tuple(x for x in checkpoints if x != c), tuple(rb - {c})) for c in checkpoints]
    for c in checkpoints:
        k = cuts.index(c)
        for j in (k - 1, k + 1):
            if 0 <= j < len(cuts) and cuts[j] not in checkpoints:
                out.append((tuple(cuts[j] if x == c else x for x in checkpoints),
                            tuple(cuts[j] if x == c else x for x in rb)))
    return [(ck, r) for ck, r in out
            if ck and max(ck, key=cuts.index) not in r and (ck, r) != (checkpoints, rebuilt)]


NESTED_PLANS = 64  # nested plans judged at most, after the search over kept checkpoints
NESTED_MOVES = 8  # nested moves judged a round, the segment model's most promising first
