"""fit's capped runs sum FIT_ACCUMULATION micro-batches a step, not the plan's count: the
step's peak, measured by the allocator, is the same however many micro-batches it sums
(device_sim/reports.py), so the shortcut changes how long a capped run takes, not what it
finds."""
from __future__ import annotations

from conftest import TINY_CLASSES, TINY_SHAPE, tiny_model
from device_sim.measure import measure
from device_sim.reports import FIT_ACCUMULATION, fit_report


def test_a_steps_peak_does_not_grow_past_its_second_micro_batch(tiny_artifact):
    for adapt in ("none", "bn"):
        two, five = (measure(tiny_artifact, 4, None, acc, steps=1, select=False, adapt=adapt)
                     for acc in (FIT_ACCUMULATION, 5))
        assert two.peak_bytes == five.peak_bytes > 0, adapt
        assert two.breakdown == five.breakdown, adapt


def test_fit_steps_sum_at_most_two_micro_batches_and_count_them_all(tmp_path):
    import torch

    from edgetrain.manifest import Plan
    from exporters.export import export_artifact

    art = tmp_path / "acc"
    export_artifact(tiny_model(), torch.zeros(2, *TINY_SHAPE), art, classes=TINY_CLASSES,
                    plan=Plan(micro_batch=2, accumulation_steps=64), model_name="tiny")
    budget = measure(art, 4, None, 2, steps=1).peak_bytes
    r = fit_report(art, budget, steps=1)
    assert r.accumulation_steps == FIT_ACCUMULATION and r.max_batch >= 4
    assert r.peak_bytes <= budget
    assert r.throughput_samples_per_s == round(
        r.max_batch * FIT_ACCUMULATION / r.step_time_s, 2)
