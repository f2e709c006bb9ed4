"""One line of context for a single user's run: what the benchmark measured over every user.

    .venv/bin/python bench/personalise_context.py --dataset hapt --device watchos-extension

Reads bench/results/personalise.json (bench/personalise_report.py writes it) and prints the
mean gain of the matching device tier and mode with its users-and-recordings interval, how
many users ended below the population model and the worst of them, or says that no row
matches (another device, model or data set than the benchmark ran).
"""
from __future__ import annotations

import argparse

from common import load_results

PROTOCOLS = {"hapt": "later-session", "watch": "other-arm"}


def context(dataset: str, device: str, mode: str, model: str) -> str:
    rows = load_results("personalise", [])
    match = [r for r in rows if r.get("dataset") == dataset and r.get("device") == device
             and r.get("mode") == mode and r.get("model") == model
             and r.get("protocol") == PROTOCOLS[dataset] and not r.get("without_users")]
    if not match:
        return (f"benchmark: no row for {model} on {device} with the {dataset} data "
                "(bench/personalise.py measures the product's tiers; docs/results.md)")
    r = match[0]
    return (f"benchmark, all {r['users']} {dataset} users on {device}, {mode} (commit "
            f"{r['commit']}): mean gain {r['gain_points']:+.1f} points (95% interval "
            f"{r['low_points']:+.1f} to {r['high_points']:+.1f}, users and recordings "
            f"resampled), {r['users_below_0']} user{'' if r['users_below_0'] == 1 else 's'} "
            "below the population model, worst user "
            f"{r['worst_user']} {r['worst_points']:+.1f}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dataset", default="hapt", choices=sorted(PROTOCOLS))
    ap.add_argument("--device", default="watchos-extension")
    ap.add_argument("--mode", default="all labels")
    ap.add_argument("--model", default="imu_cnn")
    a = ap.parse_args()
    print(context(a.dataset, a.device, a.mode, a.model))
