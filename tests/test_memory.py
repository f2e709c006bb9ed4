"""Memory measured by the runtime's own allocator, asserted in bytes from shapes x itemsize."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from conftest import cli, tiny_data
from edgetrain.budget import ARENA_CHUNK_BYTES, RUNTIME_SCALAR_BYTES
from edgetrain.manifest import load_manifest


def chunk(nbytes: int) -> int:
    return max(ARENA_CHUNK_BYTES, -(-nbytes // ARENA_CHUNK_BYTES) * ARENA_CHUNK_BYTES)


def measure_json(art, *extra) -> dict:
    p = cli("measure", art, "--batch", "4", "--json", *extra)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


@pytest.fixture(scope="module")
def measured(tiny_artifact):
    return [measure_json(tiny_artifact) for _ in range(3)]


def test_breakdown_is_byte_exact_from_shapes(tiny_artifact, measured):
    m = load_manifest(tiny_artifact)
    shapes = {t.name: t.shape for t in m.trainable + m.frozen}
    # conv 4x3x3x3, bn weight/bias/mean/var 4 each, head 3x4 + 3: float32
    assert shapes["conv.weight"] == (4, 3, 3, 3) and shapes["head.weight"] == (3, 4)
    trainable = [4 * 3 * 3 * 3 * 4, 4 * 4, 4 * 4, 3 * 4 * 4, 3 * 4]
    frozen = [4 * 4, 4 * 4]  # bn.running_mean, bn.running_var
    b = measured[0]["breakdown"]
    assert b["parameters"] == sum(chunk(n) for n in trainable + frozen)
    assert b["gradients"] == sum(chunk(n) for n in trainable)
    assert b["optimizer_state"] == 2 * sum(chunk(n) for n in trainable)  # AdamW m and v
    assert b["other"] >= RUNTIME_SCALAR_BYTES
    assert b["activations"] > 0
    assert sum(b.values()) == measured[0]["peak_bytes"]


def test_peak_is_identical_across_runs_and_device_has_no_torch(measured):
    assert len({r["peak_bytes"] for r in measured}) == 1
    assert isinstance(measured[0]["peak_bytes"], int)
    assert all(r["torch_loaded"] is False for r in measured)


def test_budget_at_peak_trains_and_64k_below_fails(tiny_artifact, measured, tmp_path):
    peak = measured[0]["peak_bytes"]
    x, y = tiny_data(16)
    np.savez(tmp_path / "d.npz", x=x, y=y)
    ok = cli("personalise", tiny_artifact, "--data", tmp_path / "d.npz", "--budget", peak,
             "--epochs", "1", "--out", tmp_path / "ok")
    assert ok.returncode == 0, ok.stderr
    # what the run wrote survives a later run that fails on its budget
    before = (tmp_path / "ok" / "checkpoint").read_bytes()
    bad = cli("personalise", tiny_artifact, "--data", tmp_path / "d.npz",
              "--budget", peak - 64 * 1024, "--epochs", "1", "--out", tmp_path / "ok",
              "--resume")
    assert bad.returncode == 3
    assert "needs more memory than the budget" in bad.stderr
    assert "Try a smaller --micro-batch" in bad.stderr
    assert (tmp_path / "ok" / "checkpoint").read_bytes() == before


def test_budget_error_predicts_the_micro_batch_that_failed(tiny_artifact, measured, tmp_path):
    """The manifest predicts the plan's micro-batch; another one is predicted when it fails."""
    assert load_manifest(tiny_artifact).predicted["batch"] != 2
    x, y = tiny_data(8)
    np.savez(tmp_path / "d.npz", x=x, y=y)
    bad = cli("personalise", tiny_artifact, "--data", tmp_path / "d.npz", "--micro-batch", "2",
              "--budget", measured[0]["peak_bytes"] // 2, "--out", tmp_path / "r")
    assert bad.returncode == 3, bad.stderr
    assert "At micro-batch 2 the whole step needs about" in bad.stderr or \
        "The static prediction for micro-batch 2" in bad.stderr
    assert "--width" not in bad.stderr  # a custom network has no width multiplier


def test_budget_below_parameters_fails_before_loading(tiny_artifact, tmp_path):
    x, y = tiny_data(8)
    np.savez(tmp_path / "d.npz", x=x, y=y)
    p = cli("personalise", tiny_artifact, "--data", tmp_path / "d.npz", "--budget", "1KiB",
            "--out", tmp_path / "r")
    assert p.returncode == 3
    assert "below the model's parameters" in p.stderr


def test_measure_capped_at_device_reports_within_budget(tiny_artifact):
    r = measure_json(tiny_artifact, "--device", "mcu-2mb")
    assert r["budget_bytes"] == 2 * 1024 * 1024
    assert r["peak_bytes"] <= r["budget_bytes"]


def test_plot_writes_the_timeline_and_the_graph(tiny_artifact, tmp_path):
    doc = measure_json(tiny_artifact, "--budget", "4MiB", "--plot", tmp_path / "plots")
    names = sorted(Path(p).name for p in doc["plots"])
    assert names == ["graph.png", "graph.svg", "timeline.png"]
    for p in doc["plots"][:2]:
        assert Path(p).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and Path(p).stat().st_size > 10_000


def test_graph_view_has_one_box_per_block_and_its_labels_sum_to_the_activations(tmp_path):
    """The SVG graph view of a small two-block CNN: a box per block in execution order; the
    boxes' shares of the activations plus the two rows for the rest sum to the predicted
    breakdown's activations (the title's total); and the bytes each box keeps for backward
    sum to what the forward analysis keeps (each kept output's shape x 4 bytes)."""
    import xml.etree.ElementTree as ET

    import numpy as np

    from exporters.graph import load_graph, without_identities
    from exporters.views.graphview import block_of, write_graph_svg
    from exporters.predictor import predict_manifest
    from exporters.predictor.shapes import runtime_shapes
    from exporters.plans.recompute import analyse
    from test_update_plans import export

    _, m = export(tmp_path, "all")
    train = str(tmp_path / "all" / m.files["training_model"].path)
    svg = ET.parse(write_graph_svg(train, 4, tmp_path, threads=2, eval_model=str(
        tmp_path / "all" / m.files["eval_model"].path))).getroot()
    ns = "{http://www.w3.org/2000/svg}"
    boxes = [g for g in svg.iter(ns + "g") if g.get("class") == "block"]
    # in execution order: the mean over time (outside any module) runs before the classifier
    assert [g.get("data-block") for g in boxes] == ["block1", "block2", "(top level)",
                                                    "classifier"]
    labels = [int(g.get("data-activation-bytes")) for g in svg.iter(ns + "g")
              if g.get("class") in ("block", "rest")]
    predicted = predict_manifest(tmp_path / "all", m, 4, 2).breakdown["activations"]
    assert sum(labels) == int(svg.get("data-activation-bytes")) == predicted > 0
    assert all(int(g.get("data-activation-bytes")) > 0 for g in boxes[:2])  # blocks hold bytes
    assert sum(int(g.get("data-saved-bytes")) for g in boxes) == int(svg.get("data-saved-bytes"))
    model, _ = without_identities(load_graph(train))
    fwd, shapes = analyse(model), runtime_shapes(model, 4)
    produced = {o for n in fwd.nodes for o in n.output}  # the graph's inputs are not nodes
    kept = sum(int(np.prod(shapes[t][0])) * shapes[t][1] for t in fwd.saved & produced)
    assert int(svg.get("data-saved-bytes")) == kept > 0
    # every forward node is one square with a tooltip
    squares = [r for r in svg.iter(ns + "rect") if r.get("class") == "node"]
    assert len(squares) == len(fwd.nodes) and all(r.find(ns + "title") is not None
                                                   for r in squares)
    holds = {("stages",), ("stages", "stages.0"), ("stages", "stages.0", "stages.0.1"),
             ("stages", "stages.0", "stages.0.1", "conv"), ("blocks",), ("blocks", "blocks.3"),
             ("blocks", "blocks.3", "dw"), ("stem",)}
    assert block_of("/stages/stages.0/stages.0.1/conv/conv.0/Conv", holds) == "stages.0.1"
    assert block_of("/stages/stages.0/stages.0.1/Add", holds) == "stages.0.1"  # its own add
    assert block_of("/blocks/blocks.3/dw/dw.0/Conv", holds) == "blocks.3"
    assert block_of("/stem/stem.0/Conv", holds) == "stem"  # stem.0 is a leaf conv
    assert block_of("/ReduceMean", holds) == "(top level)"


def test_personalise_reports_its_own_peak_equal_to_measure(tiny_artifact, tmp_path):
    """The run's own allocator log gives the same peak as measure's replay of the cycle."""
    rng = np.random.default_rng(0)
    x = rng.normal(0, 1, (16, 3, 8, 8)).astype(np.float32)
    np.savez(tmp_path / "d.npz", x=x, y=rng.integers(0, 3, 16))
    p = cli("personalise", tiny_artifact, "--data", tmp_path / "d.npz", "--budget", "4MiB",
            "--no-select", "--micro-batch", "4", "--epochs", "1", "--out", tmp_path / "r",
            "--json")
    assert p.returncode == 0, p.stderr
    own = json.loads(p.stdout)["measured_peak_bytes"]
    assert own == measure_json(tiny_artifact, "--no-select")["peak_bytes"] > 0
    assert json.loads((tmp_path / "r" / "result.json").read_text())["measured_peak_bytes"] == own
    assert "bfc_arena" not in p.stderr and "[I:onnxruntime" not in p.stderr


def test_a_capture_passes_on_errors_and_foreign_lines_only():
    """ORT's info and warning lines stay in the capture, as its default severity (ERROR)
    keeps them out of every other run; its errors and other programs' lines show."""
    from edgetrain.arenacapture import passed_on

    warn = ("\x1b[0;93m2026-11-26 05:10:59.5 [W:onnxruntime:Default, graph.cc:4198 "
            "CleanUnusedInitializersAndNodeArgs] Removing initializer 'c'.\x1b[m")
    assert not passed_on(warn)
    assert not passed_on(warn.replace("[W:", "[I:")) and not passed_on("  ")
    assert passed_on(warn.replace("[W:", "[E:"))
    assert passed_on("malloc(): corrupted top size")


def test_every_picture_splits_measures_activations_into_parts_that_sum_to_it(tiny_artifact,
                                                                            tmp_path):
    """Issue 38: `measure`'s activations, graph.svg's title and the parts of timeline.png and
    graph.png (each PNG carries its figure and parts as text) are one number, and each
    picture's parts (blocks, the pattern's space never live at once, the run-time
    allocations, what the allocator measured beyond the prediction) sum to it."""
    import json
    import xml.etree.ElementTree as ET

    from PIL import Image

    doc = measure_json(tiny_artifact, "--plot", tmp_path / "plots")
    measured = doc["breakdown"]["activations"]
    assert measured > 0 and sum(v for _, v in doc["activation_parts"]) == measured
    plots = {Path(p).name: Path(p) for p in doc["plots"]}
    for name in ("timeline.png", "graph.png"):
        meta = json.loads(Image.open(plots[name]).text["Description"])
        assert meta["activations_bytes"] == measured
        assert sum(v for _, v in meta["parts"]) == measured
    svg = ET.parse(plots["graph.svg"]).getroot()
    ns = "{http://www.w3.org/2000/svg}"
    labels = [int(g.get("data-activation-bytes")) for g in svg.iter(ns + "g")
              if g.get("class") in ("block", "rest")]
    assert int(svg.get("data-activation-bytes")) == sum(labels) == measured
    assert not [g.get("data-block") for g in svg.iter(ns + "g")
                if (g.get("data-block") or "").endswith("_Grad")]  # gradients sit in blocks


def test_selection_replays_one_restarted_step_and_the_peak_does_not_depend_on_steps(
        tiny_artifact):
    """measure's replay of selection restarts a candidate for one optimizer step, whatever
    --steps times: a step's memory is the same every step, so the peak is the same at 1 or 4
    timed steps, with or without the replay."""
    one, four = measure_json(tiny_artifact, "--steps", "1"), measure_json(tiny_artifact,
                                                                        "--steps", "4")
    assert (one["optimizer_steps"], four["optimizer_steps"]) == (2, 5)
    assert len(four["step_times_s"]) == 4
    assert one["peak_bytes"] == four["peak_bytes"]
    bare = measure_json(tiny_artifact, "--steps", "4", "--no-select")
    assert bare["optimizer_steps"] == 4 and bare["peak_bytes"] <= four["peak_bytes"]
