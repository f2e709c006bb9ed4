"""The static predictor: ORT's execution order, exact state parts, a sane activation plan."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from conftest import ROOT, cli, device_python
from edgetrain.manifest import load_manifest
import pytest

import exporters.predictor as predictor
from exporters.predictor.ortgraph import optimized_graph
from exporters.predictor.plan import plan_step
from exporters.predictor.scratch import scratch_bytes

PROFILED_ORDER = """
import glob, json, os, sys
import numpy as np
from edgetrain.ort_device import onnxruntime, training_api
from edgetrain.sessions import session_options
art, prefix, batch = sys.argv[1], sys.argv[2], int(sys.argv[3])
ort, api = onnxruntime(), training_api()
man = json.load(open(os.path.join(art, "manifest.json")))
so = session_options(ort, man["plan"]["threads"])  # the runtime's sessions' options
so.enable_profiling = True; so.profile_file_prefix = prefix
st = api.CheckpointState.load_checkpoint(os.path.join(art, "checkpoint"))
m = api.Module(os.path.join(art, "training_model.onnx"), st, None, session_options=so)
m.train()
x = np.zeros((batch, *man["input"]["sample_shape"]), np.float32)
m(x, np.zeros(batch, np.int64))
del m  # writes the profiles
events = json.load(open(max(glob.glob(prefix + "*.json"), key=os.path.getsize)))
kernels = sorted((e for e in events if e.get("cat") == "Node"
                  and e["name"].endswith("_kernel_time")), key=lambda e: e["ts"])
