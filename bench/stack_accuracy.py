"""The stack's accuracy figures: which test each row's accuracy comes from, the gain over its
users with a 95% interval that resamples users and their test recordings
(edgetrain/intervals.py), and each row against C1 on the same test windows (see bench/stack.py)."""
from __future__ import annotations

from edgetrain.intervals import UserTest, gain_interval
from stack_config import CROSS_SESSION

OTHER_ARM = "watch data, other arm (stress: personalised on one arm, tested on the other)"


def protocol(config: str, session: bool = False) -> str:
    """What a row's accuracy was tested on: the watch data's other arm, or (`session`) the
    later session of its cross-session data set."""
    if session:
        dataset, name = CROSS_SESSION[config]
        return f"{dataset.upper()}, {name} (personalised on session 1, tested on session 2)"
    return OTHER_ARM


def test_summary(run: dict) -> dict:
    """What the report keeps of a run: its accuracies and which test windows were right."""
    return {k: run.get(k) for k in ("accuracy_before", "accuracy_after", "optimizer_steps",
                                    "mask_updates", "micro_batch", "accumulation_steps",
                                    "test_correct_before", "test_correct_after",
                                    "test_recordings")}


def user_test(run: dict) -> UserTest | None:
    """A personalisation run's test windows (which were right, per recording), if it says."""
    if not run.get("test_correct_before") or not run.get("test_recordings"):
        return None
    return UserTest.of(run["test_correct_before"], run["test_correct_after"],
                       run["test_recordings"])


def gain(runs: list[dict]) -> dict | None:
    """Mean gain over the runs' users with a 95% interval resampling users and recordings."""
    tests = [user_test(r) for r in runs]
    return None if not tests or None in tests else gain_interval(tests).to_dict()


def against(base: list[dict], runs: list[dict]) -> dict | None:
    """Accuracy after personalising, `runs` minus `base` on the same users' same test windows:
    the paired interval of the difference (users and recordings resampled)."""
    if not runs or len(base) != len(runs):
        return None
    tests = []
    for b, r in zip(base, runs):
        if None in (user_test(b), user_test(r)) or b["test_recordings"] != r["test_recordings"]:
            return None
        tests.append(UserTest.of(b["test_correct_after"], r["test_correct_after"],
                                 r["test_recordings"]))
    return gain_interval(tests).to_dict()


def interval(g: dict | None) -> str:
    return "–" if g is None else \
        f"{g['gain_points']:+.1f} [{g['low_points']:+.1f}, {g['high_points']:+.1f}]"


def delta_cell(r: dict, c1: dict | None) -> str:
    """Row `r` against C1 after personalisation, in points: paired on the same test windows
    with its interval where both rows say which windows they got right; "other test" where the
    rows are not measured on the same users."""
    if c1 is None:
        return "–"
    if r["protocol"] != c1["protocol"] or r["users"] != c1["users"]:
        return "– (other test)"
    paired = against(c1["runs"], r["runs"])
    if paired is None:
        return f"{100 * (r['accuracy_after_mean'] - c1['accuracy_after_mean']):+.1f}"
    return interval(paired)


def spread(values: list[int]) -> str:
    lo, hi = min(values), max(values)
    return f"{lo}" if lo == hi else f"{lo}–{hi}"


def split(runs: list[dict]) -> str:
    """The runs' micro-batch x accumulation (the items of one micro-batch, a patch for C6-C7)."""
    shapes = sorted({(r.get("micro_batch"), r.get("accumulation_steps")) for r in runs},
                    key=str)
    return ", ".join("–" if None in s else f"{s[0]} × {s[1]}" for s in shapes)


def accuracy_line(config: str, test: dict) -> str:
    runs, g = test["runs"], test["gain"]
    before = [r["accuracy_before"] for r in runs]
    after = [r["accuracy_after"] for r in runs]
    below = sum(a < b - 1e-9 for a, b in zip(after, before))
    recordings = f" ({g['recordings']})" if g else ""
    return (f"| {config} | {test['protocol']} | {len(runs)}{recordings} "
            f"| {sum(before) / len(runs):.3f} → {sum(after) / len(runs):.3f} | {interval(g)} "
            f"| {below} | {spread([r['optimizer_steps'] for r in runs])} | {split(runs)} "
            f"| {spread([r['mask_updates'] for r in runs])} |")


def accuracy_table(rs: list[dict]) -> list[str]:
    """One line per row on the watch data's other arm (every row's test), and one more per
    row with a cross-session data set, on its later session."""
    lines = ["| config | tested on | users (test recordings) | accuracy before → after "
             "| gain, points (95% interval) | users below their start | optimizer steps "
             "| micro-batch × steps | mask updates |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rs:
        lines.append(accuracy_line(r["config"], r))
        if r.get("session"):
            lines.append(accuracy_line(r["config"], r["session"]))
    return lines
