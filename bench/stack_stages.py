"""The stack bench's stages (pretrain, export, lrsweep, personalise, measure, fit, peer) and
their run order (see bench/stack.py). Each stage returns the result saved under its name."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
from tqdm import tqdm

import stack_config as cfg
from common import WARM_IN_STEP
from edgetrain.atomicfile import atomic_write
from stack_config import (ARTIFACT_LR, ARTIFACTS, CROSS_SESSION, DENSITY,
                          HELD_OUT_USERS, LR_CANDIDATES, MASK_UPDATES, PERSONALISE, PROFILE,
                          ROOT, STACK, VAL_FRACTION, StackConfig, chosen_lr, cli,
                          personalise_name, pretrain_config, saved, session_folds,
                          session_pretrain_config, sweep_name)


def stage_pretrain(network: str, sparse: bool) -> dict:
    from exporters.models.pretrain import pretrain

    _, summary = pretrain(pretrain_config(network, sparse), show_progress=True)
    record = {k: v for k, v in summary.items() if k not in ("channel_mean", "channel_scale")}
    # the figures are those of the file's training (loaded where another bench made it)
    return {**record, "cache_sha256": cfg.model_file_sha256(record)}


def stage_export(c: StackConfig, fold: tuple[int, ...] | None = None) -> dict:
    """The configuration's artifact from the stack's population model, or (`fold`) from the
    model of one fold of its cross-session data set."""
    import onnxruntime

    from edgetrain.manifest import Plan
    from exporters.export import ExportOptions
    from exporters.models.pretrain import export_named

    onnxruntime.set_default_logger_severity(3)
    if fold is None:
        art, population = ARTIFACTS / c.key(), pretrain_config(c.network, c.sparse)
    else:
        art = ARTIFACTS / f"{c.key()}-{CROSS_SESSION[c.name][0]}-fold{fold[0]}"
        population = session_pretrain_config(c, fold)
    update, _, device = c.update.partition(":")
    m = export_named(population, art, ExportOptions(
        plan=Plan(micro_batch=c.micro_batch, accumulation_steps=c.accumulation),
        lr=ARTIFACT_LR, recompute=c.recompute, update=None if update == "all" else update,
        update_budget_bytes=cfg.UPDATE_DEVICES.get(device)), show_progress=False)
    return {"artifact": str(art), "trainable_bytes": m.trainable_bytes,
            "update": m.plan.update, "trainable": [t.name for t in m.trainable],
            "update_search": m.provenance.get("update_search"),
            "masks": len(m.masks), "kept_weights": sum(k.nnz for k in m.masks),
            "masked_numel": sum(k.numel for k in m.masks),
            "checkpoints": len(m.plan.checkpoints), "recomputed": len(m.plan.recomputed),
            "predicted_peak_bytes": m.predicted["peak_bytes"]}


def personalise_args(c: StackConfig, art: str, out: Path, lr: float) -> list[str]:
    args = ["personalise", art, "--budget", "64GiB", "--out", str(out), "--lr", repr(lr),
            "--epochs", str(PERSONALISE["epochs"]), "--threads", "1", "--resume", "--json",
            "--no-select"]  # the stack's light recipe, as its tables were made
    if c.sparse and c.update == "all":  # a frozen masked layer has no gradient to regrow by
        args += ["--mask-update", MASK_UPDATES["mask_update"],
                 "--mask-every", str(MASK_UPDATES["mask_every"]),
                 "--drop-fraction", str(MASK_UPDATES["drop_fraction"]),
                 "--mask-end", str(MASK_UPDATES["mask_end"])]
    return args


def stage_personalise(c: StackConfig, art: str, user: int, session: bool = False) -> dict:
    """One test user's run: the watch data's other arm, or (`session`) the later session of
    the configuration's cross-session data set (CROSS_SESSION)."""
    lr = chosen_lr(c)
    assert lr is not None, f"{c.name}: personalisation before its learning-rate sweep"
    out = cfg.run_folder(personalise_name(c, user, session).removeprefix("personalise-"))
    where = ["--dataset", CROSS_SESSION[c.name][0], "--protocol", CROSS_SESSION[c.name][1]] \
        if session else []
    return cli(*personalise_args(c, art, out, lr), *merged_args(c), *where, "--user", str(user))


