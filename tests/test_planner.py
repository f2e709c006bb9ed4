"""The planner: over a range of budgets on a small net it never recommends a plan whose
capped run failed or went over its budget, it says so when nothing fits, and a written plan
round-trips through the manifest. The host's speed is given (a fixed HostSpeed), so what the
test checks does not depend on how fast this machine is; host_speed itself is checked apart."""
from __future__ import annotations

import shutil

import pytest

from conftest import export_tiny
from device_sim.hostprofile import HostSpeed, host_speed
from device_sim.measure import measure
from device_sim.planner import items_per_sample, plan, sizes, write_plan
from edgetrain.manifest import load_manifest
from edgetrain.cli.plan_variants import BUDGET_RECOMPUTE_SIZES, REBUILT_SLOWER_RATIO

SPEED = HostSpeed(threads=2, compute_flops_per_s=2e10, depthwise_flops_per_s=2e9,
                  memory_bandwidth_bytes_per_s=5e9, compute_node_overhead_s=1e-5,
                  node_overhead_s=5e-7, call_overhead_s=5e-5, cpu="test", onnxruntime="1.19.2")


@pytest.fixture(scope="module")
def art(tmp_path_factory):
    out = tmp_path_factory.mktemp("plan") / "tiny"
    export_tiny(out, micro_batch=1)
    return out


def test_node_time_uses_the_rate_of_its_kind():
    from device_sim.planner import node_time_s

    dense = node_time_s("Conv", 1, 2 * 10**9, 0, SPEED)
    depthwise = node_time_s("Conv", 32, 2 * 10**9, 0, SPEED)
    assert dense == pytest.approx(0.1 + 1e-5) and depthwise == pytest.approx(1.0 + 1e-5)
    assert node_time_s("Add", 1, 0, 5 * 10**9, SPEED) == pytest.approx(1.0 + 5e-7)


def test_sizes_are_divisors_and_powers_of_two():
    assert sizes(12) == [1, 2, 3, 4, 6, 8, 12]
    assert len(sizes(1568, limit=10)) <= 10 and sizes(1568, limit=10)[0] == 1
    assert sizes(1568, limit=10)[-1] == 1568


