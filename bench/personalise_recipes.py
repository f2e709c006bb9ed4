"""What trains, and how it carries to the test: four recipes under each protocol of a data set.

    .venv/bin/python bench/personalise_recipes.py --model imu_cnn          # watch, ~1 min
    .venv/bin/python bench/personalise_recipes.py --model imu_cnn --dataset hapt   # ~3 min
    .venv/bin/python bench/personalise_recipes.py --model patch_mobilenet  # ~25 min
    .venv/bin/python bench/personalise_recipes.py --report                 # table in docs/

A host-side replay in torch (not the device runtime, and never the gate): it replays the
device's recipe (frozen
BatchNorm statistics, AdamW, 5 epochs, the best epoch by validation loss, the
guard's one-window margin) on the same fold models as bench/personalise.py, and varies two
things the device run cannot vary cheaply:

- what trains ("biases" here also trains the classifier): every weight; the classifier only; biases, norm affines and the classifier; every
  weight with population replay (each micro-batch joined by as many items drawn from 300
  population windows, which an artifact could ship on flash);
- micro-batches of 8 items for raw-IMU networks, 32 patches for patch networks (49 patches a
  window make 8-patch steps too slow for a study on 2 cores; the device bench uses 8);
- the protocol (edgetrain/datasets.py): for the watch data `other-arm` (a placement shift)
  and `within-set` (an upper bound: the end of each recording of the same set tests); for
  hapt `later-session`.

Rows go to bench/results/personalise-recipes.json; --report writes the table between the
markers `personalise-recipes` in docs/results.md.
"""
from __future__ import annotations

import argparse
import json

import numpy as np
import torch

from common import ROOT, load_results, replace_table, save_results, stamp
from personalise import folds
from personalise_report import PROTOCOL_NAMES
from edgetrain import datasets
from exporters.models.hostfinetune import Inputs, evaluate, finetune
from exporters.models.networks import build_network
from exporters.models.pretrain import PretrainConfig, pretrain

RECIPES = {"all weights": dict(lr=1e-4, which="all"),
           "classifier only": dict(lr=1e-3, which="head"),
           "biases + norms + classifier": dict(lr=1e-3, which="bias"),
           "all weights + population replay": dict(lr=1e-4, which="all", replay=True)}
EPOCHS, REPLAY_WINDOWS, SEED = 5, 300, 0


def trained_names(model: torch.nn.Module, which: str) -> set[str]:
    return {n for n, p in model.named_parameters()
            if which == "all" or n.startswith("classifier") or (which == "bias" and p.ndim == 1)}


def main(model: str, dataset: str) -> None:
    torch.set_num_threads(2)
    # other networks' rows are kept; one from before rows carried their commit says so, rather
    # than taking this run's stamp from the file
    rows = [{"commit": "not recorded", "date": None, "machine": None, **r}
            for r in load_results("personalise-recipes", [])
            if (r["model"], r["dataset"]) != (model, dataset)]
    here = stamp()  # each row says where it was measured: a run replaces one model's rows
    for users in folds(dataset):
        pop, summary = pretrain(PretrainConfig(model=model, holdout_user=users[0],
                                               also_held_out=users[1:], dataset=dataset),
                                show_progress=False, cache_dir=ROOT / ".cache" / "pretrain")
        inputs = Inputs(build_network(model, 1)[1], summary["channel_mean"],
                        summary["channel_scale"])
        xp, yp = datasets.population_windows(dataset, users)
        pick = np.random.default_rng(SEED).choice(len(yp), REPLAY_WINDOWS, replace=False)
        replay = (inputs(xp[pick]), torch.from_numpy(yp[pick]))
        for user in users:
            for protocol in datasets.get(dataset).protocols:
                split = datasets.user_split(dataset, user, 0.25, protocol)
                (xt, yt), (xv, yv), (xs, ys) = split.train, split.val, split.test
                X, Xv, Xs = inputs(xt), inputs(xv), inputs(xs)
                yt, yv, ys = map(torch.from_numpy, (yt, yv, ys))
                _, pop_val, _ = evaluate(pop, Xv, yv)
                before = evaluate(pop, Xs, ys)[2]
                for name, r in RECIPES.items():
                    m, epoch = finetune(pop, X, yt, Xv, yv, r["lr"],
                                        trained_names(pop, r["which"]), EPOCHS,
                                        replay=replay if r.get("replay") else None, seed=SEED)
                    val, after = evaluate(m, Xv, yv)[1], evaluate(m, Xs, ys)[2]
                    kept = val < pop_val + 1  # the device's guard: one more window right
                    rows.append({**here, "model": model, "dataset": dataset, "user": user,
                                 "protocol": protocol,
                                 "recipe": name, "epoch": epoch, "val_before": pop_val,
                                 "val_after": val, "val_windows": len(yv),
                                 "test_before": float(before.mean()),
                                 "test_after": float(after.mean()),
                                 "test_guarded": float((before if kept else after).mean()),
                                 "guard_kept_population": bool(kept)})
                    print(json.dumps({k: rows[-1][k] for k in ("user", "protocol", "recipe",
                                                               "test_before", "test_after")}),
                          flush=True)
    save_results("personalise-recipes", rows)


def report() -> None:
    rows = load_results("personalise-recipes")
    lines = ["| network | data, protocol | what trains | mean gain (points) | mean gain after "
             "the guard | worst user after the guard | users > 1 point below after the guard |",
             "|---|---|---|---:|---:|---|---:|"]
    for model, dataset, protocol in dict.fromkeys((r["model"], r["dataset"], r["protocol"])
                                                  for r in rows):
        for recipe in RECIPES:
            rs = [r for r in rows if (r["model"], r["dataset"], r["protocol"], r["recipe"]) ==
                  (model, dataset, protocol, recipe)]
            if rs:
                raw = [100 * (r["test_after"] - r["test_before"]) for r in rs]
                guarded = [100 * (r["test_guarded"] - r["test_before"]) for r in rs]
                worst = int(np.argmin(guarded))
                lines.append(f"| {model} | {dataset}, {PROTOCOL_NAMES[protocol]} | {recipe} | "
                             f"{np.mean(raw):+.1f} | {np.mean(guarded):+.1f} | user "
                             f"{rs[worst]['user']}: {guarded[worst]:+.1f} | "
                             f"{sum(g < -1 for g in guarded)} of {len(rs)} |")
    replace_table(ROOT / "docs" / "results.md", lines, "personalise-recipes",
                  sources=["personalise-recipes"], why_mixed="each network and data set is "
                  "measured by its own run (`--model M --dataset D`)")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="imu_cnn")
    ap.add_argument("--dataset", default="watch", choices=sorted(datasets.DATASETS))
    ap.add_argument("--report", action="store_true")
    a = ap.parse_args()
    report() if a.report else main(a.model, a.dataset)
