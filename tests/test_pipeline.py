"""The export as one pipeline of named passes (exporters/passes/) driven by one options object
(exporters/export/options.py): the runner's contract, the docs' table, and the CLI and the
Python API making the same artifact from the same options."""
from __future__ import annotations

import json
import re
import subprocess
import sys

import onnx
import pytest
import torch
from onnx import helper

from conftest import ROOT
from edgetrain.manifest import Plan, load_manifest
from exporters import passes
from exporters.export import ExportOptions, export_artifact
from exporters.export.options import FIELDS, options_from
from exporters.passes.pipeline import Context, Graphs, Pass, run_passes


def tiny_graph() -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])
    y = helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])
    return helper.make_model(helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                                               [x], [y]))


def context(tmp_path, target="portable", **kw) -> Context:
    return Context(folder=tmp_path, plan=Plan(), target=target, nchwc=False, **kw)


def test_a_pass_that_changes_nothing_leaves_its_graph_as_it_was(tmp_path):
    def scribble(graphs, ctx):
        graphs.training.graph.node[0].name = "scribbled"  # bookkeeping, then "no change"
        return 0

    def rename(graphs, ctx):
        graphs.training.graph.node[0].name = "renamed"
        return 1

    g = Graphs(training=tiny_graph(), eval=tiny_graph())
    before = g.training.SerializeToString()
    changed = run_passes((Pass("scribble", "training", scribble),), g, context(tmp_path))
    assert changed == {"scribble": 0} and g.training.SerializeToString() == before
    changed = run_passes((Pass("rename", "training", rename),), g, context(tmp_path))
    assert changed == {"rename": 1} and g.training.graph.node[0].name == "renamed"


def test_passes_run_in_order_only_where_their_target_and_option_enable_them(tmp_path):
    ran = []
    mk = lambda name, **kw: Pass(name, "eval", lambda g, c: ran.append(name) or 0, **kw)  # noqa
    order = (mk("a"), mk("host_only", targets=("host",)), mk("off", when=lambda c: False),
             mk("b"))
    g = Graphs(training=tiny_graph(), eval=tiny_graph())
    assert list(run_passes(order, g, context(tmp_path))) == ["a", "b"] == ran
    ran.clear()
    assert list(run_passes(order, g, context(tmp_path, target="host"))) == [
        "a", "host_only", "b"]


def test_as_shipped_runs_the_later_training_passes_on_a_copy(tmp_path):
    """The prediction a planning pass asks for "as shipped" sees the later passes' rewrites;
    the graphs the pipeline holds do not."""
    seen = []

    def later(graphs, ctx):
        graphs.training.graph.node[0].name = "later"
        return 1

    def planner(graphs, ctx):
        ctx.predicted_peak_as_shipped(graphs)
        return 0

    def predictor(folder):
        seen.append(onnx.load(str(folder / "training_model.onnx")).graph.node[0].name)
        return type("P", (), {"complete": True, "peak_bytes": 1})()

    g = Graphs(training=tiny_graph(), eval=tiny_graph())
    run_passes((Pass("plan", "training", planner), Pass("later", "training", later)), g,
               context(tmp_path, predictor=predictor))
    assert seen == ["later"]


def test_docs_draw_the_pipeline_as_it_runs():
    text = (ROOT / "docs" / "concepts.md").read_text()
    rows = re.findall(r"^\| (\d+) \| (\w+) \| `(\w+)` \(`(\w+)\.py`\) \| (\w+) \| ([^|]+) \| "
                      r"([^|]+) \|", text, re.M)
    want = passes.describe()
    assert [(r[1], r[2], r[4], r[6].strip()) for r in rows] == [
        (d["stage"], d["name"], d["graph"], d["option"]) for d in want]
    assert [r[5].strip() for r in rows] == [
        "all" if len(d["targets"]) == 3 else ", ".join(d["targets"]) for d in want]


def test_every_pass_module_states_its_rewrite():
    for p in passes.FORWARD_PASSES + passes.ARTIFACT_PASSES:
        doc = sys.modules[p.run.__module__].__doc__ or ""
        assert f"`{p.name}`" in doc, (p.name, p.run.__module__)
        assert p.summary and p.summary[0].isupper(), p.name


