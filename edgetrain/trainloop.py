"""The body of a personalisation, run with the run folder held (edgetrain/personalise.py).

open the runtime under the cap -> (resume point?) -> preflight -> test accuracy before ->
population score on the validation slice -> (label-free: BatchNorm statistics from the user's
windows) -> for each candidate learning rate: start from the same weights (select/start),
epochs of micro-batches, after each epoch a validation score (a new best is saved to
select/best; `patience` epochs without one stop the candidate) -> the guard picks select/best
or the population model -> final checkpoint, inference model, test accuracy, result.json.
Without a validation slice there is one candidate and the last weights are kept.

Resume points (edgetrain/resume.py) carry the candidate, the scores and the best so far, so a
resumed run replays exactly what an uninterrupted one does.
"""
from __future__ import annotations

import math
import signal
import time
from pathlib import Path

import numpy as np

from edgetrain import names
from edgetrain import resume as resume_points
from edgetrain.candidates import (SELECT_DIR, check_select_files, prune_best, save_weights,
                                  score_epoch)
from edgetrain.faultpoints import fault_point
from edgetrain.feed import Feed
from edgetrain.interpolation import best_mix
from edgetrain.masks import UPDATERS
from edgetrain.runtime import DeviceRuntime
from edgetrain.samples import Rows
from edgetrain.selection import Score, decide, lr_grid, score, stopped, test_accuracy
from edgetrain.shuffle import Shuffle
from edgetrain.userdata import first_per_class


class TrainingDiverged(RuntimeError):
    """The loss became NaN or infinite: the weights can no longer improve."""


class Interrupted(RuntimeError):
    """SIGTERM or SIGINT arrived: a resume point was written at the current step."""

    def __init__(self, message: str, signum: int):
        super().__init__(message)
        self.signum = signum