def fold_export_name(c: StackConfig, fold: tuple[int, ...]) -> str:
    return f"export-{c.key()}-{CROSS_SESSION[c.name][0]}-fold{fold[0]}"


def test_runs(c: StackConfig):
    """(name, function) of the configuration's test runs: the watch data's held-out users,
    then, with a cross-session data set, each fold's export and its users' runs."""
    for u in HELD_OUT_USERS:
        yield personalise_name(c, u), lambda c=c, u=u: stage_personalise(
            c, saved(f"export-{c.key()}")["artifact"], u)
    if c.name not in CROSS_SESSION:
        return
    for fold in session_folds(c):
        name = fold_export_name(c, fold)
        yield name, lambda c=c, fold=fold: stage_export(c, fold)
        for u in fold:
            yield personalise_name(c, u, True), lambda c=c, u=u, name=name: \
                stage_personalise(c, saved(name)["artifact"], u, True)


def validation_files(user: int) -> tuple[Path, Path]:
    """The user's personalisation arm as train.npz and val.npz (edgetrain --data/--test)."""
    from edgetrain import data

    folder = ARTIFACTS / "lrsweep-data"
    paths = tuple(folder / f"user{user}-v{VAL_FRACTION:g}-{s}.npz" for s in ("train", "val"))
    if not all(p.is_file() for p in paths):
        folder.mkdir(parents=True, exist_ok=True)
        split = data.validation_split(data.load_recordings(), user, VAL_FRACTION)
        for path, (x, y) in zip(paths, split):  # two sweep threads may write one file
            with atomic_write(path) as tmp, open(tmp, "wb") as f:
                np.savez(f, x=x, y=y)
    return paths


def merged_args(c: StackConfig) -> list[str]:
    """The accuracy runs' micro-batch arguments (stack_config.merged_micro_batches)."""
    merged = cfg.merged_micro_batches(c)
    return [] if merged is None else ["--micro-batch", str(merged[0]),
                                      "--accumulate", str(merged[1])]


def stage_lrsweep(c: StackConfig, art: str, lr: float, user: int) -> dict:
    """One sweep run, its micro-batches merged as the test runs' are. Memory is not measured
    here."""
    train, val = validation_files(user)
    out = cfg.run_folder(sweep_name(c, lr, user))
    args = personalise_args(c, art, out, lr) + ["--data", str(train), "--test", str(val)]
    return {**cli(*args, *merged_args(c)),
            "population_model": cfg.population_key(c.network, c.sparse)}


def stage_measure(c: StackConfig, art: str) -> dict:
    """Peak, breakdown and step time: the median of 3 steps, or one step of WARM_IN_STEP
    micro-batches or more (C6, C7), which warms up within its first micro-batch (the peak is
    the same: C7 6,399,232 bytes at 1 and at 3 steps)."""
    steps = 1 if c.accumulation >= WARM_IN_STEP else 3
    return cli("measure", art, "--batch", str(c.micro_batch), "--accumulate",
               str(c.accumulation), "--steps", str(steps), "--json")


def stage_fit(art: str) -> dict:
    return cli("fit", art, "--device", PROFILE, "--json")


def stage_peer(c: StackConfig) -> dict:
    ex = saved(f"export-{c.key()}")
    spec = {"network": c.network, "width": 1.0, "density": DENSITY if c.sparse else 1.0,
            "trainable": ex["trainable"] if c.update != "all" else None,
            "recompute": c.recompute, "micro_batch": c.micro_batch,
            "accumulation": c.accumulation, "patch": c.network == "patch_mobilenet",
            "steps": 3 if c.accumulation <= 64 else 1}  # C6: 1,568 eager micro-steps a step
    p = subprocess.run([sys.executable, str(ROOT / "bench" / "torch_peer.py"), json.dumps(spec)],
                       capture_output=True, text=True, cwd=ROOT)
    if p.returncode != 0:
        raise SystemExit(f"torch peer {c.name} failed:\n{p.stderr[-3000:]}")
    return json.loads(p.stdout)


