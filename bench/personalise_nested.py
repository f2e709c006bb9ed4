"""A recipe chosen without the user it is reported for: nested selection over folds.

    .venv/bin/python bench/personalise.py --recipe R           # for every recipe R (RECIPES)
    .venv/bin/python bench/personalise_nested.py               # the table in docs/results.md

The product's recipe was chosen on some users and, for one rule, after a held-out user's
result had been read (docs/concepts.md, "Who chose the recipe"). Here nothing is: for each
fold of held-out users, every candidate recipe's mean gain is taken over the users of the
*other* folds (their session 2), the best candidate is the fold's recipe, and the fold's own
users are reported with it. Every user's figure comes from a recipe chosen without them
(cross-validated recipe selection); the interval resamples users and recordings as the gate's
does. Ties go to the candidate listed first (the product's recipe). The candidates are
bench/personalise.py's RECIPES, each run on the device through capped `edgetrain personalise`
runs at one commit: the table refuses rows of different commits.
"""
from __future__ import annotations

import argparse

import numpy as np

from common import ROOT, replace_table, save_results
from personalise import MODES, RECIPES, TIERS, folds, read_rows, rows_path
from personalise_report import stamp_of, stats_line, summary, HEAD

DOC = ROOT / "docs" / "results.md"


def gain(row: dict) -> float:
    return 100.0 * (row["accuracy_after"] - row["accuracy_before"])


def nested(by_recipe: dict[str, list[dict]], fold_users: tuple[tuple[int, ...], ...]
           ) -> tuple[list[dict], list[tuple[tuple[int, ...], str, dict]]]:
    """Each fold's users with the recipe that did best on the other folds' users; the rows
    chosen, and per fold (users, recipe, {recipe: mean gain over the other folds})."""
    chosen, choices = [], []
    for users in fold_users:
        scores = {}
        for name, rows in by_recipe.items():
            others = [gain(r) for r in rows if r["user"] not in users]
            scores[name] = float(np.mean(others)) if others else float("-inf")
        best = max(scores, key=lambda k: (scores[k], -list(by_recipe).index(k)))
        chosen += [r for r in by_recipe[best] if r["user"] in users]
        choices.append((users, best, scores))
    return chosen, choices


def main(dataset: str, protocol: str, tier: str) -> None:
    lines = [h.format(what="recipe") for h in HEAD]
    picks, out, everything = [], [], []
    for mode in MODES:
        by_recipe = {}
        for name in RECIPES:
            rows = [r for r in read_rows(rows_path(dataset, protocol, tier, name))
                    if r["mode"] == mode]
            if rows:
                by_recipe[name] = rows
        if not by_recipe:
            continue
        everything += [r for rows in by_recipe.values() for r in rows]
        for name, rows in by_recipe.items():
            s = summary(rows)
            out.append({"recipe": name, "mode": mode, **s})
            lines.append(stats_line(f"`{name}` for every user", mode, s))
        complete = [n for n, rows in by_recipe.items() if len(rows) == len(by_recipe[
            next(iter(by_recipe))])]
        chosen, choices = nested({n: by_recipe[n] for n in complete}, folds(dataset))
        s = summary(chosen)
        out.append({"recipe": "nested", "mode": mode, "choices": [
            {"fold": list(u), "recipe": c, "mean_gain_other_folds": sc} for u, c, sc in choices],
            **s})
        lines.append(stats_line("**nested: each fold's recipe chosen on the other folds**",
                                mode, s))
        picks.append(f"{mode}: " + ", ".join(f"users {u[0]}–{u[-1]} `{c}`"
                                             for u, c, _ in choices))
    if not everything:
        raise SystemExit("no rows: run bench/personalise.py --recipe R for each recipe first")
    head = [f"Measured at {stamp_of(everything)}; `bench/personalise.py --tier {tier} "
            "--recipe R` for R in "
            f"{', '.join(n for n in RECIPES if any(r['recipe'] == n for r in everything))}, "
            f"then `bench/personalise_nested.py --tier {tier}`. {dataset}, {protocol}, "
            f"`{tier}`. Recipes per fold (chosen on the other folds' users): "
            + "; ".join(picks) + ".", ""]
    block = "personalise-nested" + ("" if tier == "watchos-extension" else f"-{tier}")
    replace_table(DOC, head + lines, block)
    save_results(block, out, derived=True)
    print("\n".join(head + lines))


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dataset", default="hapt", choices=["hapt", "watch"])
    ap.add_argument("--protocol", default="later-session")
    ap.add_argument("--tier", default="watchos-extension", choices=sorted(TIERS))
    a = ap.parse_args()
    main(a.dataset, a.protocol, a.tier)
