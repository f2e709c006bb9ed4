"""Issue 39, in part: the artifact is for the watch unless the host is asked for. A portable
export holds no host-only kernel; a host export is refused, before it loads, on a device whose
ONNX Runtime lacks its kernels (exit 2, with the fix); the target is recorded and checked."""
from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
import torch
from torch import nn

from conftest import cli
from edgetrain.manifest import Plan, load_manifest
from edgetrain.names import NCHWC_DOMAIN
from edgetrain.specs import ArtifactError
from edgetrain.targets import TARGETS, graph_domains
from exporters.export.arguments import resolve_target
from exporters.export import export_artifact
from exporters.passes.nchwc import host_block


def depthwise_net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(),
                         nn.Conv2d(16, 16, 3, padding=1, groups=16), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 3))


def export(out, **kw):
    return export_artifact(depthwise_net(), torch.zeros(2, 3, 16, 16), out,
                           classes=["a", "b", "c"], plan=Plan(micro_batch=4), **kw)


def domains(folder) -> set[str]:
    return {n.domain for f in folder.glob("*.onnx") for n in onnx.load(f).graph.node}


def test_the_default_export_is_portable_and_holds_no_host_kernel(tmp_path):
    m = export(tmp_path / "a")
    assert m.plan.target == "portable" and m.plan.nchwc_block == 0
    assert domains(tmp_path / "a") <= TARGETS["portable"].domains
    assert NCHWC_DOMAIN not in graph_domains(tmp_path / "a", {r: e.path for r, e in
                                                                m.files.items()})


@pytest.mark.skipif(host_block() <= 1, reason="this CPU has no NCHWc kernels")
def test_a_host_export_is_refused_on_a_watch_and_runs_here(tmp_path):
    m = export(tmp_path / "host", target="host")
    assert m.plan.target == "host" and NCHWC_DOMAIN in domains(tmp_path / "host")
    x = np.random.default_rng(0).standard_normal((24, 3, 16, 16)).astype(np.float32)
    np.savez(tmp_path / "d.npz", x=x, y=np.arange(24) % 3)
    run = ("personalise", tmp_path / "host", "--data", tmp_path / "d.npz", "--epochs", "1")
    p = cli(*run, "--device", "watchos-extension", "--out", tmp_path / "r1")
    assert p.returncode == 2 and "does not have" in p.stderr and "--target arm64" in p.stderr
    assert "Traceback" not in p.stderr and not (tmp_path / "r1" / "checkpoint").exists()
    p = cli(*run, "--budget", "64MiB", "--out", tmp_path / "r2")
    assert p.returncode == 0, p.stderr
    p = cli("measure", tmp_path / "host", "--batch", "4", "--device", "mcu-8mb")
    assert p.returncode == 2 and "--target portable" in p.stderr, p.stderr


def test_the_target_and_the_nchwc_kernels_agree():
    assert resolve_target(None, None) == ("portable", False)
    assert resolve_target("host", None) == ("host", True)
    assert resolve_target(None, True) == ("host", True)
    assert resolve_target("host", False) == ("host", False)
    with pytest.raises(ValueError, match="target 'arm64' has none"):
        resolve_target("arm64", True)
    with pytest.raises(ValueError, match="is not one of"):
        resolve_target("riscv", None)


def test_a_manifest_naming_an_unknown_target_is_refused(tmp_path):
    export(tmp_path / "a")
    d = json.loads((tmp_path / "a" / "manifest.json").read_text())
    d["plan"]["target"] = "riscv"
    (tmp_path / "a" / "manifest.json").write_text(json.dumps(d))
    with pytest.raises(ArtifactError, match="plan.target"):
        load_manifest(tmp_path / "a")


@pytest.mark.parametrize("network", ["imu_cnn", "imu_transformer", "mobilenet_v1",
                                     "patch_mobilenet",
                                     pytest.param("resnet50", marks=pytest.mark.slow)])
def test_every_built_in_network_exports_portable_and_round_trips(tmp_path, network):
    """Issue 39: the portable export of each built-in network (untrained, a narrow width)
    uses only the portable target's operator domains, and its manifest round-trips in memory
    and through JSON."""
    from edgetrain.manifest import Manifest
    from exporters.export import ExportOptions
    from exporters.models.pretrain import PretrainConfig, export_named

    width = 0.25 if network in ("mobilenet_v1", "patch_mobilenet", "resnet50") else None
    m = export_named(PretrainConfig(model=network, epochs=0, width=width), tmp_path / "a",
                     ExportOptions(plan=Plan(micro_batch=2)), cache_dir=None,
                     show_progress=False)
    files = {r: e.path for r, e in m.files.items()}
    assert m.plan.target == "portable" and m.plan.nchwc_block == 0
    assert graph_domains(tmp_path / "a", files) <= TARGETS["portable"].domains
    assert NCHWC_DOMAIN not in domains(tmp_path / "a")
    assert Manifest.from_dict(m.to_dict()) == m == load_manifest(tmp_path / "a")
    assert Manifest.from_dict(json.loads(json.dumps(m.to_dict()))) == m