NETWORK_ORDER = ("imu_cnn", "patch_mobilenet", "mobilenet_v1", "resnet50")  # cheapest first


def tasks(only: str | None, network: str | None = None):
    """(name, function) in run order; names are the files under bench/results/stack/.

    Cheapest network first (patch MobileNet, MobileNetV1, then ResNet-50), each carried
    through every stage before the next is pretrained: a stage that fails does so within
    minutes, not after the hour of ResNet-50 pretraining."""
    order = [n for n in NETWORK_ORDER if network in (None, n)]
    nets = [(n, s) for n in order for s in (False, True)
            if any(c.network == n and c.sparse == s for c in STACK)]
    pretrains = [(f"pretrain-{n}-{'dst' if s else 'dense'}",
                  lambda n=n, s=s: stage_pretrain(n, s)) for n, s in nets]
    if only == "pretrain":
        yield from pretrains
        return
    for net in order:
        yield from (p for p in pretrains if p[0].startswith(f"pretrain-{net}-"))
        group = [c for c in STACK if c.network == net]
        for c in group:
            yield f"export-{c.key()}", lambda c=c: stage_export(c)
        for rep in dict.fromkeys(c.sweep_config() for c in group):
            for lr in LR_CANDIDATES:
                for u in HELD_OUT_USERS:
                    yield sweep_name(rep, lr, u), lambda c=rep, lr=lr, u=u: stage_lrsweep(
                        c, saved(f"export-{c.key()}")["artifact"], lr, u)
        for c in group:  # names resolve once the sweep is saved (main() re-lists tasks)
            yield from test_runs(c)
        # Timed stages after the group's personalisation runs, so nothing else of the
        # bench runs on the machine while they time.
        for c in group:
            yield f"measure-{c.key()}", lambda c=c: stage_measure(c, saved(f"export-{c.key()}")["artifact"])
            yield f"peer-{c.key()}", lambda c=c: stage_peer(c)
        for c in group:
            yield f"fit-{c.key()}", lambda c=c: stage_fit(saved(f"export-{c.key()}")["artifact"])


def group_names(network: str) -> list[str]:
    """Every task name of one network: its pretraining and its configurations' stages."""
    keys = [c.key() for c in STACK if c.network == network]
    return [n for n, _ in tasks(None)
            if n.startswith(f"pretrain-{network}-") or any(k in n for k in keys)]


def forget_stale_groups(network: str | None = None) -> list[str]:
    """Saved results travel with the repository; the models and artifacts they name live in
    .cache and may not (another machine). A network whose stages are not all done and whose
    saved pretraining or export lost its file starts over from pretraining, so that every
    row comes from one model. Only `network` (None: every network) is looked at: a run of
    one network never forgets another's results. Returns the result names forgotten."""
    forgotten = []
    for net in (n for n in NETWORK_ORDER if network in (None, n)):
        results = {n: saved(n) for n in group_names(net)}
        if all(results.values()):
            continue  # finished: nothing will read its files again
        lost = [n for n, r in results.items() if r and (
            (n.startswith("pretrain-") and not cfg.model_file_present(r))
            or (n.startswith("export-") and not (cfg.ROOT / r["artifact"]).is_dir()))]
        if lost:
            tqdm.write(f"{net}: the files behind {', '.join(lost)} are gone (another machine's "
                       f"cache?); redoing {net} from pretraining so every row comes from one model")
            for n, r in results.items():
                if r:
                    (cfg.STATE / f"{n}.json").unlink()
                    forgotten.append(n)
    return forgotten
