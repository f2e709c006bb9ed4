"""Device profiles, the budget split, byte parsing and the allocator-log parser."""
from __future__ import annotations

import click
import pytest

from edgetrain.budget import (RUNTIME_SCALAR_BYTES, BudgetError, BudgetSplit, arena_rounded,
                            budget_error_from, fixes, with_prediction)
from edgetrain.manifest import Plan
from device_sim.measure import MARK, parse_arena_log
from device_sim.profiles import PROFILES, TIER_PLANS, get_profile
from edgetrain.cli import parse_bytes


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_every_profile_is_documented_and_sane(name):
    p = get_profile(name)
    assert 0 < p.ram_budget_bytes <= p.total_ram_bytes
    assert p.source and p.description
    from pathlib import Path
    docs = (Path(__file__).parent.parent / "docs" / "devices.md").read_text()
    assert f"`{name}`" in docs


def test_every_tier_plan_is_for_a_profile_and_in_the_docs():
    from pathlib import Path
    docs = (Path(__file__).parent.parent / "docs" / "devices.md").read_text()
    for device, plan in TIER_PLANS.items():
        assert device in PROFILES and plan.device == device
        assert f"| `{device}` |" in docs and plan.label in docs, plan.label
        args = plan.export_args()
        assert args[args.index("--update") + 1] == plan.update
        assert args[args.index("--micro-batch") + 1] == str(plan.micro_batch)
        assert args[args.index("--threads") + 1] == str(plan.threads)


def test_unknown_profile():
    with pytest.raises(ValueError, match="unknown device profile 'fridge'"):
        get_profile("fridge")


@pytest.mark.parametrize("text, value", [("8692224", 8692224), ("15MB", 15_000_000),
                                         ("15MiB", 15 * 2**20), ("1.5GiB", 3 * 2**29),
                                         ("64 KiB", 65536)])
def test_parse_bytes(text, value):
    assert parse_bytes(text) == value


@pytest.mark.parametrize("text", ["lots", "12parsecs", ""])
def test_parse_bytes_refuses(text):
    with pytest.raises(click.BadParameter):
        parse_bytes(text)


def test_budget_split_is_exact():
    s = BudgetSplit.from_budget(10_000, 4_096)
    assert s.state_bytes + s.scalar_bytes + s.arena_cap_bytes == 10_000
    assert s.scalar_bytes == RUNTIME_SCALAR_BYTES
    for bad in (0, -5, 4_096):
        with pytest.raises(BudgetError):
            BudgetSplit.from_budget(bad, 4_096)


def test_arena_rounding():
    assert [arena_rounded(n) for n in (1, 256, 257, 1728)] == [256, 256, 512, 1792]


def test_budget_error_names_the_bytes():
    s = BudgetSplit.from_budget(100_000, 10_000)
    ort_error = RuntimeError("... Available memory of 31488 is smaller than requested bytes "
                             "of 524288")
    e = budget_error_from(ort_error, s, "a training step", micro_batch=4)
    assert e.needed_bytes == 100_000 + 524288 - 31488 and e.micro_batch == 4
    assert "smaller --micro-batch" in str(e) and str(e.needed_bytes) in str(e)
    assert "smaller --micro-batch" not in str(budget_error_from(ort_error, s, "x", micro_batch=1))
    assert budget_error_from(RuntimeError("unrelated"), s, "x") is None


class FakeManifest:  # what fixes() reads of a manifest
    def __init__(self, plan=Plan(), masks=(), provenance=None):
        self.plan, self.masks, self.provenance = plan, masks, provenance or {}


def test_fixes_name_only_what_applies():
    custom = fixes(FakeManifest(), 8)  # exported from Python: export_artifact's arguments
    assert "--micro-batch" in custom and 'export_artifact(update="head"' in custom
    assert "--update head" not in custom and "--width" not in custom
    assert "--micro-batch" not in fixes(FakeManifest(), 1)
    done = fixes(FakeManifest(Plan(update="head", recompute="sqrt"), masks=("m",)), 1)
    assert done == "or a device profile with more RAM"
    builtin = fixes(FakeManifest(provenance={"config": {"width": 0.5}}), 2)
    assert "--width below 0.5" in builtin


def test_prediction_joins_the_error_only_for_its_micro_batch():
    e = BudgetError("x needs more. Try y.", 1000, 900, micro_batch=2)
    assert with_prediction(e, {"batch": 4, "peak_bytes": 5000}, 2) is e
    told = with_prediction(e, {"batch": 2, "peak_bytes": 5000}, 2)
    assert told.predicted and "needs about 5000 bytes" in str(told) and "5050 bytes" in str(told)
    assert told.needed_bytes == 5000 and str(told).endswith("Try y.")
    under = with_prediction(BudgetError("x. Try y.", 1000, 9000, 2), {"batch": 2,
                                                                      "peak_bytes": 5000}, 2)
    assert "is below that" in str(under)  # a prediction under the failed request says so


def test_log_parser_attributes_growth_to_phases():
    def ext(r, e, t):
        return [f"Extending BFCArena for Cpu. bin_num:0 (requested) num_bytes: {r} (actual) "
                f"rounded_bytes:{r}", f"Extended allocation by {e} bytes.",
                f"Total allocated bytes: {t}"]
    log = [MARK + "probe", *ext(64, 1048576, 1048576),  # the NCHWc probe's own arena: not counted
           MARK + "parameters", *ext(1024, 1048576, 1048576), *ext(512, 1048576, 1048576),
           MARK + "gradients", "Reserving memory in BFCArena for Cpu size: 768",
           *ext(1024, 1024, 1792), *ext(512, 512, 2304),
           MARK + "optimizer_state", *ext(1024, 1024, 3328),
           MARK + "train", *ext(256, 1048576, 1048576),  # an API scalar's private arena
           *ext(4096, 4096, 7424)]
    env, outside, per = parse_arena_log("\n".join(log))
    assert env == 7424 and outside == 1024 + 512 + 256
    assert per == {"parameters": 1536, "gradients": 1536, "optimizer_state": 1024,
                   "activations": 4096, "other": 768 + 256}


def test_ort_errors_that_are_not_runtime_errors_still_become_budget_errors():
    """onnxruntime's InferenceSession raises RuntimeException, which is not a RuntimeError:
    the side graphs (and the inference model) translate it all the same."""
    from edgetrain.budget import budget_error_from
    from edgetrain.sidegraphs import SideGraphs

    class OrtRuntimeException(Exception):
        pass

    class FakeOrt:
        def InferenceSession(self, *args, **kwargs):
            raise OrtRuntimeException("Available memory of 1024 is smaller than requested "
                                      "bytes of 65536")

    split = BudgetSplit.from_budget(100_000, 2048)
    side = SideGraphs(FakeOrt(), {"mask_grad_model": "unused.onnx"}, None, lambda: None,
                      lambda: {}, lambda e, what: budget_error_from(e, split, what) or e)
    with pytest.raises(BudgetError, match="65536"):
        side.run("mask_grad_model", {}, "the dense gradients")
