"""The heavy rows: ResNet-50's, which `make results` (bench/all.py) leaves to `--full`.

A bench with ResNet-50 rows measures, by default, every row but those; with `--heavy` it
measures only those. Either way it keeps the saved rows of the other part, each with the
commit, date and machine it was measured at, so its tables stay whole, and a table whose two
parts come from different commits says so (HEAVY_WHY) instead of being refused. A default
`make results` thus re-measures everything but ResNet-50, and `make results ARGS=--full`
(`bench/all.py --full`) adds the ResNet-50 steps (their times: `bench/all.py --list --full`).
"""
from __future__ import annotations

from typing import Callable

from common import read_stamped, row_stamps

HEAVY_NETWORKS = ("resnet50",)
NOT_RECORDED = "not recorded"  # a kept row from a file written before results had a commit
HEAVY_WHY = ("the ResNet-50 rows are measured by `bench/all.py --full` only, the others by "
             "every `make results`")
HEAVY_HELP = ("measure only the ResNet-50 rows (bench/all.py --full runs this), keeping the "
              "other saved rows; without it, every row but ResNet-50's")


def is_heavy(network: str | None) -> bool:
    return network in HEAVY_NETWORKS


def part(networks, heavy: bool) -> list:
    """The networks (or items with a `.network`) a run measures: the heavy ones for a
    `--heavy` run, the others for a default one."""
    return [n for n in networks if is_heavy(getattr(n, "network", n)) == heavy]


def kept_rows(name: str, heavy: bool, network_of: Callable[[dict], str | None]) -> list[dict]:
    """The saved rows of bench/results/<name>.json of the part this run does not measure (the
    heavy rows for a default run, the others for a --heavy run), each carrying the commit,
    date and machine it was measured at (NOT_RECORDED for a file from before the stamps, so
    that the new file's stamp is never taken for theirs)."""
    doc = read_stamped(name)
    if doc is None or not isinstance(doc["results"], list):
        return []
    return [{**s, "commit": s.get("commit") or NOT_RECORDED, **r}
            for r, s in zip(doc["results"], row_stamps(doc))
            if is_heavy(network_of(r)) != heavy]


def why_mixed(name: str, network_of: Callable[[dict], str | None]) -> str | None:
    """HEAVY_WHY when bench/results/<name>.json's rows come from two commits, one for the
    heavy rows and one for the others; None otherwise (measured_at then refuses a mix)."""
    doc = read_stamped(name)
    if doc is None or not isinstance(doc["results"], list):
        return None
    commits = {True: set(), False: set()}
    for r, s in zip(doc["results"], row_stamps(doc)):
        commits[is_heavy(network_of(r))].add(s.get("commit"))
    return HEAVY_WHY if split_at_two_commits(commits[True], commits[False]) else None


def split_at_two_commits(heavy_commits: set, other_commits: set) -> bool:
    """True when the heavy part was measured at one commit and the rest at one other: the
    only mix a table may show (with its why); any other mix is refused."""
    return (len(heavy_commits) == 1 and len(other_commits) == 1
            and heavy_commits != other_commits)
