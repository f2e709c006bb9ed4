"""The export's dry run (exporters/export/dryrun.py): a budget recompute plan runs capped at its
budget before the export is written, and is planned again for less when it overruns."""
from __future__ import annotations

import json

import pytest

from conftest import cli
from edgetrain.budget import BudgetError
from edgetrain.manifest import load_manifest
from exporters.export.dryrun import (BUDGET_PLAN_ATTEMPTS, BudgetOverrunError, dry_run_artifact,
                              export_within_budget)


def test_a_capped_dry_run_below_the_need_is_a_budget_overrun(tiny_artifact):
    m = load_manifest(tiny_artifact)
    peak = json.loads(cli("measure", tiny_artifact, "--batch", m.plan.micro_batch, "--json")
                      .stdout)["peak_bytes"]
    dry_run_artifact(tiny_artifact, m, peak)  # the measured peak fits
    with pytest.raises(BudgetOverrunError) as e:
        dry_run_artifact(tiny_artifact, m, peak - 4096)
    assert isinstance(e.value, BudgetError) and isinstance(e.value, ValueError)  # CLI: exit 3
    assert e.value.needed_bytes > peak - 4096 and e.value.budget_bytes == peak - 4096
    assert "does not fit it when run" in str(e.value) and "Nothing was written" in str(e.value)


def overrun(needed=120, predicted=100):
    return BudgetOverrunError("over", needed, predicted, 1000)


def test_an_overrunning_plan_is_planned_again_for_less_then_given_up():
    targets, resets = [], []

    def export(target):
        targets.append(target)
        if len(targets) < 2:
            raise overrun()
        return "manifest"

    assert export_within_budget(export, lambda: resets.append(1), 1000) == "manifest"
    assert targets == [1000, int(1000 * 100 / 120)] and resets == [1]
    targets.clear()

    def always(target):
        targets.append(target)
        raise overrun()

    with pytest.raises(BudgetOverrunError):
        export_within_budget(always, lambda: None, 1000)
    assert len(targets) == BUDGET_PLAN_ATTEMPTS


def test_no_plan_for_the_smaller_figure_reports_the_overrun_not_the_figure():
    calls = []

    def export(target):
        calls.append(target)
        if len(calls) == 1:
            raise overrun()
        raise ValueError(f"no recompute plan fits the budget of {target} bytes")

    with pytest.raises(BudgetOverrunError, match="over"):
        export_within_budget(export, lambda: None, 1000)


def test_no_plan_at_all_is_the_planner_s_own_error():
    def export(target):
        raise ValueError(f"no recompute plan fits the budget of {target} bytes")

    with pytest.raises(ValueError, match="budget of 1000 bytes"):
        export_within_budget(export, lambda: None, 1000)
