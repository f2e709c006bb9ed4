"""Every benchmark `make results` runs, in the order it runs them (bench/all.py).

A step is data: the bench script and its arguments, the result files it writes under
bench/results/, the arguments that rebuild its tables from those files alone (None when its
tables are rebuilt by a later step), and an estimate of its time on 2 cores, replaced by the
time measured once a run has recorded one. Steps marked `full` run only with `--full`: the
ResNet-50 rows (bench/heavy.py), the filing-day baseline (a fixed old commit re-measured),
the fleet's 1,003 users on one worker, whose tables keep the rows of the last `--full` run and
say so, and extras no table of docs/results.md needs. A step comes after every step whose results it
reads (feed_paths reads eager_race's; filing_baseline reads planner's; the personalisation
reports read the personalisation runs').
"""
from __future__ import annotations

from dataclasses import dataclass

from heavy import is_heavy

TIERS = ("watchos-extension", "mcu-2mb", "mcu-1mb", "mcu-256kb")
# the recipe variants each tier's nested selection chooses among (bench/personalise.py RECIPES)
TIER_RECIPES = {"watchos-extension": ("adapt-guard-windows", "no-adapt", "margin-0", "mix-0.5",
                                      "mix-validation", "adapt-only"),
                "mcu-2mb": ("adapt-guard-windows", "mix-0.5", "adapt-only"),
                "mcu-1mb": ("adapt-guard-windows", "mix-0.5", "adapt-only"),
                "mcu-256kb": ("mix-0.5",)}


@dataclass(frozen=True)
class Step:
    name: str
    script: str  # under bench/
    args: tuple[str, ...] = ()
    estimate_min: float = 5.0
    report_args: tuple[str, ...] | None = None  # None: no tables of its own to rebuild
    full: bool = False
    writes: tuple[str, ...] = ()  # result names (bench/results/<name>.json or .jsonl)

    def argv(self, report: bool = False) -> list[str]:
        return [f"bench/{self.script}", *(self.report_args if report else self.args)]


def _personalise() -> list[Step]:
    """The personalisation runs (every HAPT user, session 1 -> 2, each tier's shipped plan),
    the recipe variants the nested selection chooses among, 8-bit saved activations, and the
    watch data's two protocols (context); then their reports."""
    out = []
    for tier in TIERS:
        out.append(Step(f"personalise-{tier}", "personalise.py", ("--tier", tier), 20,
                        writes=(f"personalise-hapt-later-session-{tier}",)))
        for recipe in TIER_RECIPES[tier]:
            out.append(Step(f"personalise-{tier}-{recipe}", "personalise.py",
                            ("--tier", tier, "--recipe", recipe), 20,
                            writes=(f"personalise-hapt-later-session-{tier}-{recipe}",)))
    out.append(Step("personalise-watchos-extension-int8", "personalise.py",
                    ("--tier", "watchos-extension", "--saved-activations", "int8"), 25,
                    writes=("personalise-hapt-later-session-watchos-extension-saved-int8",)))
    for protocol in ("within-set", "other-arm"):
        out.append(Step(f"personalise-watch-{protocol}", "personalise.py",
                        ("--dataset", "watch", "--protocol", protocol), 8,
                        writes=(f"personalise-watch-{protocol}-watchos-extension",)))
    out.append(Step("personalise-report", "personalise_report.py", (), 1, (),
                    writes=("personalise",)))
    for tier in TIERS:
        block = "personalise-nested" + ("" if tier == "watchos-extension" else f"-{tier}")
        out.append(Step(f"personalise-nested-{tier}", "personalise_nested.py", ("--tier", tier),
                        1, ("--tier", tier), writes=(block,)))
    out += [Step("personalise-gate", "personalise_gate.py", (), 1, ()),
            Step("personalise-int8", "personalise_int8.py", (), 1, (),
                 writes=("personalise-int8",)),
            Step("personalise-recipes", "personalise_recipes.py", ("--model", "imu_cnn"), 1,
                 ("--report",), writes=("personalise-recipes",)),
            Step("personalise-recipes-hapt", "personalise_recipes.py",
                 ("--model", "imu_cnn", "--dataset", "hapt"), 3, ("--report",),
                 writes=("personalise-recipes",)),
            Step("personalise-recipes-patch", "personalise_recipes.py",
                 ("--model", "patch_mobilenet"), 25, ("--report",), full=True,
                 writes=("personalise-recipes",))]
    return out


