"""Issue 17: bytes outside the cap are bounded, I/O and malformed input are clear errors with
their documented exit status, and no kill or damage leaves leftovers or a dead end. Each test
asserts the message, the status, no traceback, and that saved work is byte for byte kept."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

from conftest import ROOT, cli, tiny_data
from device_sim.faults import ENV
from test_bad_input import art, refused, reseal, resume, rewrite_manifest, saved, snapshot  # noqa: F401


def kept(run: Path) -> dict:
    """What a run folder has saved (its lock file only names the last holder)."""
    return {k: v for k, v in snapshot(run).items() if k != ".lock"}


def clean(p, code: int, message: str) -> None:
    assert p.returncode == code, (p.returncode, p.stderr)
    assert message in p.stderr, p.stderr
    assert "Traceback" not in p.stderr, p.stderr


def run(artifact, data, out, *extra, fault: str | None = None, test=None, **env_extra):
    env = {**os.environ, "PYTHONPATH": str(ROOT), **env_extra}
    env.pop(ENV, None)
    if fault:
        env[ENV] = fault
    cmd = [sys.executable, "-m", "edgetrain.cli", "personalise", str(artifact), "--data",
           str(data), "--budget", "4MiB", "--epochs", "1", "--checkpoint-every", "4",
           "--out", str(out), *(["--test", str(test)] if test else []), *map(str, extra)]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)


# ---- 4: bytes outside the cap ---------------------------------------------------------------
@pytest.mark.parametrize("junk_bytes, message", [(1000, "carries properties"),
                                                   (300_000, "more than its tensors can take")])
def test_a_checkpoint_carrying_properties_is_refused_before_it_loads(art, saved, junk_bytes,  # noqa: F811
                                                                     message):
    code = f"""
from edgetrain.ort_device import training_api
api = training_api()
s = api.CheckpointState.load_checkpoint({str(art / 'checkpoint')!r})
s.properties["junk"] = "x" * {junk_bytes}
api.CheckpointState.save_checkpoint(s, {str(art / 'checkpoint')!r})
"""
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT,
                   env={**os.environ, "PYTHONPATH": str(ROOT)})
    reseal(art, "checkpoint")  # a hostile artifact is consistent with its manifest
    refused(resume(art, saved), saved, message)


def test_an_image_shape_the_plan_does_not_tile_is_refused(art, saved):  # noqa: F811
    d = json.loads((art / "manifest.json").read_text())
    rewrite_manifest(art, input={**d["input"], "image_shape": [3, 64000, 64000]})
    refused(resume(art, saved), saved, "input.image_shape")


RSS_CODE = """
import json, sys
def rss(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) * 1024
from edgetrain.cli import main
from edgetrain.ort_device import training_api
training_api()
base = rss("VmRSS")
try:
    main(sys.argv[1:], standalone_mode=False)
except SystemExit:
    pass
