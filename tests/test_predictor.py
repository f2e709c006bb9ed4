"""The static predictor: ORT's execution order, exact state parts, a sane activation plan."""
from __future__ import annotations

import json

import onnx

from conftest import cli, device_python
from edgetrain.manifest import load_manifest
import pytest

import exporters.predictor as predictor
from exporters.graph import drop_identities, execution_order
from exporters.predictor.ortgraph import optimized_graph
from exporters.predictor.plan import plan_step
from exporters.predictor.scratch import scratch_bytes

SCALAR_OPS = {"Shape", "Size"}  # ORT may schedule these earlier; they hold a few bytes


def test_execution_order_is_ort_order(tiny_artifact, tmp_path):
    opt = tmp_path / "ort_optimized.onnx"
    device_python(f"""
import json
from edgetrain.ort_device import onnxruntime, training_api
ort, api = onnxruntime(), training_api()
so = ort.SessionOptions(); so.optimized_model_filepath = {str(opt)!r}; so.log_severity_level = 3
st = api.CheckpointState.load_checkpoint({str(tiny_artifact / 'checkpoint')!r})
api.Module({str(tiny_artifact / 'training_model.onnx')!r}, st, None, session_options=so)
print(json.dumps({{}}))
""")
    ort_order = [n.name for n in onnx.load(str(opt)).graph.node if n.op_type not in SCALAR_OPS]
    nodes, _ = drop_identities(optimized_graph(str(tiny_artifact / "training_model.onnx")))
    mine = [nodes[i].name for i in execution_order(nodes) if nodes[i].op_type not in SCALAR_OPS]
    assert mine == ort_order


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
