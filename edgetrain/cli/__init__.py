"""The `edgetrain` command line: each command parses, calls one tested function, prints.

  export_cmd.py   export, keygen              host side: imports torch inside the command
  train_cmd.py    personalise, reset-bn       device side: never loads torch
  measure_cmd.py  devices, measure, fit       the simulator drives the runtime from outside
  plan_cmd.py     plan                        the fastest plan that fits (predicted, confirmed)
  fleet_cmd.py    fleet, fleet-report         many users x devices on Ray, one process a run
Byte sizes such as "15MB" or "8MiB" are parsed here (common.py) and nowhere else. This
sub-package is the one place on the device side that may import exporters and device_sim
(tests/test_layering.py); host-only imports happen inside the commands that need them.
"""
from __future__ import annotations

import click

from device_sim.faults import install_from_env
from edgetrain import watchdog
from edgetrain.cli.common import parse_bytes
from edgetrain.cli.export_cmd import export, keygen
from edgetrain.cli.fleet_cmd import fleet, fleet_report
from edgetrain.cli.measure_cmd import devices, fit, measure
from edgetrain.cli.plan_cmd import plan
from edgetrain.cli.train_cmd import personalise, reset_bn

__all__ = ["main", "parse_bytes"]


# Every option can also come from the environment: EDGETRAIN_<COMMAND>_<OPTION>, e.g.
# EDGETRAIN_EXPORT_EPOCHS=0 or EDGETRAIN_PERSONALISE_EPOCHS=1 (click's auto_envvar_prefix;
# docs/cli.md); a flag on the command line wins.
@click.group(context_settings={"help_option_names": ["-h", "--help"],
                               "auto_envvar_prefix": "EDGETRAIN"})
@click.version_option(package_name="edgetrain", message="%(prog)s %(version)s")
def main():
    """On-device training for wearables: export, personalise and measure under a RAM budget."""
    install_from_env()  # EDGETRAIN_FAULT: the simulator's fault injection (device_sim/faults)
    watchdog.enable()  # a device call past its bound ends this process (edgetrain/watchdog.py)


for command in (devices, export, keygen, personalise, reset_bn, measure, fit, plan, fleet,
                fleet_report):
    main.add_command(command)