print(json.dumps([e["name"][:-len("_kernel_time")] for e in kernels]))
"""


def profiled_order(art, tmp_path, batch: int) -> list[str]:
    """The nodes of one training step of the artifact's Module, in the order ORT's profiler
    saw their kernels run (a torch-free child)."""
    p = subprocess.run([sys.executable, "-c", PROFILED_ORDER, str(art), str(tmp_path / "prof"),
                        str(batch)], capture_output=True, text=True, timeout=300, cwd=ROOT,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def attention_artifact(tmp_path_factory):
    """A small attention network (Shape nodes read large tensors: their place matters)."""
    import torch

    from edgetrain.manifest import Plan
    from exporters.export import export_artifact
    from wearable_models import CASES, CLASSES

    case = CASES["transformer_encoder"]
    out = tmp_path_factory.mktemp("attn") / "encoder"
    torch.manual_seed(0)
    export_artifact(case.build(), torch.zeros(2, *case.sample_shape), out,
                    classes=[str(k) for k in range(CLASSES)], plan=Plan(micro_batch=4),
                    layout=case.layout, freeze_batchnorm=case.freeze_batchnorm)
    return out


@pytest.mark.parametrize("which", ["tiny_artifact", "attention_artifact"])
def test_planned_order_is_the_order_ort_runs(which, request, tmp_path):
    """The order the predictor plans in is, node for node, the order ORT's profiler sees a
    training step run in (Shape nodes included: ORT moves them next to their input)."""
    art = request.getfixturevalue(which)
    plan = plan_step(str(art / "training_model.onnx"), 4)
    ran = profiled_order(art, tmp_path, 4)
    assert list(plan.order) == ran
    if which == "attention_artifact":
        assert any(n.split("/")[-1].startswith("Shape") for n in ran)


def test_predicted_state_is_exact_and_measured_breakdown_sums(tiny_artifact):
    r = cli("measure", tiny_artifact, "--batch", "4", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    # exact: the state, and what the sessions reserve for the optimised graphs' constants
    for part in ("parameters", "gradients", "optimizer_state", "other"):
        assert d["predicted_breakdown"][part] == d["breakdown"][part], part
    assert d["predicted_peak_bytes"] == sum(d["predicted_breakdown"].values())
    m = load_manifest(tiny_artifact)
    assert m.predicted["batch"] == m.plan.micro_batch
    assert m.predicted["breakdown"]["gradients"] == d["breakdown"]["gradients"]


def test_activation_plan_grows_with_batch_and_packs_above_live_peak(tiny_artifact):
    small, big = (plan_step(str(tiny_artifact / "training_model.onnx"), b) for b in (1, 16))
    assert 0 < small.pattern_bytes < big.pattern_bytes
    for p in (small, big):
        assert p.pattern_bytes >= p.live_peak_bytes  # a packing never beats the live peak
        assert len(p.timeline) == len(p.order)


def test_scratch_replay_by_hand(tiny_artifact):
    """Tiny net: conv 3->4, 3x3, pad 1 on 8x8; one ConvGrad (dW only); head Linear 4->3."""
    path = str(tiny_artifact / "training_model.onnx")
    # forward Conv: K = 27, 64 pixels, 4 filters -> complexity 6912 -> 1 thread x 16384 floats
    mlas = 1 * 16384 * 4
    # ConvGrad: column buffer 27 x 64 floats (6912 B) and bias multiplier 64 floats (256 B),
    # both fit in the MLAS region, freed by then; weight gradients (at most 432 B) fit too
    for batch in (4, 64):  # independent of the batch
        assert scratch_bytes(path, batch, 2, plan_step(path, batch)) == mlas



@pytest.mark.parametrize("accumulate", [1, 2])
def test_prediction_covers_the_batchnorm_statistics_pass(tiny_artifact, accumulate):
    """`measure --adapt bn` runs the statistics graph (over a step of 2 micro-batches, the
    moments graph) before the first step, in the same arena, and the regions it leaves stay
    the arena's: the prediction includes them (exporters/predictor/cycle.py), to within 1% of
    the allocator, above the cycle without the pass."""
    r = cli("measure", tiny_artifact, "--batch", "4", "--accumulate", str(accumulate),
            "--adapt", "bn", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["batchnorm_stats_pass"] and d["predicted_complete"]
    without = predictor.predict_manifest(tiny_artifact, load_manifest(tiny_artifact), 4)
    assert d["predicted_peak_bytes"] > without.peak_bytes
    assert abs(d["predicted_peak_bytes"] - d["peak_bytes"]) <= 0.01 * d["peak_bytes"]


def test_prediction_is_for_the_plans_threads_not_the_exporting_machine(tiny_artifact, monkeypatch):
    """The manifest's prediction is for plan.threads; the machine's CPU count plays no part."""
    m = load_manifest(tiny_artifact)
    monkeypatch.setattr("os.cpu_count", lambda: 64)
    again = predictor.predict_manifest(tiny_artifact, m, m.plan.micro_batch)
    assert again.threads == m.plan.threads == m.predicted["threads"]
    assert again.peak_bytes == m.predicted["peak_bytes"]
    # MLAS's conv buffer is per thread: 1 thread of 16384 floats here (see the replay above),
    # so a 1-thread prediction cannot exceed the plan's
    one = predictor.predict_manifest(tiny_artifact, m, m.plan.micro_batch, threads=1)
    assert one.threads == 1 and one.peak_bytes <= again.peak_bytes


def test_predictor_refuses_an_onnxruntime_it_does_not_model(tiny_artifact, monkeypatch):
    m = load_manifest(tiny_artifact)
    monkeypatch.setattr(predictor, "installed_ort_version", lambda: "1.20.0")
    with pytest.raises(predictor.UnsupportedRuntimeError, match=r"1\.19\.2.*1\.20\.0"):
        predictor.predict_manifest(tiny_artifact, m, 4)
    monkeypatch.setattr(predictor, "installed_ort_version", lambda: None)
    with pytest.raises(predictor.UnsupportedRuntimeError, match="no onnxruntime"):
        predictor.predict_manifest(tiny_artifact, m, 4)


def test_a_step_it_cannot_simulate_gets_no_claim(tiny_artifact, monkeypatch):
    """A graph ORT will not load for analysis: the exact state parts, no claim, and why."""
    m = load_manifest(tiny_artifact)

    def refuse(path, *level):
        raise RuntimeError("ORT refused the graph")
    monkeypatch.setattr(predictor, "optimized_graph", refuse)
    monkeypatch.setattr("exporters.predictor.plan.optimized_graph", refuse)
    p = predictor.predict_manifest(tiny_artifact, m, m.plan.micro_batch)
    assert not p.complete and "ORT refused the graph" in p.caveat()
    assert p.breakdown["gradients"] == m.predicted["breakdown"]["gradients"]


def test_a_recomputed_output_no_node_reads_is_held_to_the_end_of_the_step(tmp_path):
    """A sqrt plan recomputes a BatchNorm for its saved statistics; its output Y, read by no
    node, keeps its memory-pattern block to the end of the step (ORT gives it no release).
    Predicted as freed at once, this 2-D CNN's sqrt step was 23% under the allocator."""
    import torch

    from edgetrain.manifest import Plan
    from exporters.export import export_artifact

    torch.manual_seed(0)
    act = torch.nn.ReLU
    net = torch.nn.Sequential(
        torch.nn.Conv2d(1, 16, 3, stride=2, padding=1), torch.nn.BatchNorm2d(16), act(),
        torch.nn.Conv2d(16, 16, 3, padding=1, groups=16), torch.nn.BatchNorm2d(16), act(),
        torch.nn.Conv2d(16, 32, 1), torch.nn.BatchNorm2d(32), act(),
        torch.nn.Conv2d(32, 32, 3, stride=2, padding=1, groups=32), torch.nn.BatchNorm2d(32),
        act(), torch.nn.Conv2d(32, 64, 1), torch.nn.BatchNorm2d(64), act(),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(64, 6))
    art = tmp_path / "art"
    m = export_artifact(net, torch.zeros(2, 1, 64, 64), art, classes=list("abcdef"),
                        plan=Plan(micro_batch=16), recompute="sqrt", nchwc=False)
    train = optimized_graph(str(art / "training_model.onnx"))
    read = {x for n in train.graph.node for x in n.input}
    assert any(n.op_type == "BatchNormInternal" and n.output[0] not in read
               for n in train.graph.node), "the case needs a recomputed output no node reads"
    d = json.loads(cli("measure", art, "--batch", 16, "--steps", 1, "--json").stdout)
    assert d["predicted_complete"] and m.plan.checkpoints
    assert abs(d["predicted_peak_bytes"] - d["peak_bytes"]) <= 0.01 * d["peak_bytes"]


def test_variadic_sum_running_results_in_bytes():
    """Sum of N inputs allocates N - 2 running results before its output (ORT's
    UntypedBroadcastVariadic), each the broadcast of the inputs so far, in bytes."""
    from onnx import helper

    from exporters.predictor.scratch import variadic_temporaries

    shapes = {"a": ((4, 8), 4), "b": ((4, 8), 4), "c": ((1, 8), 4), "d": ((4, 8), 4)}
    assert variadic_temporaries(helper.make_node("Sum", ["a", "b"], ["y"]), shapes) == []
    assert variadic_temporaries(helper.make_node("Sum", ["a", "b", "c"], ["y"]), shapes) == [
        4 * 8 * 4]
    assert variadic_temporaries(helper.make_node("Sum", ["c", "c", "a", "d"], ["y"]),
                                shapes) == [1 * 8 * 4, 4 * 8 * 4]
    assert variadic_temporaries(helper.make_node("Add", ["a", "b", "c"], ["y"]), shapes) == []