def test_options_come_as_one_object_or_as_keywords_never_both():
    assert options_from(None, {"density": 0.5}) == ExportOptions(density=0.5)
    with pytest.raises(TypeError, match="not both"):
        options_from(ExportOptions(), {"density": 0.5})
    with pytest.raises(TypeError, match="do not exist"):
        options_from(None, {"densty": 0.5})
    with pytest.raises(ValueError, match="update_budget_bytes"):
        ExportOptions(update="auto")


def test_every_export_option_of_the_command_exists_in_python():
    """Each `edgetrain export` flag is an ExportOptions field, a Plan field, a field of the
    pretraining config, or one of the few the command itself handles (named here)."""
    from edgetrain.cli.export_cmd import export
    from exporters.models.pretrain import PretrainConfig

    import dataclasses
    plan_fields = {f.name for f in dataclasses.fields(Plan)}
    cfg_fields = {f.name for f in dataclasses.fields(PretrainConfig)}
    spelled = {"model_name": "model", "micro_batch": "micro_batch", "accumulate":
               "accumulation_steps", "holdout_user": "holdout_user", "also_holdout":
               "also_held_out", "budget": "recompute_budget_bytes", "device": "target",
               "sign_key": "sign_key", "recompute_time": "recompute_time_ratio"}
    command_only = {"out", "no_cache", "as_json", "plan_mode", "plan_updates",
                    "plan_densities", "plan_weight_grads"}  # printing; the capped search
    # (--plan auto measures with device_sim, which exporters never imports)
    for param in export.params:
        name = spelled.get(param.name, param.name)
        if param.name in command_only:
            continue
        assert name in FIELDS or name in plan_fields or name in cfg_fields, param.name


@pytest.mark.slow
def test_update_auto_is_an_option_of_the_python_api(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv1d(3, 8, 3), torch.nn.ReLU(),
                                torch.nn.Conv1d(8, 8, 3), torch.nn.ReLU(), torch.nn.Flatten(),
                                torch.nn.Linear(8 * 16, 2))
    m = export_artifact(model, torch.zeros(2, 3, 20), tmp_path / "art", classes=["a", "b"],
                        options=ExportOptions(plan=Plan(micro_batch=2), update="auto",
                                              update_budget_bytes=64 << 20))
    search = m.provenance["update_search"]
    assert search["chosen"] == m.plan.update != "auto" and search["score"].startswith("share")
    assert m.plan.update == "all"  # everything fits 64 MiB: the most that fits wins


@pytest.mark.slow
def test_the_command_and_the_api_export_the_same_artifact(tmp_path):
    """`edgetrain export` with a set of options, and export_named with the ExportOptions of
    the same values: every file ORT reads is the same, and so is the plan."""
    from exporters.models.pretrain import PretrainConfig, export_named

    args = ["--model", "imu_cnn", "--epochs", "0", "--dataset", "watch", "--micro-batch", "4",
            "--density", "0.5", "--recompute", "sqrt", "--update", "last:2", "--target",
            "arm64", "--lr", "0.001"]
    p = subprocess.run([sys.executable, "-m", "edgetrain.cli", "export", *args, "--out",
                        str(tmp_path / "cli"), "--json"], capture_output=True, text=True,
                       cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-2000:]
    cli = json.loads(p.stdout)
    api = export_named(PretrainConfig(model="imu_cnn", epochs=0, dataset="watch"),
                       tmp_path / "api", ExportOptions(
                           plan=Plan(micro_batch=4), lr=0.001, density=0.5, recompute="sqrt",
                           update="last:2", target="arm64"), cache_dir=None,
                       show_progress=False).to_dict()
    assert load_manifest(tmp_path / "cli").to_dict() == cli
    assert {r: f["sha256"] for r, f in cli["files"].items()} == {
        r: f["sha256"] for r, f in api["files"].items()}
    for key in ("plan", "trainable", "frozen", "predicted", "masks", "optimizer"):
        assert cli[key] == api[key], key
    assert cli["provenance"]["passes"] == api["provenance"]["passes"]
    # untrained, the network is at chance dense or masked: what masking costs is not measured
    assert "masking" not in cli["provenance"] and "masking" not in api["provenance"]


def test_modules_moved_by_the_grouping_import_under_their_old_names():
    import exporters.models.networks
    import exporters.plans.recompute.planners
    from exporters.networks import build_network
    from exporters.recompute.planners import PLANNERS

    assert build_network is exporters.models.networks.build_network
    assert PLANNERS is exporters.plans.recompute.planners.PLANNERS
    top = sorted(p.name for p in (ROOT / "exporters").iterdir() if p.name != "__pycache__")
    assert len(top) <= 8, top