# The stack bench a network at a time, cheapest first (bench/stack_stages.NETWORK_ORDER), each
# through pretraining, export, learning-rate sweep, personalisation, measure, PyTorch peer and
# fit; then its tables. Estimates from the runs of 2026-11-27 on 2 cores (imu_cnn 3 min and
# patch_mobilenet 21 min with their population models cached; the pretraining times are
# bench/results/stack's pretrain-* records); a run through bench/all.py replaces them.
STACK_NETWORKS = (("imu_cnn", 10), ("patch_mobilenet", 30), ("mobilenet_v1", 40),
                  ("resnet50", 130))


def _stack() -> list[Step]:
    return [*(Step(f"stack-{network}", "stack.py", ("--network", network), minutes,
                   full=is_heavy(network), writes=("stack",))  # its rows, as it ends
              for network, minutes in STACK_NETWORKS),
            Step("stack", "stack.py", ("--report",), 1, ("--report",), writes=("stack",))]


STEPS: tuple[Step, ...] = (
    Step("demo", "demo.py", (), 2, ("--report",), writes=("demo",)),
    Step("scenarios", "scenarios.py", (), 5, ("--report",), writes=("scenarios",)),
    Step("gradkernels", "gradkernels.py", (), 1, ("--report",), writes=("gradkernels",)),
    Step("nchwc", "nchwc.py", (), 30, ("--report",), writes=("nchwc",)),
    Step("convbn", "convbn.py", (), 4, ("--report",), writes=("convbn",)),
    Step("convbn-resnet50", "convbn.py", ("--heavy",), 5, ("--report",), full=True,
         writes=("convbn",)),
    Step("sparse", "sparse.py", (), 2, ("--report",), writes=("sparse",)),
    Step("update-plans", "update_plans.py", (), 5, ("--report",), writes=("update_plans",)),
    Step("saved-activations", "saved_activations.py", (), 10, ("--report",),
         writes=("saved_activations",)),
    Step("saved-activations-peaks", "saved_activations.py", ("--peaks",), 4,
         ("--peaks", "--report"), writes=("saved_activations_peaks",)),
    Step("peak-tensors", "peak_tensors.py", (), 1, ("--report",), writes=("peak_tensors",)),
    Step("predictor", "predictor.py", (), 30, ("--report",),
         writes=("predictor", "predictor_batchnorm")),
    Step("predictor-resnet50", "predictor.py", ("--heavy",), 20, ("--report",), full=True,
         writes=("predictor", "predictor_batchnorm")),
    Step("recompute", "recompute.py", (), 16, ("--report",), writes=("recompute",)),
    Step("recompute-resnet50", "recompute.py", ("--heavy",), 25, ("--report",), full=True,
         writes=("recompute",)),
    Step("planner", "planner.py", (), 15, ("--report",), writes=("planner",)),
    Step("planner-resnet50", "planner.py", ("--heavy",), 10, ("--report",), full=True,
         writes=("planner",)),
    Step("filing-baseline", "filing_baseline.py", (), 37, ("--report",), full=True,
         writes=("filing_baseline",)),
    Step("eager-race", "eager_race.py", (), 20, ("--report",),
         writes=("eager_race",)),
    Step("eager-race-resnet50", "eager_race.py", ("--heavy",), 40, ("--report",), full=True,
         writes=("eager_race",)),
    Step("feed-paths", "feed_paths.py", (), 2, ("--report",), writes=("feed_paths",)),
    Step("fleet", "fleet.py", (), 9, ("--report",), writes=("fleet",)),
    Step("fleet-one-worker", "fleet.py", ("--heavy",), 12, ("--report",), full=True,
         writes=("fleet",)),
    Step("reset", "reset.py", (), 8, ("--report",), writes=("reset",)),
    Step("dst", "dst.py", (), 15, ("--report",), writes=("dst",)),
    *_personalise(),
    *_stack(),
)


def by_name(names: list[str], among: tuple[Step, ...] = STEPS) -> list[Step]:
    """The steps named, in run order; SystemExit naming any unknown one."""
    known = {s.name: s for s in among}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise SystemExit(f"no bench step {', '.join(unknown)}; `bench/all.py --list` names "
                         "them all")
    return [s for s in among if s.name in names]