def run(artifact, train, val, test, out: Path, budget_bytes, config, progress, threads,
        resume: bool, stop, on_phase=None) -> dict:
    """Train `artifact` on one user's data in a runtime capped at `budget_bytes`; returns the
    fields of a PersonaliseResult."""
    rt = DeviceRuntime(artifact, budget_bytes=budget_bytes, threads=threads, on_phase=on_phase)
    # The artifact is verified (hashes, graphs) before a run folder is trusted with it.
    m = rt.manifest
    b = config.micro_batch or m.plan.micro_batch
    k = config.accumulation_steps or m.plan.accumulation_steps
    lr0 = config.lr if config.lr is not None else rt.optimizer.get_learning_rate()
    # the values in force, not how they were given: the plan's micro-batch equals --micro-batch 8
    effective = {**config.fingerprint(), "micro_batch": b, "accumulation_steps": k, "lr": lr0,
                 "threads": rt.threads}
    settings = resume_points.run_settings(effective, *train, (*(val or ()), *(test or ())))
    fingerprint = resume_points.run_fingerprint(settings)
    point, point_ckpt, set_aside = _resume_point(artifact, out, resume, settings)
    rt.set_micro_batch(b)
    lrs = tuple(config.lrs or (lr_grid(lr0) if val is not None else (lr0,)))
    schedule = config.masks
    if schedule is not None and not m.trained_masks:
        raise ValueError(f"mask updates ({schedule.method}) need a sparse layer that trains; "
                         f"{artifact} " + (f"freezes every one (update plan {m.plan.update!r})"
                                           if m.masks else "is dense: export it with --density "
                                           "below 1"))
    stats = m.batchnorm_adapt_role is not None  # auto: adapt where BatchNorm statistics exist
    if (adapt := config.adapt == "bn" or config.adapt == "auto" and stats) and not stats:
        why = ("stores frozen weights in 8 bits, which the statistics graph cannot read (export "
               "it without --int8-frozen)" if m.plan.frozen_int8 else "has no BatchNorm layer")
        raise ValueError(f"--adapt bn (and label-free --labels-per-class 0) re-estimates "
                         f"BatchNorm statistics; {artifact} {why}: use labels, --adapt none")
    labelled = train
    if config.labels_per_class:
        chosen = first_per_class(np.asarray(train[1][:]), config.labels_per_class)
        labelled = (Rows(train[0], chosen), Rows(train[1], chosen))
    if point is not None:
        rt.load_checkpoint(point_ckpt)
    feed = Feed(*labelled, m)
    val_feed = Feed(*val, m) if val is not None else None
    test_feed = Feed(*test, m) if test is not None else None
    per_step = b * k
    steps_per_epoch = len(feed) // per_step
    if config.epochs > 0 and steps_per_epoch == 0:
        raise ValueError(f"the data gives {len(feed)} training items, fewer than one optimizer "
                         f"step needs (micro-batch {b} x {k} accumulation steps); use a smaller "
                         "--micro-batch or --accumulate, or supply more samples")
    # A budget too small fails here, before anything is read or written.
    rt.preflight(mask_gradients=schedule is not None and UPDATERS[schedule.method].needs_dense_grad,
                 batchnorm_stats=adapt, batchnorm_group=k)
    out.mkdir(parents=True, exist_ok=True)
    resume_points.clean_temporaries(out)
    rt.scratch_dir = str(out)  # mask updates' temporary state: nameless, in the run folder
    sel_dir = out / SELECT_DIR

    def evaluate_on(f: Feed) -> np.ndarray:
        return f.sample_logits(rt.eval_logits, b)

    def validation_score() -> Score:  # the runtime's current weights on the user's slice
        return score(evaluate_on(val_feed), val[1][:])

    t_select = time.perf_counter()
    if point is not None:
        before, sel = point.accuracy_before, dict(point.selection or {})
        check_select_files(sel_dir, sel)
    else:
        sel = {"candidate": 0, "since_best": 0, "history": []}
        before = None
        if test_feed is not None:
            before, sel["test_correct_before"] = test_accuracy(evaluate_on(test_feed), test[1])
        if val_feed is not None:
            sel["population"] = validation_score().to_dict()
        if adapt:  # label-free: every personalisation window, labelled or not, feeds the stats
            every = Feed(*train, m)  # of whole steps: a batch estimate is the step's (b x k)
            items = Shuffle(len(every), config.seed)(np.arange(len(every) // per_step * per_step))
            rt.reset_batchnorm(lambda: (every.inputs(items[i:i + b])
                                        for i in range(0, len(items), b)), group=k)
        if val_feed is not None:
            start = validation_score()
            sel.update(start=start.to_dict(), best=start.to_dict(), best_lr=None, best_epoch=0)
        if len(lrs) > 1 or val_feed is not None:
            sel_dir.mkdir(exist_ok=True)
            sel["start_sha256"] = save_weights(rt, sel_dir / "start")
            if val_feed is not None:
                sel.update(best_file="start", best_sha256=sel["start_sha256"])
    select_time = time.perf_counter() - t_select

    steps = mask_updates = regrown = 0
    mask_rng = np.random.default_rng([config.seed, 1])
    if point is not None:
        steps, mask_updates, regrown = point.steps, point.mask_updates, point.regrown_weights
        mask_rng.bit_generator.state = point.mask_rng_state
    total = config.epochs * steps_per_epoch * len(lrs)
    artifact_sha = resume_points.artifact_sha256(artifact)

    def commit(c: int, epoch: int, done_in_epoch: int, rng, epoch_rng_state: dict) -> None:
        if done_in_epoch == steps_per_epoch:  # the next step starts the next epoch
            epoch, done_in_epoch, epoch_rng_state = epoch + 1, 0, rng.bit_generator.state
        resume_points.commit(out, rt.save_checkpoint, {
            "artifact_manifest_sha256": artifact_sha, "run_sha256": fingerprint,
            "run_settings": settings,
            "steps": steps, "total_steps": total, "epoch": epoch,
            "step_in_epoch": done_in_epoch, "epoch_rng_state": epoch_rng_state,
            "mask_rng_state": mask_rng.bit_generator.state, "mask_updates": mask_updates,
            "regrown_weights": regrown, "accuracy_before": before,
            "selection": {**sel, "candidate": c}})

    t0 = time.perf_counter()
    for c in range(sel["candidate"], len(lrs)):
        here = point is not None and c == sel["candidate"]  # resuming inside this candidate
        if not here:
            if c > 0:
                rt.load_checkpoint(sel_dir / "start")
            sel["since_best"] = 0
        rt.set_learning_rate(lrs[c])
        rng = np.random.default_rng(config.seed if c == 0 else [config.seed, c])
        if here:
            rng.bit_generator.state = point.epoch_rng_state
        for epoch in range(point.epoch if here else 0, config.epochs):
            if val_feed is not None and stopped(sel, config.patience):
                break  # early stopping: this candidate has stopped improving
            epoch_rng_state = rng.bit_generator.state
            order = Shuffle(len(feed), int(rng.integers(2**63)))  # the epoch's order, computed

            def at(i: int) -> np.ndarray:  # the items of the epoch's micro-batch i
                return order(np.arange(i * b, (i + 1) * b))
            first = point.step_in_epoch if here and epoch == point.epoch else 0
            for s in range(first, steps_per_epoch):
                for j in range(k):
                    idx = at(s * k + j)
                    loss = rt.train_micro_batch(feed.inputs(idx), feed.labels(idx))
                    if not math.isfinite(loss):  # before the step that would spread it
                        raise TrainingDiverged(
                            f"training diverged: the loss is {loss} at optimizer step "
                            f"{steps + 1} (learning rate {lrs[c]:g}); {out} keeps its last good "
                            "resume point (nothing after it was saved). Lower the learning rate"
                            " (--lr) and --resume, or start again")
                rt.optimizer_step(grad_scale=1.0 / k)
                steps += 1
                fault_point("step")
                fraction = schedule.fraction_at(steps, total) if schedule else 0.0
                if fraction > 0:  # RigL scores by the gradient on this step's micro-batches
                    idx = [at(s * k + j) for j in range(k)]
                    batches = ([(feed.inputs(i), feed.labels(i)) for i in idx]
                               if UPDATERS[schedule.method].needs_dense_grad else [])
                    regrown += rt.update_masks(schedule.method, fraction, batches, mask_rng)
                    mask_updates += 1
                if s + 1 == steps_per_epoch and val_feed is not None:
                    score_epoch(rt, sel, validation_score(), lrs[c], epoch + 1,
                                sel_dir / f"best-{steps:08d}")
                if (s + 1 == steps_per_epoch or stop.signum is not None
                        or (config.checkpoint_every and steps % config.checkpoint_every == 0)):
                    commit(c, epoch, s + 1, rng, epoch_rng_state)
                    prune_best(out, sel_dir)
                if stop.signum is not None:
                    name = signal.Signals(stop.signum).name
                    raise Interrupted(f"stopped by {name} after optimizer step {steps}; a resume "
                                      f"point was written there: rerun with --resume to finish "
                                      f"({out})", stop.signum)
                if progress:
                    progress(steps, total, f"lr {lrs[c]:g}, epoch {epoch + 1}/{config.epochs}")
    train_time = time.perf_counter() - t0
    decision = None
    if val_feed is not None and config.mixes and sel["best_epoch"] > 0:
        mix, won, sel["mixes"] = best_mix(rt.state.parameters, m, sel_dir / "start",
                                          sel_dir / sel["best_file"], config.mixes,
                                          validation_score)
        if mix != 1.0:  # the runtime holds the mix: it becomes the best the guard judges
            sel.update(best=won.to_dict(), best_mix=mix, best_file="mix",
                       best_sha256=save_weights(rt, sel_dir / "mix"))
    if val_feed is not None:
        decision = decide(Score.from_dict(sel["population"]), Score.from_dict(sel["best"]),
                          sel["best_lr"], sel["best_epoch"], config.guard_margin,
                          Score.from_dict(sel["start"]) if adapt else None, config.adapt_guard,
                          sel.get("best_mix"))
        chosen = "start" if decision.statistics_only else sel["best_file"]
        rt.load_checkpoint(rt.folder / m.files[names.CHECKPOINT].path if decision.kept_population
                           else sel_dir / chosen)
    ckpt = rt.save_checkpoint(out / names.RUN_CHECKPOINT)
    after = agreement = correct_after = None
    infer_path = rt.export_inference(out / names.RUN_INFERENCE_MODEL)
    if test_feed is not None:
        logits = evaluate_on(test_feed)
        after, correct_after = test_accuracy(logits, test[1])
        rt.release_training()  # the inference check's weights go where training's were
        infer = test_feed.sample_logits(lambda xb: rt.inference_logits(infer_path, xb), b)
        agreement = float((infer.argmax(-1) == logits.argmax(-1)).mean())
    return dict(
        budget_bytes=budget_bytes, micro_batch=b, accumulation_steps=k, optimizer_steps=steps,
        train_items=len(feed), accuracy_before=before, accuracy_after=after,
        inference_agreement=agreement, checkpoint=str(ckpt), inference_model=str(infer_path),
        train_time_s=round(train_time, 3), select_time_s=round(select_time, 3),
        mask_method=schedule.method if schedule else None, mask_updates=mask_updates,
        regrown_weights=regrown, resumed_from_step=point.steps if point else None,
        damaged_resume_points_moved_to=set_aside, learning_rates=list(lrs),
        validation_windows=len(val[1]) if val is not None else None,
        guard=decision.to_dict() if decision else None, history=sel["history"],
        mixes=sel.get("mixes"),
        adapt="bn" if adapt else "none", labels_per_class=config.labels_per_class,
        test_correct_before=sel.get("test_correct_before"), test_correct_after=correct_after)


def _resume_point(artifact, out: Path, resume: bool, settings: dict):
    """(point, its checkpoint, where damaged points were set aside) for this run folder."""
    point = point_ckpt = set_aside = None
    if resume and resume_points.has_progress(out):  # else there is nothing yet: start fresh
        try:
            point, point_ckpt, _skipped = resume_points.latest(out)
        except resume_points.NoIntactPoint:  # kept aside, not lost; the run starts again
            set_aside = str(resume_points.set_aside_damaged(out))
    if point is not None:
        if point.artifact_manifest_sha256 != resume_points.artifact_sha256(artifact):
            raise resume_points.ResumeError(
                f"{out} was trained from another artifact (manifest sha256 "
                f"{point.artifact_manifest_sha256[:16]}…, {artifact} has "
                f"{resume_points.artifact_sha256(artifact)[:16]}…); resume with the artifact "
                "that started the run, or start a new run in another --out folder")
        if point.run_sha256 != resume_points.run_fingerprint(settings):
            raise resume_points.ResumeError(
                f"{out} was started with other settings or other data "
                f"({resume_points.differences(point.run_settings, settings)}); resume with the "
                "same data and options, or start a new run in another --out folder")
    elif not resume and resume_points.has_progress(out):
        raise resume_points.ResumeError(
            f"{out} already holds the progress of a personalisation run; pass --resume to "
            "continue it, or choose another --out folder (nothing was changed)")
    return point, point_ckpt, set_aside
