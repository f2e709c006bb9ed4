"""Issue 38: what a newcomer trips on. The README's Python blocks run from the folder above a
clone named edgetrain/ (which a namespace package lookup would mistake for the package)."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from conftest import ROOT


def test_the_readmes_python_runs_from_the_folder_above_a_clone(tmp_path):
    subprocess.run(["git", "clone", "-q", str(ROOT), str(tmp_path / "edgetrain")], check=True)
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    assert len(blocks) >= 2
    (tmp_path / "tour.py").write_text("\n".join(blocks))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # as a user's shell
    p = subprocess.run([sys.executable, "tour.py"], cwd=tmp_path, capture_output=True,
                       text=True, timeout=900, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    assert (tmp_path / "artifacts" / "mine" / "manifest.json").is_file()


def under_a_pty(args, timeout: float = 300) -> tuple[int, str, float | None]:
    """Run the CLI with stdout and stderr on a pseudo-terminal, as in a user's shell; its exit
    status, everything it printed, and when (s after start) a progress bar first showed."""
    import pty
    import select
    import time

    master, slave = pty.openpty()
    t0 = time.monotonic()
    p = subprocess.Popen([sys.executable, "-m", "edgetrain.cli", *map(str, args)], cwd=ROOT,
                         stdin=subprocess.DEVNULL, stdout=slave, stderr=slave,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    os.close(slave)
    out, first_bar = b"", None
    while time.monotonic() - t0 < timeout:
        if select.select([master], [], [], 0.2)[0]:
            try:
                chunk = os.read(master, 1 << 16)
            except OSError:  # the child closed the terminal
                break
            if not chunk:
                break
            out += chunk
            if first_bar is None and b"step" in chunk and b"%|" in chunk:
                first_bar = time.monotonic() - t0
        elif p.poll() is not None:
            break
    os.close(master)
    return p.wait(timeout=60), out.decode("utf-8", "replace"), first_bar


def test_personalise_shows_a_progress_bar_on_a_terminal_and_no_ort_warnings(tiny_artifact,
                                                                           tmp_path):
    from conftest import tiny_data
    import numpy as np

    x, y = tiny_data(400, seed=3)
    np.savez(tmp_path / "d.npz", x=x, y=y)
    code, out, first_bar = under_a_pty(["personalise", tiny_artifact, "--data", tmp_path / "d.npz",
                                        "--budget", "4MiB", "--epochs", "2", "--out",
                                        tmp_path / "run"])
    assert code == 0, out
    assert first_bar is not None and first_bar < 30, out  # the run itself takes a few s
    assert "personalise (lr 0.03, epoch 2/2): 100%" in out, out  # its last line, as it ended
    assert "[W:onnxruntime" not in out
    code, out, _ = under_a_pty(["reset-bn", tiny_artifact, "--data", tmp_path / "d.npz",
                                "--budget", "4MiB", "--out", tmp_path / "reset"])
    assert code == 0 and "[W:onnxruntime" not in out, out


MY_IMU_CNN = '''
import torch
class MyImuCnn(torch.nn.Sequential):
    def __init__(self):
        super().__init__(torch.nn.Conv1d(6, 8, 5, stride=4), torch.nn.BatchNorm1d(8),
                         torch.nn.ReLU(), torch.nn.AdaptiveAvgPool1d(1), torch.nn.Flatten(),
                         torch.nn.Linear(8, 7))
'''


@pytest.mark.slow
def test_byoms_raw_imu_example_takes_user_and_refuses_its_population(tmp_path):
    """docs/byom.md's own-model example with imu_window: it exports, prints its summary, and
    the artifact personalises --user 10 and refuses a user it learned from."""
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "docs" / "byom.md").read_text(), re.S)
    code = next(b for b in blocks if 'preprocess="imu_window"' in b)
    (tmp_path / "mine.py").write_text(MY_IMU_CNN + code)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.run([sys.executable, "mine.py"], cwd=tmp_path, capture_output=True,
                       text=True, timeout=900, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "exported custom to artifacts/mine-imu" in p.stdout and "(a prediction)" in p.stdout
    art = tmp_path / "artifacts" / "mine-imu"
    run = [sys.executable, "-m", "edgetrain.cli", "personalise", str(art), "--device",
           "watchos-extension", "--epochs", "1", "--user"]
    p = subprocess.run(run + ["10", "--out", str(tmp_path / "u10")], capture_output=True,
                       text=True, timeout=900, env=env, cwd=ROOT)
    assert p.returncode == 0 and "held-out accuracy: before" in p.stdout, p.stderr[-2000:]
    p = subprocess.run(run + ["3", "--out", str(tmp_path / "u3")], capture_output=True,
                       text=True, timeout=900, env=env, cwd=ROOT)
    assert p.returncode == 2 and "held-out users [10]" in p.stderr, p.stderr


def test_the_clis_network_names_are_the_exporters():
    from edgetrain.cli.export_cmd import NETWORK_NAMES
    from exporters.models.networks import NETWORKS

    assert sorted(NETWORK_NAMES) == sorted(NETWORKS)


def test_help_names_each_positional_once_and_every_option_says_what_it_does():
    from click.testing import CliRunner

    from edgetrain.cli import main

    for command in ("fleet", "fleet-report", "keygen", "personalise", "measure", "export"):
        usage = CliRunner().invoke(main, [command, "--help"]).output.splitlines()[0]
        for positional in ("SPEC", "DIR", "PREFIX", "ARTIFACT"):
            assert usage.count(positional) <= 1, usage
    for name, command in main.commands.items():
        for p in command.params:
            if isinstance(p, __import__("click").Option) and not p.help and "--help" not in p.opts:
                raise AssertionError(f"edgetrain {name} {p.opts[0]} has no help")


def test_resuming_a_finished_run_keeps_its_measured_peak(tiny_artifact, tmp_path):
    from conftest import cli, tiny_data
    import json
    import numpy as np

    x, y = tiny_data(48, seed=1)
    np.savez(tmp_path / "d.npz", x=x, y=y)
    args = ("personalise", tiny_artifact, "--data", tmp_path / "d.npz", "--budget", "4MiB",
            "--epochs", "1", "--out", tmp_path / "run")
    assert cli(*args).returncode == 0
    first = json.loads((tmp_path / "run" / "result.json").read_text())["measured_peak_bytes"]
    p = cli(*args, "--resume")
    assert p.returncode == 0, p.stderr
    again = json.loads((tmp_path / "run" / "result.json").read_text())["measured_peak_bytes"]
    assert again == first and first > 0


def test_measure_reports_the_steps_it_was_asked_for(tiny_artifact):
    import json

    from conftest import cli

    p = cli("measure", tiny_artifact, "--batch", "4", "--steps", "3", "--json")
    assert p.returncode == 0, p.stderr
    assert len(json.loads(p.stdout)["step_times_s"]) == 3


def test_budget_advice_for_a_python_export_names_export_artifacts_arguments(tiny_artifact):
    from edgetrain.budget import fixes
    from edgetrain.manifest import load_manifest

    advice = fixes(load_manifest(tiny_artifact), 4)
    assert 'export_artifact(update="head", recompute="sqrt", density=0.5)' in advice
    assert "--update head" not in advice


def test_devices_shows_a_budget_below_a_mib_in_kib():
    from conftest import cli

    p = cli("devices")
    assert p.returncode == 0 and "192 KiB" in p.stdout and "0.2 MiB" not in p.stdout


def test_rigl_says_before_it_runs_what_its_dense_gradient_graph_adds(tmp_path):
    import torch

    from conftest import TINY_CLASSES, TINY_SHAPE, cli, tiny_data, tiny_model
    from edgetrain.manifest import Plan
    from exporters.export import export_artifact
    import numpy as np

    art = tmp_path / "sparse"
    m = export_artifact(tiny_model(), torch.zeros(2, *TINY_SHAPE), art, classes=TINY_CLASSES,
                        plan=Plan(micro_batch=4), density=0.5, freeze_batchnorm=True)
    dense = sum(int(np.prod(k.shape)) * 4 for k in m.trained_masks)
    x, y = tiny_data(48, seed=1)
    np.savez(tmp_path / "d.npz", x=x, y=y)
    p = cli("personalise", art, "--data", tmp_path / "d.npz", "--budget", "4MiB", "--epochs",
            "1", "--mask-update", "rigl", "--out", tmp_path / "run")
    assert p.returncode == 0, p.stderr
    assert p.stderr.startswith("rigl: every mask update also runs the dense-gradient graph")
    assert f"dense gradient ({dense:,} bytes)" in p.stderr
