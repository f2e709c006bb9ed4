"""Choosing on the device, from the user's own data only: scores on a validation slice, the
best of several learning rates and epochs (keep-best, early stopping), and the do-no-harm
guard that keeps the population model when personalising did not help.

The validation slice is labelled data of the user that training never sees (cut in time,
edgetrain.data.validation_split / time_split). Every candidate starts from the same weights;
after each epoch it is scored on the slice, the best so far is saved (atomically), and a
candidate stops after `patience` epochs without a new best. The guard compares the best with
the population model's score on the same slice: it must get at least `margin_windows` more
windows right. With 10 to 29 validation windows per user (the built-in data set), one window
is 3 to 10 points, and the best of a dozen scored candidates is optimistic by about that much
(a maximum over noisy scores), so the default margin is one window: a tie, or a gain no larger
than the luck of picking a maximum, keeps the population model.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

# label-free adaptation before training: bn, BatchNorm statistics from the user's windows;
# auto, bn where the artifact has BatchNorm layers whose statistics it can re-estimate
ADAPTS = ("none", "bn", "auto")


def _adapted_keeps_windows(population: "Score", adapted: "Score") -> bool:
    return adapted.correct >= population.correct


def _adapted_keeps_windows_and_loss(population: "Score", adapted: "Score") -> bool:
    return adapted.correct >= population.correct and adapted.loss <= population.loss


# When the guard keeps the adapted start (BatchNorm statistics from the user's windows, no
# weight trained) over the population model, by its validation score: "loss" (the default)
# if it loses no window and does not raise the loss; "windows" if it loses no window.
ADAPT_GUARDS = {"loss": _adapted_keeps_windows_and_loss, "windows": _adapted_keeps_windows}


@dataclass(frozen=True)
class Score:
    """A model's result on the validation slice."""

    correct: int
    windows: int
    loss: float  # mean cross-entropy over the windows

    @property
    def accuracy(self) -> float:
        return self.correct / self.windows if self.windows else 0.0

    def beats(self, other: "Score") -> bool:
        """A lower validation loss (ties: more windows right). The loss, not the accuracy,
        ranks candidates: a slice of 10 to 29 windows is soon all right, and its accuracy
        then stops telling epochs apart while the loss still does."""
        return (-self.loss, self.correct) > (-other.loss, other.correct)

    def to_dict(self) -> dict:
        return {**asdict(self), "accuracy": round(self.accuracy, 6)}

    @classmethod
    def from_dict(cls, d: dict) -> "Score":
        return cls(int(d["correct"]), int(d["windows"]), float(d["loss"]))


def score(logits: np.ndarray, y: np.ndarray) -> Score:
    """Score per-sample logits [N, K] against labels [N]."""
    y = np.asarray(y, np.int64)
    z = logits.astype(np.float64)
    z = z - z.max(axis=1, keepdims=True)
    log_p = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    loss = float(-log_p[np.arange(len(y)), y].mean()) if len(y) else math.inf
    return Score(int((logits.argmax(-1) == y).sum()), len(y), loss)


def checked_lr(lr, what: str) -> float:
    """A learning rate that can train: a finite positive number (else ValueError)."""
    try:
        value = float(lr)
    except (TypeError, ValueError):
        value = float("nan")
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{what} is {lr!r}; it must be a finite number above 0, e.g. 3e-4")
    return value


def check_settings(lrs, patience: int, margin_windows: int, adapt_guard: str = "loss") -> None:
    """ValueError unless the candidates are finite positive learning rates, patience is at
    least one epoch, the guard's margin is not negative and its rule for the adapted start
    is known."""
    if adapt_guard not in ADAPT_GUARDS:
        raise ValueError(f"unknown rule for the adapted start {adapt_guard!r}; choose one of "
                         f"{sorted(ADAPT_GUARDS)}")
    if lrs is not None:
        if not lrs:
            raise ValueError("selection needs at least one learning rate")
        for lr in lrs:
            checked_lr(lr, "learning rate")
    if patience < 1:
        raise ValueError(f"patience must be at least 1 epoch, got {patience}")
    if margin_windows < 0:
        raise ValueError(f"the guard's margin must be >= 0 windows, got {margin_windows}")


def test_accuracy(logits: np.ndarray, y) -> tuple[float, str]:
    """Accuracy of per-sample logits against labels (an array or SampleArray), and which
    windows were right as a string of 0/1 in order (for paired statistics)."""
    right = logits.argmax(-1) == np.asarray(y[:])
    return float(right.mean()), "".join("1" if r else "0" for r in right)


def lr_grid(lr: float, factors=(1 / 3, 1.0, 3.0)) -> tuple[float, ...]:
    """The default candidates: the artifact's learning rate and its neighbours."""
    return tuple(float(f"{lr * f:.3g}") for f in factors)


