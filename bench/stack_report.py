"""The stack bench's report: rows from the saved results, the tables in docs/results.md, the
plot docs/img/stack.png and the headline (see bench/stack.py)."""
from __future__ import annotations

import statistics
from pathlib import Path

from common import ROOT, measured_line, replace_table, save_results
from heavy import why_mixed
from stack_accuracy import accuracy_table, delta_cell, gain, protocol, test_summary
from stack_config import (DENSITY, EFFECTIVE_BATCH, HELD_OUT_USERS, LR_CANDIDATES, PROFILE,
                          RECIPES, STACK, chosen_lr, personalise_name, saved, session_users,
                          sweep_name, sweep_table)


def rows() -> list[dict]:
    """One row per configuration whose every stage has a saved result (others are pending)."""
    out = []
    for c in STACK:
        k = c.key()
        ex, me, pe, fi = (saved(f"{s}-{k}") for s in ("export", "measure", "peer", "fit"))
        users = HELD_OUT_USERS
        runs = [saved(personalise_name(c, u)) for u in users]
        session = [saved(personalise_name(c, u, True)) for u in session_users(c)]
        if None in (ex, me, pe, fi) or None in runs or None in session:
            continue
        after = [r["accuracy_after"] for r in runs]
        before = [r["accuracy_before"] for r in runs]
        per_window = c.items_per_window
        fit_commit = fi.get("commit") or "not recorded"
        if fit_commit != (me.get("commit") or "not recorded"):  # not beside other code's row
            fi = {"max_batch": None, "peak_bytes": None, "throughput_samples_per_s": None,
                  "next_batch_error": None, "stale_commit": fit_commit}
        fit_batch = fi["max_batch"]
        out.append({
            "commit": me.get("commit") or "not recorded", "date": me.get("date"),
            "machine": me.get("machine"),
            "config": c.name, "network": c.network, "summary": c.summary, "sparse": c.sparse,
            "density": DENSITY if c.sparse else 1.0, "recompute": c.recompute,
            "micro_batch": c.micro_batch, "accumulation": c.accumulation,
            "effective_batch_windows": EFFECTIVE_BATCH,
            "peak_bytes": me["peak_bytes"], "breakdown": me["breakdown"],
            "predicted_peak_bytes": me.get("predicted_peak_bytes"),
            "process_peak_rss_bytes": me["process_peak_rss_bytes"],
            "step_time_s": me["step_time_s"],
            "throughput_windows_per_s": round(EFFECTIVE_BATCH / me["step_time_s"], 3),
            "protocol": protocol(c.name), "users": list(users), "gain": gain(runs),
            "runs": [test_summary(r) for r in runs],
            "session": session and {"protocol": protocol(c.name, True),
                                    "users": list(session_users(c)), "gain": gain(session),
                                    "runs": [test_summary(r) for r in session]},
            "accuracy_before": before, "accuracy_after": after,
            "accuracy_after_mean": round(statistics.mean(after), 4),
            "accuracy_before_mean": round(statistics.mean(before), 4),
            "inference_agreement": [r["inference_agreement"] for r in runs],
            "personalise_time_s": [r["train_time_s"] for r in runs],
            "fit_profile": PROFILE, "fit_max_micro_batch": fit_batch,
            "fit_peak_bytes": fi["peak_bytes"],
            "fit_throughput_windows_per_s": (round(fi["throughput_samples_per_s"] / per_window, 3)
                                             if fi["throughput_samples_per_s"] else None),
            "fit_error": fi["next_batch_error"] if fit_batch == 0 else None,
            "fit_stale_commit": fi.get("stale_commit"),
            "torch_peak_rss_bytes": pe["peak_rss_bytes"],
            "torch_rss_before_step_bytes": pe["rss_before_step_bytes"],
            "torch_step_time_s": pe["step_time_s"], "torch_note": pe["note"],
            "export": ex, "pretrain": saved(
                f"pretrain-{c.network}-{'dst' if c.sparse else 'dense'}"),
        })
    return out


PRETRAIN_WHY = ("each row is the last recorded pretraining of its population model: a model "
                "is kept across code while its recipe is the same, and a clone without its "
                "cached file pretrains it again")


def mb(n: int | None) -> str:
    return "–" if n is None else f"{n / 1e6:,.1f}"


