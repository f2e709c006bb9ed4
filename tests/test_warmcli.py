"""Commands forked from a warm process (device_sim/warmcli.py) do what the CLI started
afresh does: the same result, checkpoint and measured peak, the same exit status and error
for bad input; threads side by side each have their own server."""
from __future__ import annotations

import json
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from conftest import cli, tiny_data


def personalise(run, art, data, out) -> tuple[dict, bytes]:
    p = run("personalise", str(art), "--data", str(data), "--test", str(data), "--budget",
            "64MiB", "--epochs", "2", "--no-select", "--out", str(out), "--json")
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    keep = ("accuracy_before", "accuracy_after", "measured_peak_bytes", "optimizer_steps",
            "test_correct_after")
    return {k: r[k] for k in keep}, (out / "checkpoint").read_bytes()


def test_a_warm_command_is_the_fresh_command(tiny_artifact, tmp_path):
    from device_sim import warmcli

    x, y = tiny_data(24, seed=2)
    np.savez(tmp_path / "d.npz", x=x, y=y)
    fresh = personalise(cli, tiny_artifact, tmp_path / "d.npz", tmp_path / "fresh")
    warm = personalise(warmcli.run, tiny_artifact, tmp_path / "d.npz", tmp_path / "warm")
    assert warm == fresh and fresh[0]["optimizer_steps"] > 0

    bad = warmcli.run("personalise", str(tiny_artifact), "--data", str(tmp_path / "no.npz"),
                      "--budget", "64MiB", "--out", str(tmp_path / "bad"))
    ref = cli("personalise", tiny_artifact, "--data", tmp_path / "no.npz", "--budget",
              "64MiB", "--out", tmp_path / "bad")
    assert bad.returncode == ref.returncode != 0
    assert bad.stderr == ref.stderr and "Traceback" not in bad.stderr


def test_threads_side_by_side_have_their_own_servers(tiny_artifact, tmp_path):
    from device_sim import warmcli

    x, y = tiny_data(24, seed=3)
    np.savez(tmp_path / "d.npz", x=x, y=y)

    both = threading.Barrier(2)

    def one(i: int):
        both.wait()  # one task a thread
        r = personalise(warmcli.run, tiny_artifact, tmp_path / "d.npz", tmp_path / f"r{i}")
        return r, warmcli.server_pid()

    with ThreadPoolExecutor(2) as pool:
        runs = list(pool.map(one, range(2)))
    assert runs[0][0] == runs[1][0]  # the same run, side by side
    assert None not in (runs[0][1], runs[1][1]) and runs[0][1] != runs[1][1]