@dataclass(frozen=True)
class Decision:
    """What the guard decided, and on what evidence."""

    kept_population: bool
    population: Score  # the population model on the validation slice
    best: Score  # the best personalised candidate there
    best_lr: float | None
    best_epoch: int  # epochs of training of the best (0: the starting weights)
    margin_windows: int
    statistics_only: bool = False  # the best is the adapted start: no weight trained
    adapted: Score | None = None  # the start after BatchNorm adaptation, when the run adapted
    adapt_guard: str = "loss"  # the rule the adapted start was kept or refused by
    best_mix: float | None = None  # the best is this mix of the start and the trained best

    @property
    def message(self) -> str:
        if self.kept_population:
            rule = ("may neither lose a window nor raise the loss" if self.adapt_guard == "loss"
                    else "may not lose a window")
            also = ("" if self.adapted is None else f"; adapted BatchNorm statistics alone "
                    f"{self.adapted.correct}/{self.adapted.windows} with loss "
                    f"{self.adapted.loss:.3g}, which {rule}")
            return ("kept the population model: personalisation did not help on your "
                    f"validation data ({self.best.correct}/{self.best.windows} right at best, "
                    f"the population model {self.population.correct}/{self.population.windows};"
                    f" it needs {self.margin_windows} more{also})")
        if self.statistics_only:
            return (f"adapted: BatchNorm statistics from your windows, no weight trained "
                    f"({self.best.correct}/{self.best.windows} validation windows right, the "
                    f"population model {self.population.correct}/{self.population.windows}; "
                    "training found nothing better)")
        mixed = ("" if self.best_mix is None else f", mixed {self.best_mix:g} of the way from "
                 "the start")
        return (f"personalised: {self.best.correct}/{self.best.windows} validation windows "
                f"right, the population model {self.population.correct}/"
                f"{self.population.windows} (lr {self.best_lr:g}, {self.best_epoch} epochs"
                f"{mixed})")

    def to_dict(self) -> dict:
        return {"kept_population": self.kept_population, "message": self.message,
                "population": self.population.to_dict(), "best": self.best.to_dict(),
                "best_lr": self.best_lr, "best_epoch": self.best_epoch,
                "margin_windows": self.margin_windows, "statistics_only": self.statistics_only,
                "adapted": None if self.adapted is None else self.adapted.to_dict(),
                "adapt_guard": self.adapt_guard, "best_mix": self.best_mix}


def decide(population: Score, best: Score, best_lr: float | None, best_epoch: int,
           margin_windows: int, adapted: Score | None = None,
           adapt_guard: str = "loss", best_mix: float | None = None) -> Decision:
    """The guard: keep the population model unless the best trained candidate gains
    margin_windows validation windows over it.

    adapted: the start's score after label-free BatchNorm adaptation (no weight trained), when
    the run adapted. Where no trained candidate passes, the adapted start is kept if it loses
    no validation window and does not raise the validation loss, the measure every candidate
    is ranked by (Score.beats), or with adapt_guard "windows" if it loses no window: no
    margin, since the adapted start is one candidate fixed before any label is read, not the
    best of many (the label-free mode, with no labels to score it, applies it with no guard
    at all). best_mix: the best trained candidate is this mix of the start and the trained
    weights (edgetrain/interpolation.py)."""
    trained = best_epoch > 0 and best.correct >= population.correct + max(margin_windows, 0) \
        and (best.correct > population.correct or best.loss < population.loss)
    if trained:
        return Decision(False, population, best, best_lr, best_epoch, margin_windows,
                        adapted=adapted, adapt_guard=adapt_guard, best_mix=best_mix)
    if adapted is not None and ADAPT_GUARDS[adapt_guard](population, adapted):
        return Decision(False, population, adapted, None, 0, margin_windows, True, adapted,
                        adapt_guard)
    return Decision(True, population, best, best_lr, best_epoch, margin_windows,
                    adapted=adapted, adapt_guard=adapt_guard)


def record_epoch(sel: dict, s: Score, lr: float, epoch: int) -> bool:
    """Note an epoch's validation score in the selection state `sel` (a JSON-able dict with
    "best", "since_best" and "history"); True if it is a new best (keep-best saves it)."""
    sel["history"].append({"lr": lr, "epoch": epoch, **s.to_dict()})
    if s.beats(Score.from_dict(sel["best"])):
        sel.update(best=s.to_dict(), best_lr=lr, best_epoch=epoch, since_best=0)
        return True
    sel["since_best"] += 1
    return False


def stopped(sel: dict, patience: int) -> bool:
    """Early stopping: `patience` epochs in a row without a new best."""
    return sel["since_best"] >= patience
