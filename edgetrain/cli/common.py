"""What every `edgetrain` command shares: byte sizes parsed from text ("15MB", "8MiB"), the
budget options, exit statuses, errors printed without a traceback, progress bars.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import sys
from fractions import Fraction
from pathlib import Path

import click

from device_sim.layout import reexec_with_fixed_layout
from device_sim.profiles import PROFILES, get_profile
from edgetrain.atomicfile import WriteError
from edgetrain.budget import MAX_BUDGET_BYTES, BudgetError
from edgetrain.manifest import ArtifactError
from edgetrain.personalise import Interrupted, TrainingDiverged
from edgetrain import watchdog
from edgetrain.watchdog import StalledError

EXIT_BAD_INPUT = 2
EXIT_BUDGET = 3
EXIT_DISK = 4  # a checkpoint could not be written (disk full, I/O error)
EXIT_DIVERGED = 5  # training diverged (NaN/Inf loss); the last good resume point is kept
EXIT_STALLED = watchdog.EXIT_STALLED  # 7: a device call ran past the watchdog's bound
EXIT_INTERNAL = 1  # a fault of edgetrain itself: a one-line report (EDGETRAIN_DEBUG=1: traceback)
UNITS = {"": 1, "b": 1, "kb": 1000, "mb": 1000**2, "gb": 1000**3,
         "kib": 1024, "mib": 1024**2, "gib": 1024**3}


def parse_bytes(text: str) -> int:
    """'8692224', '15MB' (10^6), '15MiB' (2^20), '1.5GiB' -> bytes (exact: no float rounding)."""
    m = re.fullmatch(r"\s*(-?\d{1,30}(?:\.\d{1,30})?)\s*([a-zA-Z]*)\s*", str(text))
    if not m or m.group(2).lower() not in UNITS:
        raise click.BadParameter(f"{text!r} is not a byte size; write e.g. 8692224, 15MB or 16MiB")
    n = int(Fraction(m.group(1)) * UNITS[m.group(2).lower()])
    if n <= 0:  # the same mistake, the same status (2) in every command
        raise click.BadParameter(f"{text!r} is not a positive number of bytes: a budget must "
                                 "be above 0; write e.g. 15MB or 16MiB, or use --device NAME")
    if n > MAX_BUDGET_BYTES:
        raise click.BadParameter(f"{text!r} is {n:.3g} bytes, beyond any device (at most "
                                 f"{MAX_BUDGET_BYTES} bytes, 256 TiB); write e.g. 16MB")
    return n


class Bytes(click.ParamType):
    name = "BYTES"

    def convert(self, value, param, ctx):
        return value if isinstance(value, int) else parse_bytes(value)


def fixed_address_layout() -> None:
    """For commands that train: run with a fixed address layout, as the measurement does, so
    a budget equal to a measured peak holds (device_sim/layout.py). Only when this process is
    the command itself, never when a caller merely invokes it in-process."""
    argv = sys.orig_argv
    if (Path(sys.argv[0]).name == "edgetrain"
            or any(a == "-m" and b == "edgetrain.cli" for a, b in zip(argv, argv[1:]))):
        reexec_with_fixed_layout()


JSON_META = "edgetrain.json"  # click context meta: the command was given --json


def fail(message: str, code: int) -> None:
    """The error on stderr; under --json also as a JSON object on stdout (what a script
    reads): {"error": message, "exit_status": code}."""
    click.echo(f"error: {message}", err=True)
    ctx = click.get_current_context(silent=True)
    if ctx is not None and ctx.meta.get(JSON_META):
        click.echo(json.dumps({"error": message, "exit_status": code}))
    sys.exit(code)


def resolve_budget(device: str | None, budget: int | None) -> tuple[str | None, int | None]:
    """(device, budget_bytes) from --device or --budget (at most one of them)."""
    if device and budget is not None:
        raise click.UsageError("give --device or --budget, not both")
    if device:
        return device, get_profile(device).ram_budget_bytes
    return None, budget


def device_option(help_text: str = "Device profile (budget)."):
    return click.option("--device", type=click.Choice(sorted(PROFILES)), help=help_text)


def budget_option(help_text: str = "RAM budget, e.g. 15MB or 8692224."):
    return click.option("--budget", type=Bytes(), help=help_text)


def _remember_json(ctx, _param, value):
    ctx.meta[JSON_META] = bool(value)
    return value


json_option = click.option(
    "--json", "as_json", is_flag=True, callback=_remember_json,
    help="Print the result as JSON on stdout (an error too: {\"error\": ..., \"exit_status\": N}, "
         "beside the line on stderr).")


@contextlib.contextmanager
def exit_on_device_errors():
    """A budget too small exits 3; a full disk exits 4; a bad artifact, bad data or bad
    argument exits 2."""
    try:
        yield
    except BudgetError as e:
        fail(str(e), EXIT_BUDGET)
    except WriteError as e:  # checkpoints, resume points, results, temporaries
        fail(str(e), EXIT_DISK)
    except TrainingDiverged as e:
        fail(str(e), EXIT_DIVERGED)
    except StalledError as e:  # a measuring child its watchdog stopped (edgetrain/watchdog.py)
        fail(str(e), EXIT_STALLED)
    except Interrupted as e:  # 128 + the signal, as a shell reports a signalled process
        fail(str(e), 128 + e.signum)
    except (ArtifactError, ValueError) as e:  # DataError and ResumeError are ValueErrors
        fail(str(e), EXIT_BAD_INPUT)
    except RecursionError as e:
        fail(f"input nested too deeply to read ({e}); nothing was changed", EXIT_BAD_INPUT)
    except MemoryError as e:
        fail(f"this machine could not allocate the memory asked for ({e or 'MemoryError'}): "
             "use a smaller --micro-batch or --batch; nothing saved was changed", EXIT_BUDGET)
    except OSError as e:  # a read or write the steps above did not expect
        fail(f"I/O error: {e}; nothing already saved was changed. Check the disk and the "
             "paths given, then run again (with --resume if a run had started)", EXIT_DISK)
    except click.ClickException as e:  # usage errors: click prints them, exit status 2
        ctx = click.get_current_context(silent=True)
        if ctx is not None and ctx.meta.get(JSON_META):  # and a script reads them on stdout
            click.echo(json.dumps({"error": e.format_message(), "exit_status": e.exit_code}))
        raise
    except Exception as e:
        if os.environ.get("EDGETRAIN_DEBUG"):
            raise
        fail(f"internal error ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
             "; nothing already saved was changed. Please report it with the command line; "
             "EDGETRAIN_DEBUG=1 prints the traceback", EXIT_INTERNAL)


@contextlib.contextmanager
def budget_advice(artifact, micro_batch: int | None = None, threads: int | None = None,
                  batch_option: str = "--micro-batch", adapt: str = "none"):
    """A budget error gets the failing step's predicted need (the manifest predicts the
    plan's micro-batch only; `adapt` as personalise --adapt: with the BatchNorm statistics
    pass, where it runs) and names this command's batch option."""
    try:
        yield
    except BudgetError as e:
        from device_sim.reports import with_predicted_need  # host side: reads the graphs

        told = with_predicted_need(e, artifact, e.micro_batch or micro_batch,
                                   e.threads or threads, adapt)
        raise BudgetError(str(told).replace("--micro-batch", batch_option), told.budget_bytes,
                          told.needed_bytes, told.micro_batch, told.threads,
                          told.predicted) from e


