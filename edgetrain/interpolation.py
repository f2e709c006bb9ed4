"""Weight interpolation: between the start and the best trained candidate, chosen on the
user's validation slice (WiSE-FT, Wortsman et al. 2022, on one user).

Fine-tuning on a few minutes of one session pulls the weights towards that session; a point
on the straight line between the start (the population weights, with the user's BatchNorm
statistics when the run adapted them) and the best trained weights often keeps most of the
gain and less of the drift. After the candidates have trained, the runtime scores the listed
mixes w = start + mix x (best - start) on the validation slice, and the one that scores best
(Score.beats: the lowest validation loss) becomes the best the guard then judges. One mix is
a fixed rule (`--mix 0.5`: always halfway, a recipe chosen on other users); several let the
slice choose. The slice comes from the session that trained, so it mostly prefers mix 1 (the
trained weights): a fixed mix is what guards against the drift a later session shows.

Memory: both sets of weights are read from their checkpoint files, mapped, never copied; the
mix is written into the runtime's own parameter buffers (zero-copy views of ORT's tensors)
in place, one tensor at a time, with no temporary. Only trainable tensors mix:
frozen ones and BatchNorm statistics are the same in both (training never changes them).
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Callable

import numpy as np

from edgetrain.ortcheckpoint import trainable_weights
from edgetrain.selection import Score

DEFAULT_MIXES = (0.25, 0.5, 0.75, 1.0)  # fractions of the way from the start to the best


def check_mixes(mixes) -> None:
    """ValueError unless every mix is a finite number above 0 (the start, which the guard
    already weighs) and at most 1 (the best trained weights)."""
    for mix in mixes:
        if not (isinstance(mix, (int, float)) and math.isfinite(mix) and 0 < mix <= 1):
            raise ValueError(f"a mix must be above 0 (the start) and at most 1 (the best "
                             f"trained weights), got {mix!r}")


def _write_mix(parameters, manifest, s: dict, b: dict, mix: float) -> None:
    """Write s + mix x (b - s) into the runtime's trainable parameters (views by name)."""
    for spec in manifest.trainable:
        live = parameters[spec.name].data  # ORT's own buffer, written in place
        if mix == 1.0:  # the best itself, bit for bit
            np.copyto(live, b[spec.name])
            continue
        np.subtract(b[spec.name], s[spec.name], out=live)
        live *= np.float32(mix)
        live += s[spec.name]


def best_mix(parameters, manifest, start: Path, best: Path, mixes,
             scorer: Callable[[], Score]) -> tuple[float, Score, list[dict]]:
    """Score each mix on the validation slice (`scorer`, on the runtime's current weights);
    returns the mix with the best score (Score.beats; ties: the first listed), its score and
    every mix's score. The runtime is left holding the returned mix's weights. Both files are
    checked and mapped once for all the mixes."""
    winner, winner_score, scores = None, None, []
    with trainable_weights(start, manifest) as s, trainable_weights(best, manifest) as b:
        for mix in mixes:
            _write_mix(parameters, manifest, s, b, mix)
            got = scorer()
            scores.append({"mix": mix, **got.to_dict()})
            if winner_score is None or got.beats(winner_score):
                winner, winner_score = mix, got
        _write_mix(parameters, manifest, s, b, winner)
    return winner, winner_score, scores