print(json.dumps({"base": base, "peak": rss("VmHWM")}))
"""
OUTSIDE_BOUND_BYTES = 24 << 20  # docs/concepts.md, "What lives outside the cap"


SELECT_BYTES_PER_WINDOW = 64  # docs/concepts.md: the validation slice's indices and scores


def peak_rss(artifact, data: Path, out: Path, *extra: str) -> dict:
    p = subprocess.run([sys.executable, "-c", RSS_CODE, "personalise", str(artifact), "--data",
                        str(data), "--budget", "12MiB", "--epochs", "1", "--micro-batch", "64",
                        "--out", str(out), "--json", *extra], capture_output=True, text=True,
                       cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=600)
    assert p.returncode == 0 and (out / "result.json").is_file(), p.stderr[-2000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_process_memory_outside_the_cap_does_not_grow_with_the_data(tiny_artifact, tmp_path):
    """100,000 windows (74 MiB as float32) in a compressed .npz under a 12 MiB budget: the
    process's peak RSS above its size once the libraries are loaded stays within the budget plus
    the stated bound, and is the same, within 4 MiB, as with 1,000 windows (the data as float32
    differ by 73 MiB; the run-to-run noise of the peak is about 2 MiB). With on-device
    selection (the default) the validation slice adds its stated bytes per window."""
    peaks = {}
    for n in (1000, 100_000):
        rng = np.random.default_rng(0)
        y = rng.integers(0, 3, n)
        x = np.zeros((n, 3, 8, 8), np.float32)
        x[np.arange(n), y] += 1.0
        np.savez_compressed(tmp_path / f"d{n}.npz", x=x, y=y)
        del x
        for mode in ("--no-select", "--select"):
            r = peak_rss(tiny_artifact, tmp_path / f"d{n}.npz", tmp_path / f"run{n}{mode}", mode)
            peaks[n, mode] = r["peak"] - r["base"]
    for mode, per_window in (("--no-select", 0), ("--select", SELECT_BYTES_PER_WINDOW)):
        assert peaks[100_000, mode] <= (12 << 20) + OUTSIDE_BOUND_BYTES + per_window * 100_000
        assert peaks[100_000, mode] - peaks[1000, mode] <= (4 << 20) + per_window * 99_000, peaks


# ---- 7: errors, not tracebacks --------------------------------------------------------------
@pytest.mark.parametrize("target", ["inference.onnx", "result.json", "checkpoint",
                                    "state-00000008.json"])
def test_a_full_disk_at_any_write_exits_4_and_resume_finishes(tiny_artifact, saved, tmp_path,
                                                              target):
    out = tmp_path / "run"
    p = run(tiny_artifact, saved["data"], out, fault=f"file-written={target}:1:ENOSPC")
    clean(p, 4, "No space left on device")
    assert "Nothing already saved was changed" in p.stderr
    kept = snapshot(out / "resume")
    assert kept and not [n for n in kept if ".tmp-" in n]  # earlier points, no temporaries
    p = run(tiny_artifact, saved["data"], out, "--resume")
    assert p.returncode == 0, p.stderr
    assert (out / "result.json").is_file()


@pytest.fixture(scope="module")
def sparse_artifact(tmp_path_factory) -> Path:
    import torch

    from conftest import TINY_CLASSES, TINY_SHAPE, tiny_model
    from edgetrain.manifest import Plan
    from exporters.export import export_artifact

    out = tmp_path_factory.mktemp("sparse") / "art"
    export_artifact(tiny_model(), torch.zeros(2, *TINY_SHAPE), out, classes=TINY_CLASSES,
                    plan=Plan(micro_batch=4), lr=1e-2, density=0.5, freeze_batchnorm=True)
    return out


def test_a_full_disk_during_a_mask_update_exits_4(sparse_artifact, saved, tmp_path):
    out = tmp_path / "run"
    p = run(sparse_artifact, saved["data"], out, "--mask-update", "set", "--mask-every", "1",
            fault="state-rewritten:1:ENOSPC")
    clean(p, 4, "could not write")
    assert "temporary checkpoint" in p.stderr and "--resume" in p.stderr


def test_a_kill_during_a_mask_update_leaves_no_temporary_anywhere(sparse_artifact, saved,
                                                                  tmp_path):
    out, tmp = tmp_path / "run", tmp_path / "tmpdir"
    tmp.mkdir()
    p = run(sparse_artifact, saved["data"], out, "--mask-update", "set", "--mask-every", "1",
            fault="state-rewritten:2", TMPDIR=str(tmp))
    assert p.returncode == -9
    left = [str(q.relative_to(out)) for q in out.rglob("*")]
    assert not [n for n in left if ".tmp-" in n or n.split("/")[0] not in (".lock", "resume",
                                                                          "select")], left
    assert not os.listdir(tmp)


def _in_readonly(folder: Path, args: list[str]) -> subprocess.CompletedProcess:
    """Run the CLI with `folder` mounted read-only (a user and mount namespace)."""
    f = str(folder)
    cmd = ["unshare", "-rm", "sh", "-c", f'mount --bind "{f}" "{f}" && mount -o remount,ro,bind '
           f'"{f}" "{f}" && exec "$@"', "sh", sys.executable, "-m", "edgetrain.cli", *args]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_a_read_only_run_folder_is_refused_at_once(saved, tmp_path):  # noqa: F811
    f = str(tmp_path)
    probe = subprocess.run(["unshare", "-rm", "sh", "-c", f'mount --bind "{f}" "{f}" && mount '
                            f'-o remount,ro,bind "{f}" "{f}" && touch "{f}/x"'],
                           capture_output=True, text=True) if shutil.which("unshare") else None
    if probe is None or "Read-only" not in probe.stderr:
        pytest.skip("no user and mount namespaces here to make a folder read-only")
    ro = tmp_path / "ro"
    shutil.copytree(saved["run"], ro)
    before = snapshot(ro)
    for extra in ([], ["--resume"]):
        p = _in_readonly(ro, ["personalise", str(saved["artifact"]), "--data", str(saved["data"]),
                              "--budget", "4MiB", "--epochs", "2", "--out", str(ro), *extra])
        clean(p, 2, "Read-only file system")
    assert snapshot(ro) == before


def _npz_with_header(path: Path, shape) -> Path:
    """An .npz whose x.npy header claims `shape` but holds 192 floats."""
    import io
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": "<f4", "fortran_order": False,
                                               "shape": shape})
    buf.write(np.zeros(192, np.float32).tobytes())
    ybuf = io.BytesIO()
    np.save(ybuf, np.zeros(1, np.int64))
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("x.npy", buf.getvalue())
        z.writestr("y.npy", ybuf.getvalue())
    return path


@pytest.mark.parametrize("make, message", [
    (lambda p, d: p.write_bytes(d.read_bytes()[:1000]), "truncated or damaged"),
    (lambda p, d: p.write_bytes(_flip(d.read_bytes())), "fails its checksum"),
    (lambda p, d: np.save(open(p, "wb"), np.zeros((4, 3, 8, 8), np.float32)), "single .npy"),
    (lambda p, d: _npz_with_header(p, (5 * 10**12, 3, 8, 8)), "truncated or corrupt"),
    (lambda p, d: np.savez(p, x=np.array([{}] * 4, dtype=object), y=np.zeros(4)), "Python objects"),
], ids=["truncated", "bit-flipped", "npy-renamed", "header-1e15", "pickled"])
def test_damaged_data_files_are_refused(tiny_artifact, saved, tmp_path, make, message):
    bad = tmp_path / "bad.npz"
    make(bad, saved["data"])
    refused(resume(tiny_artifact, saved, data=bad), saved, message)


def _flip(raw: bytes) -> bytes:
    b = bytearray(raw)
    b[len(b) // 2] ^= 0xFF
    return bytes(b)


@pytest.mark.parametrize("change, message", [
    (lambda d: d.update(files=list(d["files"].values())), "manifest field files"),
    (lambda d: d["plan"].update(micro_batch="8"), "plan.micro_batch is '8'"),
    (lambda d: d.pop("trainable"), "trainable is missing"),
    (lambda d: d["input"].update(sample_shape=[3, -8, 8]), "input.sample_shape"),
], ids=["files-list", "micro-batch-string", "missing-key", "negative-shape"])
def test_malformed_manifests_are_refused(art, saved, change, message):  # noqa: F811
    d = json.loads((art / "manifest.json").read_text())
    change(d)
    (art / "manifest.json").write_text(json.dumps(d))
    refused(resume(art, saved), saved, message)


def test_a_deeply_nested_manifest_is_refused(art, saved):  # noqa: F811
    (art / "manifest.json").write_text('{"schema_version": 1, "x": ' + "[" * 100000
                                       + "]" * 100000 + "}")
    refused(resume(art, saved), saved, "is not valid JSON")


@pytest.mark.parametrize("args, code, message", [
    (["--micro-batch", "100"], 2, "fewer than one optimizer step"),
    (["--micro-batch", "1000000000"], 3, "more than the whole budget"),
    (["--micro-batch", "1000000000", "--epochs", "0"], 3, "more than the whole budget"),
    (["--budget", "100000000000000000000000GiB"], 2, "beyond any device"),
    (["--budget", "10^23GiB"], 2, "is not a byte size"),
])
def test_sizes_beyond_reason_are_refused(tiny_artifact, saved, tmp_path, args, code, message):
    p = cli("personalise", tiny_artifact, "--data", saved["data"], "--budget", "4MiB",
            "--out", tmp_path / "run", *args)
    clean(p, code, message)
    assert not (tmp_path / "run").exists()


# ---- 8: no leftovers, no dead ends ----------------------------------------------------------
def test_temporaries_of_a_kill_during_the_final_writes_are_removed(tiny_artifact, saved,
                                                                   tmp_path):
    out = tmp_path / "run"
    assert run(tiny_artifact, saved["data"], out, fault="file-written=inference.onnx:1"
               ).returncode == -9
    assert [n for n in os.listdir(out) if ".tmp-" in n]  # the kill left one behind
    assert run(tiny_artifact, saved["data"], out, "--resume").returncode == 0
    assert not [n for n in os.listdir(out) if ".tmp-" in n]


def test_a_folder_whose_resume_points_are_all_damaged_starts_again(tiny_artifact, saved,
                                                                   tmp_path):
    out = tmp_path / "run"
    assert run(tiny_artifact, saved["data"], out, fault="step:9").returncode == -9
    for ckpt in (out / "resume").glob("ckpt-*"):
        ckpt.write_bytes(_flip(ckpt.read_bytes()))
    damaged = snapshot(out / "resume")
    p = run(tiny_artifact, saved["data"], out)  # without --resume: says to pass it
    clean(p, 2, "pass --resume")
    p = run(tiny_artifact, saved["data"], out, "--resume", "--json")
    assert p.returncode == 0, p.stderr
    aside = Path(json.loads(p.stdout)["damaged_resume_points_moved_to"])
    assert snapshot(aside) == damaged  # kept byte for byte, not deleted


@pytest.mark.parametrize("change", [["--threads", "1"], ["--test", "TEST"]])
def test_resume_refuses_other_threads_or_test_data(tiny_artifact, saved, tmp_path, change):
    out = tmp_path / "run"
    assert run(tiny_artifact, saved["data"], out, fault="step:5").returncode == -9
    before = kept(out)
    extra = [str(saved["data"]) if c == "TEST" else c for c in change]
    p = run(tiny_artifact, saved["data"], out, "--resume", *extra)
    clean(p, 2, "other settings or other data")
    # ...and says which
    said = "--threads: 2 then, 1 now" if change[0] == "--threads" else \
        "validation and test data (another file)"
    assert said in p.stderr, p.stderr
    assert kept(out) == before


def test_resume_takes_the_plans_values_given_or_not(tiny_artifact, saved, tmp_path):
    """A run started with --micro-batch equal to the plan's resumes without it (the settings
    compared are the values in force)."""
    from edgetrain.manifest import load_manifest

    out = tmp_path / "run"
    plan_batch = str(load_manifest(tiny_artifact).plan.micro_batch)
    assert run(tiny_artifact, saved["data"], out, "--micro-batch", plan_batch,
               fault="step:5").returncode == -9
    p = run(tiny_artifact, saved["data"], out, "--resume", "--json")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["resumed_from_step"] is not None


def test_the_measuring_child_dies_with_measure(tiny_artifact):
    """A killed `measure` leaves no child process running its graph (issue 37: a child
    reparented to init was still spinning 35 minutes later)."""
    import signal
    import time

    p = subprocess.Popen([sys.executable, "-m", "edgetrain.cli", "measure", str(tiny_artifact),
                          "--batch", "4", "--steps", "100000"], cwd=ROOT,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        child = None
        for _ in range(600):  # the child starts after the parent's imports
            out = subprocess.run(["pgrep", "-P", str(p.pid)], capture_output=True, text=True)
            if out.stdout.split():
                child = int(out.stdout.split()[0])
                break
            time.sleep(0.1)
        assert child is not None, "measure started no child"
        time.sleep(2.0)  # let it run its graph
        os.kill(p.pid, signal.SIGKILL)
        p.wait()
        for _ in range(100):
            if not Path(f"/proc/{child}").exists() or \
                    Path(f"/proc/{child}/stat").read_text().split()[2] == "Z":
                break
            time.sleep(0.1)
        else:
            os.kill(child, signal.SIGKILL)
            pytest.fail("the measuring child outlived measure")
    finally:
        if p.poll() is None:
            p.kill()