@pytest.mark.slow
def test_plan_never_recommends_a_plan_over_its_budget(art):
    peak = {b: measure(art, b, steps=1).peak_bytes for b in (1, 8)}
    budgets = [peak[1] - 4096, peak[1] + 1024, (peak[1] + peak[8]) // 2, peak[8] * 4]
    chosen = []
    for budget in budgets:
        r = plan(art, budget, effective_batch=8, steps=1, speed=SPEED)
        for c in r.candidates:  # every capped run that passed stayed within the budget
            if c.confirmed == "fits":
                assert c.measured_peak_bytes <= budget
        if r.chosen is not None:
            assert r.chosen.confirmed == "fits" and r.chosen.measured_peak_bytes <= budget
            assert r.chosen.micro_batch * r.chosen.accumulation_steps >= 8
        chosen.append(r.chosen)
    assert chosen[0] is None  # below micro-batch 1's peak nothing trains, and it says so
    assert chosen[1] is not None and chosen[1].micro_batch == 1
    assert chosen[-1] is not None
    ran = [c for c in plan(art, budgets[-1], effective_batch=8, steps=1, speed=SPEED).candidates
           if c.confirmed != "not run"]
    assert len(ran) == 2  # the winner and the runner-up, no more


def test_written_plan_round_trips(art, tmp_path):
    mine = tmp_path / "tiny"
    shutil.copytree(art, mine)
    r = plan(mine, 64 << 20, effective_batch=4, steps=1, speed=SPEED)
    write_plan(mine, r)
    m = load_manifest(mine)  # hashes still verify
    assert (m.plan.micro_batch, m.plan.accumulation_steps) == (r.chosen.micro_batch,
                                                               r.chosen.accumulation_steps)
    assert m.predicted["batch"] == r.chosen.micro_batch
    assert m.provenance["plan_search"]["chosen"]["micro_batch"] == r.chosen.micro_batch
    assert items_per_sample(m) == 1


def test_host_speed_is_measured_and_cached(tmp_path):
    s = host_speed(1, cache=tmp_path)
    assert s.compute_flops_per_s > 1e8 and s.memory_bandwidth_bytes_per_s > 1e8
    assert s.depthwise_flops_per_s > 1e7
    assert 0 <= s.node_overhead_s < 1e-2 and 0 <= s.compute_node_overhead_s < 1e-2
    assert 0 < s.call_overhead_s < 1e-1
    assert host_speed(1, cache=tmp_path) == s  # read back, not measured again


@pytest.mark.slow
def test_cli_write_without_a_plan_exits_3_and_writes_nothing(art, tmp_path):
    from conftest import cli

    mine = tmp_path / "tiny"
    shutil.copytree(art, mine)
    before = (mine / "manifest.json").read_bytes()
    r = cli("plan", mine, "--budget", "64KiB", "--samples", "4", "--write")
    assert r.returncode == 3 and "nothing was written" in r.stderr
    assert (mine / "manifest.json").read_bytes() == before


@pytest.mark.slow
def test_export_plan_auto_writes_the_fastest_confirmed_variant(tmp_path):
    """export --plan auto plans the artifact and its recompute-sqrt twin, keeps the faster
    confirmed one with its plan written, and leaves no twin folder behind."""
    from conftest import cli

    out = tmp_path / "imu"
    r = cli("export", "--model", "imu_cnn", "--epochs", "0", "--plan", "auto", "--budget",
            "12MiB", "--micro-batch", "8", "--accumulate", "4", "--plan-update", "head",
            "--out", out)
    assert r.returncode == 0, r.stderr
    for rec in ("none", "sqrt"):  # every recompute variant with every update plan
        for upd in ("all", "head"):
            assert f"plan search, recompute {rec}, update {upd}:" in r.stdout
    m = load_manifest(out)
    search = m.provenance["plan_search"]
    assert search["chosen"]["confirmed"] == "fits"
    assert search["chosen"]["measured_peak_bytes"] <= 12 << 20
    assert m.plan.micro_batch * m.plan.accumulation_steps >= 32
    assert m.predicted["batch"] == m.plan.micro_batch
    # a plan at another micro-batch than exported: the winner is exported again at it and
    # confirmed by a capped run; kept, its own measurement is the plan's
    rebuilt = search["rebuilt_at_plan"]
    assert m.plan.micro_batch != 8, "the test needs a plan at another micro-batch"
    if rebuilt is None:  # only a budget-recompute twin is built at the micro-batch it runs
        assert search["variant"].startswith("recompute budget at micro-batch "
                                            f"{m.plan.micro_batch},")
    else:
        assert rebuilt["micro_batch"] == m.plan.micro_batch
        assert rebuilt["reason"] in ("fits", "slower", "over budget")
    if rebuilt and rebuilt["kept"]:
        assert search["chosen"]["measured_peak_bytes"] == rebuilt["measured_peak_bytes"]
        assert search["chosen"]["predicted_peak_bytes"] == m.predicted["peak_bytes"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["imu"]
    bad = cli("export", "--model", "imu_cnn", "--epochs", "0", "--plan", "auto", "--out", out)
    assert bad.returncode == 2  # --plan auto needs a budget
    bad = cli("export", "--model", "imu_cnn", "--epochs", "0", "--plan-update", "head",
              "--out", out)
    assert bad.returncode == 2  # and --plan-update needs --plan auto


@pytest.mark.slow
def test_export_plan_auto_searches_density_too(tmp_path):
    """--plan-density adds a sparse twin to the search, and --plan-weight-grad kept its
    kept-gradients twin: every variant is planned and its outcome recorded, and the artifact
    kept is the one whose confirmed plan measured fastest, with its own masks (dense: none)
    and its own weight-gradient plan."""
    from conftest import cli

    out = tmp_path / "imu"
    r = cli("export", "--model", "imu_cnn", "--epochs", "0", "--plan", "auto", "--budget",
            "12MiB", "--recompute", "sqrt", "--micro-batch", "8", "--accumulate", "4",
            "--plan-density", "0.5", "--plan-density", "1.0", "--plan-weight-grad", "kept",
            "--out", out)
    assert r.returncode == 0, r.stderr
    keys = ["recompute sqrt, update all, density 1", "recompute sqrt, update all, density 0.5",
            "recompute sqrt, update all, density 0.5, kept weight gradients"]  # sparse only
    for key in keys:
        assert f"plan search, {key}:" in r.stdout
    search = load_manifest(out).provenance["plan_search"]
    assert set(keys) <= set(search["variants"])
    twins = set(search["variants"]) - set(keys)  # the best variant's budget-recompute twins,
    assert all(t.startswith("recompute budget at micro-batch ") for t in twins)  # by speed
    assert len(twins) <= BUDGET_RECOMPUTE_SIZES
    timed = {k: v["measured_step_time_s"] for k, v in search["variants"].items()
             if "measured_step_time_s" in v}
    fastest = min(timed.values())  # the winner's time is its rebuild's when that was kept
    assert timed[search["variant"]] <= fastest * REBUILT_SLOWER_RATIO
    kept = load_manifest(out)
    assert bool(kept.masks) == ("0.5" in search["variant"])
    assert kept.plan.weight_grad == ("kept" if search["variant"].endswith("gradients") else
                                     "dense")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["imu"]
    bad = cli("export", "--model", "imu_cnn", "--epochs", "0", "--plan-density", "0.5",
              "--out", out)
    assert bad.returncode == 2 and "--plan auto" in bad.stderr
