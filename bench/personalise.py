"""Personalisation on the device for every user of a data set, as a watch lives it.

    .venv/bin/python bench/personalise.py                               # hapt, watchos-extension
    .venv/bin/python bench/personalise.py --tier mcu-2mb                # hapt, mcu-2mb
    .venv/bin/python bench/personalise.py --dataset watch --protocol within-set   # context
    .venv/bin/python bench/personalise_report.py                        # tables and plots

Each fold's population model pretrains on the other users (`edgetrain export --dataset D
--holdout-user ... --also-holdout ...`) and never sees its held-out users. Every held-out user
then personalises on the device: a capped `edgetrain personalise` run in a process of its own
(forked from a warm one that has imported the CLI: device_sim/warmcli.py) with the tier's
budget, once per mode (label-free BatchNorm adaptation; 1, 5 and all labelled windows per
class). The protocol is the data set's (edgetrain/datasets.py): for hapt, session
1 trains, the end of session 1 validates (on-device selection and the guard), session 2 tests
and is read once. The recipe (the product's defaults: frozen BatchNorm statistics while
training, learning rates 1e-4/3e-4/9e-4, 5 epochs, patience 2, a one-window guard margin) was
chosen on watch-data user 10 (docs/concepts.md). Adapting BatchNorm statistics to the user's
session-1 windows before training in every mode (`--adapt bn`), with the guard keeping the
adapted model unless it loses a validation window, was chosen on HAPT users 1-6 (fold 1) from
an earlier run of this bench: the report gives every mean with and without them. The
guard's rule for the adapted start (it may neither lose a validation window nor raise the
validation loss) was added after that run showed user 11, a held-out user, losing 8.2 points
to adaptation: on users 1-6 it costs one test window (user 6), so users 1-6 did not choose it;
it makes the guard rank the adapted start as it ranks every trained candidate (by loss).

Rows are appended to bench/results/personalise-<dataset>-<protocol>-<tier>.jsonl as they
finish, each with the commit, date and machine; a stopped run continues where it stopped, and
rows of another commit are measured again unless --keep-old. A recipe variant that acts on
training and selection only takes its label-free rows from the default recipe's rows of the
same commit (LABEL_FREE_AS_DEFAULT). Two runs go at a time, one ORT
thread each (nothing here is timed: the tables give accuracy and allocator bytes). A fold's
artifact is kept in .cache/personalise-folds/, named by its export command and the code commit,
so the recipes of one tier share their five exports (uncommitted code exports afresh).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from common import ROOT, code_commit, command_line, run, run_warm, stamp
from device_sim.profiles import TIER_PLANS
from edgetrain.manifest import SAVED_ACTIVATIONS

# every mode adapts BatchNorm statistics first (label-free); labelled modes then train
MODES = {"label-free": ["--labels-per-class", "0", "--adapt", "bn"],
         "1 label/class": ["--labels-per-class", "1", "--adapt", "bn"],
         "5 labels/class": ["--labels-per-class", "5", "--adapt", "bn"],
         "all labels": ["--adapt", "bn"]}
EPOCHS = 5
# Recipe variants for the nested selection (bench/personalise_nested.py): extra arguments on
# top of MODES, each variant's rows in their own file. "default" is the product's recipe.
RECIPES = {"default": [],
           "adapt-guard-windows": ["--adapt-guard", "windows"],
           "no-adapt": ["--adapt", "none"],
           "margin-0": ["--guard-margin", "0"],
           "mix-0.5": ["--mix", "0.5"],
           "mix-validation": ["--mix", "default"],
           "adapt-only": ["--epochs", "0"]}
# the modes a recipe can run (default: all): without adaptation, label-free has nothing to do
RECIPE_MODES = {"no-adapt": ("1 label/class", "5 labels/class", "all labels")}
# Recipes whose arguments act on training and selection only: their label-free runs
# (adaptation alone, no epochs, no selection) are the default's, so their label-free rows are
# the default recipe's rows of the same commit, marked `label_free_of` (the same checkpoint
# byte for byte: tests/test_label_free_recipes.py)
LABEL_FREE_AS_DEFAULT = ("adapt-guard-windows", "margin-0", "mix-0.5", "mix-validation",
                         "adapt-only")
RESULTS = ROOT / "bench" / "results"
FOLDS = ROOT / ".cache" / "personalise-folds"  # fold artifacts, by export command and code
PARALLEL_RUNS = 2  # personalisation runs at once, one ORT thread each
TUNING_USERS = {"hapt": (1, 2, 3, 4, 5, 6), "watch": (10,)}
RECIPE_CHOSEN_ON = ("the defaults on watch-data user 10 (docs/concepts.md); BatchNorm "
                    "adaptation before training on HAPT users 1-6; the guard's loss rule for it "
                    "after an earlier run showed HAPT user 11 losing 8.2 points (see docs)")


@dataclass(frozen=True)
class Tier:
    """A tier's plan as the product ships it (device_sim.profiles.TIER_PLANS), run here with
    one ORT thread: two runs side by side on a 2-core machine, neither spinning on the other."""
    device: str
    model: str = "imu_cnn"
    width: float | None = None
    update: str = "all"
    micro_batch: int = 8
    batchnorm_adapt: str = "batch"
    accumulation: int = 1
    threads: int = 1
    saved_activations: str = "fp32"  # --saved-activations int8: the plan with them in 8 bits

    @property
    def label(self) -> str:
        int8 = ", saved activations in 8 bits" if self.saved_activations == "int8" else ""
        return TIER_PLANS[self.device].label + int8


TIERS = {d: Tier(**asdict(p)) for d, p in TIER_PLANS.items()}


def folds(dataset: str) -> tuple[tuple[int, ...], ...]:
    """Held-out users per fold: hapt 5 x 6 users, watch 5 x 2."""
    size, users = (6, 30) if dataset == "hapt" else (2, 10)
    return tuple(tuple(range(lo, lo + size)) for lo in range(1, users + 1, size))


def rows_path(dataset: str, protocol: str, tier: str, recipe: str = "default",
              saved_activations: str = "fp32") -> Path:
    variant = ("" if recipe == "default" else f"-{recipe}") + (
        "" if saved_activations == "fp32" else f"-saved-{saved_activations}")
    return RESULTS / f"personalise-{dataset}-{protocol}-{tier}{variant}.jsonl"


def read_rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []


def export_args(dataset: str, tier: Tier, users: tuple[int, ...]) -> list[str]:
    return ["export", *TIER_PLANS[tier.device].export_args(), "--dataset", dataset,
            "--saved-activations", tier.saved_activations, "--holdout-user", str(users[0]),
            "--also-holdout", ",".join(map(str, users[1:])), "--threads", str(tier.threads)]


def fold_artifact(dataset: str, tier: Tier, users: tuple[int, ...], scratch: Path) -> Path:
    """The fold's artifact: exported once per export command and code commit and kept under
    FOLDS (written to a scratch name, then renamed, so a stopped export leaves nothing that
    looks finished); on uncommitted code, exported into `scratch` every run."""
    args = export_args(dataset, tier, users)
    code = code_commit()
    if code.endswith("+changes"):
        out = scratch / f"fold-{users[0]}"
        run(*args, "--out", str(out), "--json")
        return out
    key = hashlib.sha256(json.dumps([code, args]).encode()).hexdigest()[:16]
    out = FOLDS / f"{dataset}-{tier.device}-fold{users[0]}-{key}"
    if not (out / "manifest.json").is_file():
        FOLDS.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=FOLDS, prefix=".export-")) / "artifact"
        run(*args, "--out", str(tmp), "--json")
        shutil.rmtree(out, ignore_errors=True)
        tmp.rename(out)
        shutil.rmtree(tmp.parent)
    return out


def personalise_user(art: Path, dataset: str, protocol: str, tier: Tier, user: int, mode: str,
                     classes: int, out: Path, recipe: str = "default") -> dict:
    batch, k = step_shape(tier, classes if mode == "1 label/class" else None)
    return json.loads(run_warm(
        "personalise", str(art), "--user", str(user), "--dataset", dataset, "--protocol",
        protocol, "--device", tier.device, "--micro-batch", str(batch), "--accumulate", str(k),
        "--epochs", str(EPOCHS), "--out", str(out), "--json", *MODES[mode], *RECIPES[recipe]))


def step_shape(tier: Tier, items: int | None) -> tuple[int, int]:
    """(micro-batch, accumulation) of the tier's step, its step shrunk to `items` when there
    are only that many (one labelled window per class): the micro-batch the largest divisor
    of the step within the tier's, so a tier that micro-batches takes the steps of the tier
    it stands for."""
    step = tier.micro_batch * tier.accumulation
    if items is None or items >= step:
        return tier.micro_batch, tier.accumulation
    batch = max(d for d in range(1, min(tier.micro_batch, items) + 1) if items % d == 0)
    return batch, items // batch


def default_label_free(default: Path, rows: list[dict], recipe: str, commit: str
                       ) -> list[dict]:
    """The label-free rows of `commit` in `default` (the default recipe's file) that `rows`
    lacks, as rows of `recipe` (LABEL_FREE_AS_DEFAULT)."""
    have = {r["user"] for r in rows if r["mode"] == "label-free"}
    return [{**r, "recipe": recipe, "label_free_of": "default"} for r in read_rows(default)
            if r["mode"] == "label-free" and r["commit"] == commit and r["user"] not in have]


def main(dataset: str, protocol: str, tier: Tier, modes: list[str], keep_old: bool,
         recipe: str = "default") -> None:
    from edgetrain import datasets

    RESULTS.mkdir(parents=True, exist_ok=True)
    where = {**stamp(), "command": command_line()}
    path = rows_path(dataset, protocol, tier.device, recipe, tier.saved_activations)
    rows = read_rows(path)
    if not keep_old and any(r["commit"] != where["commit"] for r in rows):
        print(f"{path.name}: rows of other commits are measured again (--keep-old keeps them)")
        rows = [r for r in rows if r["commit"] == where["commit"]]
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    if recipe in LABEL_FREE_AS_DEFAULT and "label-free" in modes:
        default = rows_path(dataset, protocol, tier.device, "default", tier.saved_activations)
        copied = default_label_free(default, rows, recipe, where["commit"])
        with open(path, "a") as f:
            f.writelines(json.dumps(r) + "\n" for r in copied)
        rows += copied
    done = {(r["user"], r["mode"]) for r in rows}
    classes = len(datasets.recordings(dataset).classes)
    lock = threading.Lock()
    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(PARALLEL_RUNS) as pool:
        for users in folds(dataset):
            todo = [(u, m) for u in users for m in modes if (u, m) not in done]
            if not todo:
                continue
            art = fold_artifact(dataset, tier, users, Path(tmp))

            def one(user: int, mode: str, users=users, art=art) -> None:
                out = Path(tmp) / f"run-{user}-{mode.split()[0]}"
                r = personalise_user(art, dataset, protocol, tier, user, mode, classes, out,
                                     recipe)
                row = {**where, "dataset": dataset, "protocol": protocol, "tier": asdict(tier),
                       "network": tier.label, "fold": list(users), "user": user, "mode": mode,
                       "recipe": recipe, "recipe_chosen_on": RECIPE_CHOSEN_ON, **r}
                with lock, open(path, "a") as f:
                    f.write(json.dumps(row) + "\n")
                    print(json.dumps({k: row[k] for k in ("user", "mode", "accuracy_before",
                                                          "accuracy_after")}), flush=True)

            for job in [pool.submit(one, u, m) for u, m in todo]:
                job.result()  # a failed run stops the bench (its rows so far are kept)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dataset", default="hapt", choices=["hapt", "watch"])
    ap.add_argument("--protocol", help="default: the data set's (hapt later-session, watch "
                    "other-arm)")
    ap.add_argument("--tier", default="watchos-extension", choices=sorted(TIERS))
    ap.add_argument("--mode", action="append", choices=list(MODES),
                    help="modes to run (repeatable; default all four)")
    ap.add_argument("--keep-old", action="store_true", help="keep rows of other commits")
    ap.add_argument("--saved-activations", default="fp32", choices=SAVED_ACTIVATIONS,
                    help="the tier's plan with its saved activations in 8 bits (rows in their "
                    "own file; bench/personalise_int8.py compares them with fp32)")
    ap.add_argument("--recipe", default="default", choices=list(RECIPES),
                    help="a recipe variant for bench/personalise_nested.py (default: the "
                    "product's recipe)")
    a = ap.parse_args()
    from edgetrain.datasets import get
    modes = [m for m in a.mode or list(MODES) if m in RECIPE_MODES.get(a.recipe, MODES)]
    tier = replace(TIERS[a.tier], saved_activations=a.saved_activations)
    main(a.dataset, a.protocol or get(a.dataset).protocol, tier, modes, a.keep_old, a.recipe)
