"""The step-time model (exporters/predictor/steptime.py): its fit recovers known per-operator
terms, it round-trips through JSON, the shipped fit is sane, and counting.py splits a step's
time and FLOPs between the original nodes and the recompute copies."""
from __future__ import annotations

import json

import numpy as np
import pytest

from edgetrain import names
from exporters.plans.recompute.counting import NS_PER_S, count_step
from exporters.predictor.steptime import (MIN_OP_SAMPLES, OpTime, TimeModel, fit_time_model,
                                          host_time_model)


def _samples(rng, op: str, truth: OpTime, n: int, noise: float = 0.0):
    out = []
    for _ in range(n):
        f, b = int(rng.integers(1, 10**8)), int(rng.integers(1, 10**7))
        t = truth.time_s(f, b) * (1 + noise * rng.standard_normal())
        out.append((op, f, b, t))
    return out


def test_the_fit_recovers_each_operators_terms():
    rng = np.random.default_rng(0)
    conv, add = OpTime(4e-6, 2e-11, 0.0), OpTime(1e-6, 0.0, 3e-10)
    samples = (_samples(rng, "Conv", conv, 40) + _samples(rng, "Add", add, 40)
               + _samples(rng, "Rare", conv, MIN_OP_SAMPLES - 1))
    model = fit_time_model(samples, overhead_s=5e-6, fitted_on={"machine": "test"})
    for op, truth in (("Conv", conv), ("Add", add)):
        got = model.ops[op]
        for f, b in ((10**6, 10**5), (10**8, 10**7)):
            assert got.time_s(f, b) == pytest.approx(truth.time_s(f, b), rel=1e-6), op
    assert "Rare" not in model.ops  # too few nodes: the fit over every node prices it
    assert model.node_time_s("Rare", 10, 10) == 5e-6 + model.default.time_s(10, 10)
    assert model.node_time_s("Conv", 0, 0) == pytest.approx(5e-6 + 4e-6)
    rows = [("a", "Conv", 10**6, 0), ("b", "Add", 0, 10**6)]
    assert model.step_time_s(rows) == pytest.approx(2 * 5e-6 + conv.time_s(10**6, 0)
                                                    + add.time_s(0, 10**6))


def test_the_fit_keeps_every_term_nonnegative():
    """Noisy times that a free least-squares fit would answer with a negative slope."""
    rng = np.random.default_rng(1)
    samples = [("Relu", f, 0, 2e-6 - 1e-15 * f + 1e-7 * rng.standard_normal())
               for f in rng.integers(1, 10**6, 50).tolist()]
    op = fit_time_model(samples, overhead_s=-1.0).ops["Relu"]
    assert min(op.base_s, op.s_per_flop, op.s_per_byte) >= 0
    assert op.base_s == pytest.approx(np.mean([s for *_, s in samples]), rel=0.2)
    with pytest.raises(ValueError, match="no profiled nodes"):
        fit_time_model([], overhead_s=0.0)


def test_the_model_round_trips_and_the_shipped_fit_is_sane():
    model = TimeModel(1e-6, OpTime(1e-6, 1e-11, 1e-10), {"Conv": OpTime(2e-6, 3e-11, 0.0)},
                      {"commit": "abc"})
    assert TimeModel.from_dict(json.loads(json.dumps(model.to_dict()))) == model
    shipped = host_time_model()
    terms = [shipped.overhead_s] + [v for op in (shipped.default, *shipped.ops.values())
                                    for v in (op.base_s, op.s_per_flop, op.s_per_byte)]
    assert min(terms) >= 0 and shipped.fitted_on.get("commit")
    # the operators every convolutional training step runs have their own terms
    assert {"Conv", "ConvGrad"} <= set(shipped.ops)
    # a bigger convolution takes longer
    assert shipped.node_time_s("Conv", 10**9, 10**6) > shipped.node_time_s("Conv", 10**6, 10**4)


def test_a_steps_count_splits_off_the_recompute_copies():
    model = TimeModel(0.0, OpTime(0.0, 1e-9, 0.0))
    copy = "x" + names.RECOMPUTE_SUFFIX
    assert names.is_recompute_name(copy)
    rows = [("a", "Conv", 3000, 10), (copy, "Conv", 1000, 10), ("b", "Relu", 0, 10)]
    # a rebuilt weight's node and the PassThroughs ordering copies are the plan's too
    added = [(f"w/Mul{names.REMAT_TAG}0.1", "Mul", 500, 10),
             (f"{names.RECOMPUTE_ORDER_PREFIXES[0]}3.pass_through", "PassThrough", 0, 10),
             (f"{names.RECOMPUTE_ORDER_PREFIXES[1]}0.1.pass_through", "PassThrough", 0, 10)]
    assert all(names.is_recompute_node(r[0]) for r in added + rows[1:2])
    assert not any(names.is_recompute_node(r[0]) for r in rows[::2])
    assert count_step(rows + added, model).extra_flops == 1500
    count = count_step(rows, model)
    assert (count.step_flops, count.extra_flops) == (3000, 1000)
    assert (count.step_ns, count.extra_ns) == (round(3000e-9 * NS_PER_S),
                                               round(1000e-9 * NS_PER_S))
    assert count.time_ratio() == pytest.approx(4 / 3) and count.flops_ratio() == pytest.approx(
        4 / 3)
