"""`export --plan auto`: the planner over export variants (host side: it exports twins and
runs capped measurements through device_sim)."""
from __future__ import annotations

import click

from edgetrain.budget import BudgetError


def plan_over_variants(out, m, build, recompute: str, update: str, extra_updates,
                       budget_bytes: int, quiet: bool, density: float = 1.0,
                       extra_densities=(), extra_weight_grads=()):
    """export --plan auto: plan the artifact in `out` and its twins (recompute sqrt when no
    recompute plan was given; each extra update plan; each extra density; kept-weights
    gradients when asked, on a sparse artifact), keep the variant whose confirmed plan
    measured fastest, write its plan there, and record every variant's outcome in
    provenance["plan_search"]["variants"]. If no variant has a plan and the artifact is
    sparse, each is tried again with kept-weights gradients (exporters/passes/sparsegrad.py). The
    step stays the one the export describes. build(folder, recompute, update, density,
    weight_grad[, micro_batch, accumulation]) exports one twin."""
    import shutil

    from device_sim.planner import best_variant, plan, write_plan
    from edgetrain.manifest import load_manifest

    step = m.plan.micro_batch * m.plan.accumulation_steps
    recomputes = [recompute] + (["sqrt"] if recompute == "none" else [])
    updates = [update] + [u for u in extra_updates if u != update]
    densities = [density] + [d for d in dict.fromkeys(extra_densities) if d != density]
    grads = m.plan.weight_grad
    kept_too = "kept" in extra_weight_grads and grads != "kept"
    folders, variants, results = {}, {}, {}

    def add(key: str, r: str, u: str, d: float, g: str, *at: int) -> None:
        i = len(folders)
        folder = out if i == 0 else out.parent / f".{out.name}.plan-{i}"
        if i:
            build(folder, r, u, d, g, *at)  # may raise (no recompute plan fits `at`)
        folders[key], variants[key] = folder, (r, u, d, g)
        results[key] = plan(folder, budget_bytes, step)

    try:
        for r, u, d in ((r, u, d) for u in updates for d in densities for r in recomputes):
            key = f"recompute {r}, update {u}" + (f", density {d:g}" if len(densities) > 1
                                                  else "")
            add(key, r, u, d, grads)
            if kept_too and d < 1:  # a dense twin has no masked layer
                add(f"{key}, kept weight gradients", r, u, d, "kept")
        if best_variant(results) is None and m.masks and grads == "dense" and not kept_too:
            # nothing fits: the kept-weights gradient (less memory, a slower step) as well
            for key in list(folders):
                r, u, d, _ = variants[key]
                add(f"{key}, kept weight gradients", r, u, d, "kept")
        if "budget" not in recomputes:  # larger micro-batches, recompute planned for each
            budget_recompute_twins(best_variant(results), variants, results, step, add)
        for k, res in results.items():
            c = res.chosen
            if not quiet:
                click.echo(f"plan search, {k}: " + (
                    f"micro-batch {c.micro_batch} x {c.accumulation_steps}, "
                    f"{c.measured_step_time_s:.3f} s a step, measured peak "
                    f"{c.measured_peak_bytes:,} bytes" if c else f"no plan ({res.reason})"))
        best = best_variant(results)
        if best is None:
            why = "; ".join(f"{k}: {res.reason}" for k, res in results.items())
            raise BudgetError(f"no micro-batch of a {step}-item step trains within "
                              f"{budget_bytes} bytes ({why}); the artifact in {out} keeps the "
                              "plan it was given. Try a larger budget or --plan-update head",
                              budget_bytes, None)
        rebuilt = rebuild_at_plan(out, folders, best, variants[best], results, build,
                                  budget_bytes, m.plan.micro_batch, quiet)
        write_plan(folders[best], results[best])
        record_variants(folders[best], best, results, rebuilt)
        if folders[best] != out:
            shutil.rmtree(out)
            folders[best].rename(out)
    finally:
        for f in folders.values():
            if f != out and f.exists():
                shutil.rmtree(f)
    return load_manifest(out)


BUDGET_RECOMPUTE_SIZES = 3  # micro-batches above the best plan's tried with recompute budget