def tables(rs: list[dict]) -> dict[str, list[str]]:
    c1 = next((r for r in rs if r["config"] == "C1"), None)  # None: C1 still pending
    main = ["| config | network, technique | micro-batch × steps | measured peak (MB) | vs C1 "
            "| accuracy after (mean over users) | Δ vs C1 (points, 95% interval) | step time (s) "
            "| throughput (windows/s) | PyTorch peak RSS (MB) | PyTorch step time (s) "
            "| measured at |", "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rs:
        cut = f"{c1['peak_bytes'] / r['peak_bytes']:,.1f}×" if c1 else "–"
        delta = delta_cell(r, c1)
        main.append(
            f"| {r['config']} | {r['network']}, {r['summary']} | {r['micro_batch']} × "
            f"{r['accumulation']} | {mb(r['peak_bytes'])} | {cut} "
            f"| {r['accuracy_after_mean']:.3f} | {delta} | {r['step_time_s']:.2f} | {r['throughput_windows_per_s']:.1f} "
            f"| {mb(r['torch_peak_rss_bytes'])} | {r['torch_step_time_s']:.2f} "
            f"| {r['commit']} |")
    parts = ["| config | parameters | gradients | optimizer state | activations | other "
             "| total (MB) | edgetrain process RSS (MB) |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rs:
        b = r["breakdown"]
        parts.append(f"| {r['config']} | {mb(b['parameters'])} | {mb(b['gradients'])} "
                     f"| {mb(b['optimizer_state'])} | {mb(b['activations'])} | {mb(b['other'])} "
                     f"| {mb(r['peak_bytes'])} | {mb(r['process_peak_rss_bytes'])} |")
    acc = accuracy_table(rs)
    fit = [f"| config | largest micro-batch under {PROFILE} | measured peak there (MB) "
           "| throughput there (windows/s) |", "|---|---:|---:|---:|"]
    for r in rs:
        tp = r["fit_throughput_windows_per_s"]
        n = r["fit_max_micro_batch"]
        if r.get("fit_stale_commit"):
            fit.append(f"| {r['config']} | not re-measured at {r['commit']} (last measured at "
                       f"{r['fit_stale_commit']}) | – | – |")
            continue
        fit.append(f"| {r['config']} | {n or 'none: one item is over budget'} | {mb(r['fit_peak_bytes'])} "
                   f"| {'–' if tp is None else f'{tp:.1f}'} |")
    recipes = ["| network | dense epochs | DST epochs | batch | peak lr | optimizer steps "
               "| final train loss, dense → sparse | time (min) |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    records = []
    for net, r in RECIPES.items():
        dense = saved(f"pretrain-{net}-dense")
        sparse = saved(f"pretrain-{net}-dst")
        if sparse is None:
            continue
        records += [x for x in (dense, sparse) if x]
        d = dense or sparse["dense"]  # the DST run records the dense run it started from
        loss = f"{d['final_loss']:.3f} → {sparse['final_loss']:.3f}"
        minutes = (d["pretrain_time_s"] + sparse["pretrain_time_s"]) / 60
        recipes.append(f"| {net} | {r.epochs} | {r.dst_epochs} | {r.batch} | {r.lr:g} "
                       f"| {d['steps']} + {sparse['steps']} | {loss} | {minutes:.0f} |")
    if records:
        recipes = [pretrain_provenance(records), "", *recipes]
    sweep = ["| population model (sweep runs on) | lr | " + " | ".join(
        f"user {u}" for u in HELD_OUT_USERS) + " | mean | used by |",
        "|---|---:|" + "---:|" * (len(HELD_OUT_USERS) + 1) + "---|"]
    for rep in dict.fromkeys(c.sweep_config() for c in STACK):
        users = [c.name for c in STACK if c.sweep_config() == rep]
        chosen = chosen_lr(rep)
        before = [next((r["accuracy_before"] for lr in LR_CANDIDATES
                        if (r := saved(sweep_name(rep, lr, u)))), None) for u in HELD_OUT_USERS]
        for lr, accs in {"before": before, **sweep_table(rep)}.items():
            done = [a for a in accs if a is not None]
            mean = f"{statistics.mean(done):.3f}" if len(done) == len(accs) else "–"
            sweep.append(f"| {rep.network}{' DST' if rep.sparse else ''} ({rep.name}) "
                         f"| {lr if lr == 'before' else f'{lr:g}'} | "
                         + " | ".join("–" if a is None else f"{a:.3f}" for a in accs)
                         + f" | {mean} | {', '.join(users) if lr == chosen else ''} |")
    return {"stack-table": main, "stack-breakdown": parts, "stack-accuracy": acc,
            "stack-fit": fit, "stack-recipes": recipes, "stack-lr": sweep}


def plot(rs: list[dict], path: Path) -> None:
    """Three panels: each row's measured peak (log scale: the rows span 3,600x) with the
    PyTorch peer beside it; what the peak is made of, as shares (linear, so a part's size reads
    true); accuracy before and after personalisation."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    from device_sim.measure import CATEGORIES

    fig, (ax, ax_share, ax2) = plt.subplots(1, 3, figsize=(15, 4.6),
                                           gridspec_kw={"width_ratios": [1.1, 1, 1]})
    names = [r["config"] for r in rs]
    x = np.arange(len(rs))
    ax.bar(x - 0.2, [r["peak_bytes"] / 1e6 for r in rs], 0.4, label="edgetrain (allocator)")
    ax.bar(x + 0.2, [r["torch_peak_rss_bytes"] / 1e6 for r in rs], 0.4, color="0.6",
           label="PyTorch eager (peak RSS)")
    ax.set_yscale("log")
    ax.set_xticks(x, names)
    ax.set(ylabel="MB (log scale)",
           title=f"Peak training memory, {EFFECTIVE_BATCH} windows per step")
    for i, r in enumerate(rs):
        if rs[0]["config"] == "C1":
            ax.annotate(f"{rs[0]['peak_bytes'] / r['peak_bytes']:,.0f}×",
                        (i - 0.2, r["peak_bytes"] / 1e6), ha="center", va="bottom", fontsize=8)
    ax.legend(fontsize=8)
    bottom = np.zeros(len(rs))
    for cat in CATEGORIES:
        share = np.array([r["breakdown"][cat] / r["peak_bytes"] for r in rs])
        ax_share.bar(names, share, bottom=bottom, label=cat.replace("_", " "))
        bottom += share
    ax_share.set(ylim=(0, 1), ylabel="share of the measured peak",
                 title="What the peak is made of (linear)")
    ax_share.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.07), ncol=3)
    ax2.bar(x - 0.2, [r["accuracy_before_mean"] for r in rs], 0.4, color="0.75",
            label="population model")
    ax2.bar(x + 0.2, [r["accuracy_after_mean"] for r in rs], 0.4, color="tab:blue",
            label="after personalisation")
    for i, r in enumerate(rs):
        ax2.plot([i + 0.2] * len(r["accuracy_after"]), r["accuracy_after"], "k.", alpha=0.6)
    ax2.set_xticks(x, names)
    ax2.set(ylim=(0, 1), title=f"Accuracy, watch users {', '.join(map(str, HELD_OUT_USERS))}"
            " (C8: HAPT, session 2); dots: each user after")
    ax2.legend(fontsize=8, loc="lower left")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def report() -> None:
    rs = rows()
    save_results("stack", rs, derived=True)
    mixed = None if len({r["commit"] for r in rs}) <= 1 else (
        why_mixed("stack", lambda r: r["network"]) or
        "the stack is re-measured a network at a time (`bench/stack.py --network N`); the rows "
        "of older commits have not been run again yet")
    for name, lines in tables(rs).items():
        own = name == "stack-recipes" and lines[0].startswith("Measured at")  # tables()
        replace_table(ROOT / "docs" / "results.md", lines, name,
                      sources=None if own else ["stack"], why_mixed=mixed)
    if rs:
        plot(rs, ROOT / "docs" / "img" / "stack.png")
    done = {r["config"] for r in rs}
    pending = [c.name for c in STACK if c.name not in done]
    deck = [f"C{i}" for i in range(1, 7)]
    lines = headline(rs) if not set(deck) & set(pending) else [
        f"**Pending: {', '.join(pending)}.** The rows above are measured; the headline "
        "(C1 → C6 cut and accuracy change) is written when C1-C6 have run. "
        "`.venv/bin/python bench/stack.py` resumes where the last run stopped."]
    if pending and lines[0].startswith("**Headline"):
        lines += ["", f"**Pending: {', '.join(pending)}.** `.venv/bin/python bench/stack.py` "
                  "runs them (a network whose cached models are gone starts again from "
                  "pretraining)."]
    replace_table(ROOT / "docs" / "results.md", lines, "stack-reading")
    print("\n".join(lines))


def pretrain_provenance(records: list[dict]) -> str:
    """The recipes table's measured-at line: the pretraining records' own stamps."""
    stamps = [{k: r.get(k) for k in ("commit", "date", "machine")} for r in records]
    commands = sorted({r["command"] for r in records if r.get("command")})
    return measured_line(stamps, commands, PRETRAIN_WHY, "the population models' pretraining")


def provenance(rs: list[dict]) -> str:
    """Where the rows come from: one commit, or which rows each commit measured."""
    by: dict[str, list[str]] = {}
    for r in rs:
        by.setdefault(r.get("commit") or "not recorded", []).append(r["config"])
    if len(by) <= 1:
        return "one bench, every row from the same population models and recipes"
    return "rows of " + str(len(by)) + " commits: " + "; ".join(
        f"{', '.join(names)} at {commit}" for commit, names in by.items())


def headline(rs: list[dict]) -> list[str]:
    """The acceptance figures, computed from the rows (seed: >= 82x for <= 3.3 points)."""
    by = {r["config"]: r for r in rs}
    c1, c4, c6 = by["C1"], by["C4"], by["C6"]
    best = min(rs, key=lambda r: r["peak_bytes"])
    best_cut = c1["peak_bytes"] / best["peak_bytes"]
    best_delta = 100 * (best["accuracy_after_mean"] - c1["accuracy_after_mean"])
    cut = c1["peak_bytes"] / c6["peak_bytes"]
    drop = 100 * (c1["accuracy_after_mean"] - c6["accuracy_after_mean"])
    verdict = ("meets" if cut >= 82 and drop <= 3.3 else "misses") + " the seed's bar (≥ 82× " \
        "for ≤ 3.3 points)"
    aim = ("meets" if cut >= 150 and drop <= 2 else "misses") + " the team's aim (≥ 150× for ≤ 2 points)"
    paired = delta_cell(c6, c1)
    within = f"; paired on the same test windows {paired}" if "[" in paired else ""
    return [
        f"**Headline ({provenance(rs)}): "
        f"C1 → C6 cuts the measured peak {cut:,.0f}× "
        f"({c1['peak_bytes']:,} → {c6['peak_bytes']:,} bytes) for an accuracy change of "
        f"{-drop:+.1f} points ({c1['accuracy_after_mean']:.3f} → "
        f"{c6['accuracy_after_mean']:.3f}, mean over watch users "
        f"{', '.join(map(str, HELD_OUT_USERS))}, tested on the other arm{within}).** "
        f"That {verdict} and {aim}.",
        "",
        f"* Memory techniques on one network (C1 → C4, ResNet-50): "
        f"{c1['peak_bytes'] / c4['peak_bytes']:,.1f}× "
        f"(sparse {c1['peak_bytes'] / by['C2']['peak_bytes']:.2f}×, then checkpointing "
        f"{by['C2']['peak_bytes'] / by['C3']['peak_bytes']:.2f}×, then micro-batching "
        f"{by['C3']['peak_bytes'] / c4['peak_bytes']:.2f}×).",
        f"* Network change (C4 → C6): {c4['peak_bytes'] / c6['peak_bytes']:,.1f}× "
        f"(MobileNetV1 {c4['peak_bytes'] / by['C5']['peak_bytes']:.2f}×, then patches "
        f"{by['C5']['peak_bytes'] / c6['peak_bytes']:.2f}×).",
        f"* The smallest row, {best['config']} ({best['network']}, {best['summary']}): "
        f"{best_cut:,.0f}× below C1 ({best['peak_bytes']:,} bytes) at {best_delta:+.1f} points "
        f"against C1's accuracy ({best['accuracy_after_mean']:.3f}); the issue-19 bar (≥ 1,000× "
        f"with accuracy no lower than C1's) is "
        f"{'met' if best_cut >= 1000 and best_delta >= 0 else 'missed'}.",
        f"* Time: a step of {EFFECTIVE_BATCH} windows takes {c1['step_time_s']:.2f} s at C1 and "
        f"{c6['step_time_s']:.2f} s at C6 on this machine; PyTorch eager takes "
        f"{c1['torch_step_time_s']:.2f} s and {c6['torch_step_time_s']:.2f} s for the same steps.",
    ]
