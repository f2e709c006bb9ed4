"""Sparse update against a budget: choose what trains so the device gains most and still fits.

`export --update auto --device P` (or `--budget B`) runs this on the host:

1. **Candidates.** The classifier alone (`head`), the last K layers for K = 2, 3, 4, 6, 8, 12 ...
   up to every layer, biases and norm affines with and without the last layers, and `all`
   (exporters/plans/updateplans.py names them). Plans that train the same tensors count once.
2. **Cost.** Each candidate is exported into a scratch folder and the static predictor gives
   its peak at the plan's micro-batch and threads. Those above the budget drop out.
3. **Contribution.** How much updating each fitting candidate helps users the population model
   never saw: a model pretrained without two *inner* subjects (taken from the population, so
   the held-out users stay unseen) is personalised on each inner subject's personalisation arm
   with each candidate (host replay of the device recipe, exporters/models/hostfinetune.py: the best
   of two learning rates and of five epochs by validation loss) and tested on their other arm.
   A candidate's score is the mean gain in points over the inner subjects.
4. **Choice.** The fitting candidate with the highest score; a tie goes to the smaller
   predicted peak. When none fits, the search fails with the smallest predicted peak.

The result (every candidate's trained bytes, predicted peak, score, and the choice) is data
(SearchResult) and goes into the manifest's provenance.
"""
from __future__ import annotations

import dataclasses
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from edgetrain import datasets
from edgetrain.budget import BudgetError
from exporters.models.hostfinetune import Inputs, evaluate, finetune

VAL_FRACTION = 0.25  # each inner user's validation slice (edgetrain.datasets protocols)

LAYER_STEPS = (2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
SEARCH_LRS = (1e-4, 1e-3)
INNER_USERS = 2


@dataclass(frozen=True)
class Candidate:
    update: str
    trainable_bytes: int
    predicted_peak_bytes: int | None  # None: the predictor makes no claim for this graph
    fits: bool
    gain_points: float | None = None  # host replay, mean over the inner subjects


@dataclass(frozen=True)
class SearchResult:
    chosen: str
    budget_bytes: int
    inner_users: tuple[int, ...]
    candidates: tuple[Candidate, ...]
    score: str = "host replay on the inner users (gain in points)"

    def to_dict(self) -> dict:
        return asdict(self)


def candidate_plans(layers: int) -> list[str]:
    """Plan names to try for a network of `layers` layers (weights of two or more dims)."""
    steps = [k for k in LAYER_STEPS if k < layers]
    return (["head", "bias-only", "bias-only,head", "bias", "bias,head"]
            + [f"last:{k}" for k in steps]
            + [f"bias,last:{k}" for k in steps] + ["all"])


def price(plans: list[str], export_one, budget_bytes: int) -> list[tuple[Candidate, tuple]]:
    """(candidate, trained tensor names) per distinct plan; export_one(update, folder) exports
    the network under that plan and returns its manifest."""
    seen, out = set(), []
    with tempfile.TemporaryDirectory() as tmp:
        for i, update in enumerate(plans):
            m = export_one(update, Path(tmp) / f"c{i}")
            names = tuple(sorted(t.name for t in m.trainable))
            if names in seen:
                continue
            seen.add(names)
            peak = m.predicted.get("peak_bytes") if m.predicted.get("complete", True) else None
            out.append((Candidate(update, m.trainable_bytes, peak,
                                  peak is not None and peak <= budget_bytes), names))
    return out


def contribution(inner_model: torch.nn.Module, spec, mean, scale, inner_users, trained: tuple,
                 dataset: str = "watch") -> float:
    """Mean test gain (points) over the inner users from training the tensors `trained`, each
    split by the data set's protocol (edgetrain.datasets)."""
    inputs = Inputs(spec, mean, scale)
    gains = []
    for user in inner_users:
        split = datasets.user_split(dataset, user, VAL_FRACTION)
        (xt, yt), (xv, yv), (xs, ys) = split.train, split.val, split.test
        X, Xv, Xs = inputs(xt), inputs(xv), inputs(xs)
        yt, yv, ys = map(torch.from_numpy, (yt, yv, ys))
        before = evaluate(inner_model, Xs, ys)[2].mean()
        best = min((finetune(inner_model, X, yt, Xv, yv, lr, set(trained)) for lr in SEARCH_LRS),
                   key=lambda r: evaluate(r[0], Xv, yv)[0])[0]
        gains.append(100.0 * (evaluate(best, Xs, ys)[2].mean() - before))
    return float(np.mean(gains))


def inner_subjects(population_subjects: list[int]) -> tuple[int, ...]:
    return tuple(sorted(population_subjects)[:INNER_USERS])


@dataclass(frozen=True)
class UpdateScore:
    """score(trained tensor names) -> how much training them helps (higher is better);
    users: whose data it replays (none: no data); description: what the number is."""
    score: Callable[[tuple[str, ...]], float]
    users: tuple[int, ...] = ()
    description: str = "host replay on the inner users (gain in points)"


def trained_share(model: torch.nn.Module) -> UpdateScore:
    """With no data to replay: the share of the model's parameter bytes a plan trains, in
    percent (the most that fits wins)."""
    sizes = {n: p.numel() for n, p in model.named_parameters()}
    total = max(1, sum(sizes.values()))

    def share(trained: tuple[str, ...]) -> float:
        return 100.0 * sum(sizes.get(n, 0) for n in trained) / total

    return UpdateScore(share, (), "share of parameter bytes trained, percent (no data given)")


def search(export_one, layers: int, budget_bytes: int, score: UpdateScore,
           progress=None) -> SearchResult:
    """export_one(update, folder) -> Manifest; score: how much each fitting plan helps
    (UpdateScore: contribution() on a model pretrained without the inner users, or
    trained_share())."""
    priced = price(candidate_plans(layers), export_one, budget_bytes)
    fitting = [(c, names) for c, names in priced if c.fits]
    if not fitting:
        known = [c.predicted_peak_bytes for c, _ in priced if c.predicted_peak_bytes]
        least = min(known) if known else None
        raise BudgetError(
            f"no update plan fits the budget of {budget_bytes} bytes: the smallest predicted "
            f"peak is {least} bytes (plan "
            f"{next((c.update for c, _ in priced if c.predicted_peak_bytes == least), '?')}). "
            "Try a smaller --micro-batch, a smaller --width, or a larger budget.",
            budget_bytes, least)
    scored = {}
    for i, (c, names) in enumerate(fitting):
        scored[c.update] = round(score.score(names), 2)
        if progress:
            progress(i + 1, len(fitting), c.update)
    candidates = tuple(dataclasses.replace(c, gain_points=scored.get(c.update)) for c, _ in priced)
    best = max((c for c in candidates if c.fits),
               key=lambda c: (c.gain_points, -c.predicted_peak_bytes))
    return SearchResult(best.update, budget_bytes, tuple(score.users), candidates,
                        score.description)