def budget_recompute_twins(base: str | None, variants, results, step: int, add) -> None:
    """The best variant's twins exported at the next BUDGET_RECOMPUTE_SIZES micro-batches
    above its plan's (divisors of the step), each with the recompute plan the budget planner
    finds for that micro-batch (exporters/plans/recompute/planners.py: fewest recomputed FLOPs
    predicted to fit). A larger micro-batch can outrun the recomputation: C6 on
    `watchos-extension` fits 2 patches a call with `sqrt`, 7 with 4 checkpoints. Stops at the
    first micro-batch no recompute plan fits (a larger one would not fit either)."""
    from device_sim.planner import sizes

    if base is None:
        return
    r, u, d, g = variants[base]
    chosen = results[base].chosen.micro_batch
    larger = [s for s in sizes(step) if s > chosen and step % s == 0][:BUDGET_RECOMPUTE_SIZES]
    for micro in larger:
        try:
            add(f"recompute budget at micro-batch {micro}, " + base.split(", ", 1)[1],
                "budget", u, d, g, micro, step // micro)  # the base's update, density, grads
        except ValueError:  # "no recompute plan fits the budget"
            return


REBUILT_SLOWER_RATIO = 1.05  # the rebuilt artifact is kept unless its step measures slower


def rebuild_at_plan(out, folders, best: str, variant, results, build, budget_bytes: int,
                    exported_micro_batch: int, quiet: bool) -> dict | None:
    """Export the winning variant again at its chosen micro-batch, where that differs from
    the one exported: what an export decides by the micro-batch (the recompute plan, the
    gradient rewrites, the BatchNorm fold) is then decided for the plan that runs, and the
    manifest's prediction is made at the micro-batch the graph was built for. One capped run
    confirms it; it replaces the planned artifact if it fits and its step measures no more
    than REBUILT_SLOWER_RATIO slower. Returns what happened (None: nothing to rebuild)."""
    import dataclasses

    from device_sim.measure import measure
    from edgetrain.manifest import load_manifest

    res = results[best]
    c = res.chosen
    if c.micro_batch in (exported_micro_batch, load_manifest(folders[best]).plan.micro_batch):
        return None  # built for the micro-batch it runs (a budget-recompute twin is)
    folder = out.parent / f".{out.name}.plan-at-plan"
    folders[f"{best}, rebuilt"] = folder
    build(folder, *variant, c.micro_batch, c.accumulation_steps)
    predicted = load_manifest(folder).predicted
    record = {"micro_batch": c.micro_batch, "predicted_peak_bytes": predicted["peak_bytes"]}
    try:
        got = measure(folder, c.micro_batch, budget_bytes, c.accumulation_steps, 2, res.threads)
    except BudgetError as e:
        record.update(measured_peak_bytes=e.needed_bytes, kept=False, reason="over budget")
    else:
        kept = got.step_time_s <= c.measured_step_time_s * REBUILT_SLOWER_RATIO
        record.update(measured_peak_bytes=got.peak_bytes, measured_step_time_s=got.step_time_s,
                      kept=kept, reason="fits" if kept else "slower")
        if kept:  # the planned twin stays listed, so that it is removed with the others
            folders[f"{best}, as planned"], folders[best] = folders[best], folder
            chosen = dataclasses.replace(c, predicted_peak_bytes=predicted["peak_bytes"],
                                         measured_peak_bytes=got.peak_bytes,
                                         measured_step_time_s=got.step_time_s)
            results[best] = dataclasses.replace(res, artifact=str(folder), chosen=chosen)
    if not quiet:
        click.echo(f"rebuilt at micro-batch {c.micro_batch}: {record['reason']}, measured peak "
                   f"{record['measured_peak_bytes']:,} bytes"
                   + ("" if record["kept"] else "; the planned artifact is kept"))
    return record


def record_variants(folder, best: str, results, rebuilt: dict | None = None) -> None:
    """Each variant's outcome beside the chosen plan: its confirmed plan (micro-batch x
    accumulation, measured step time and peak) or why it had none."""
    import dataclasses

    from edgetrain.manifest import load_manifest

    variants = {}
    for key, res in results.items():
        c = res.chosen
        variants[key] = ({"micro_batch": c.micro_batch,
                          "accumulation_steps": c.accumulation_steps,
                          "measured_step_time_s": c.measured_step_time_s,
                          "measured_peak_bytes": c.measured_peak_bytes} if c
                         else {"reason": res.reason})
    m = load_manifest(folder)
    search = {**m.provenance["plan_search"], "variant": best, "variants": variants,
              "rebuilt_at_plan": rebuilt}
    dataclasses.replace(m, provenance={**m.provenance, "plan_search": search}).write(folder)