def refuse_unused(params: tuple[str, ...], needs: str) -> None:
    """A usage error (exit 2) when the command line gave one of the current command's
    `params` where it does nothing without `needs` (e.g. --mask-every without --mask-update):
    a setting silently ignored is a run the user did not ask for. Values from the
    environment (EDGETRAIN_<COMMAND>_<OPTION>) may be set for every run, so they pass."""
    ctx = click.get_current_context()
    given = [p for p in params
             if ctx.get_parameter_source(p) == click.core.ParameterSource.COMMANDLINE]
    if given:
        opts = ", ".join("--" + p.replace("_", "-") for p in given)
        raise click.UsageError(f"{opts} does nothing without {needs}: add it, or leave "
                               f"{opts} out")


def mib(n: int | None) -> str:
    return "-" if n is None else f"{n:,} bytes ({n / 2**20:.2f} MiB)"


def progress_bar(file=None, **kwargs):
    """A tqdm bar on stderr (or `file`), shown only when it is a terminal. `nrows` is set: on
    a terminal that reports no size (a pty under `script`, some CI consoles) tqdm's own guess
    is -1 rows, and it then draws nothing at all."""
    from tqdm import tqdm

    return tqdm(file=file or sys.stderr, disable=None, nrows=20, mininterval=1.0, **kwargs)


class Progress:
    """A bar on stderr for a long run (its phase, steps and time left), or nothing."""

    def __init__(self, enabled: bool, desc: str = "personalise"):
        self.enabled, self.desc, self.bar, self._file = enabled, desc, None, None
        self._phase: str | None = None

    def __enter__(self):
        if not self.enabled:
            return None

        def update(done: int, total: int, phase: str | None = None) -> None:
            if self.bar is None:  # made at the first step, on a copy of where stderr points
                # then: the run's allocator-log capture closes its own before the bar's last line
                self._file = os.fdopen(os.dup(sys.stderr.fileno()), "w", buffering=1,
                                       encoding="utf-8", errors="replace")
                self.bar = progress_bar(self._file, total=total, desc=self.desc, unit="step")
            if phase and phase != self._phase:  # (a disabled tqdm keeps no description)
                self._phase = phase
                self.bar.set_description(f"{self.desc} ({phase})", refresh=False)
            self.bar.total = total
            self.bar.update(done - self.bar.n)
        return update

    def __exit__(self, *exc):
        if self.bar is not None:
            self.bar.close()
            self._file.close()
        return False


def check_target(artifact, device: str | None) -> None:
    """With --device P, refuse (exit 2) an artifact whose graphs use kernels P's ONNX Runtime
    lacks: a host export's NCHWc convolutions on a watch (edgetrain/targets.py)."""
    if device is None:
        return
    from edgetrain.manifest import load_manifest
    from edgetrain.targets import check_runs_on

    m = load_manifest(artifact, verify=False)  # the run verifies every byte when it opens
    check_runs_on(artifact, {r: e.path for r, e in m.files.items()},
                  get_profile(device).target, f"device {device}")

