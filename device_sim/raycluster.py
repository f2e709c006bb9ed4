"""Where a fleet's Ray tasks run: a cluster the user names (`--address`), or a local Ray of
the fleet's own.

    start_ray(None, workers=2)          # a new local instance, 2 CPUs
    start_ray("HEAD:6379", None)        # join a cluster started with `ray start`
    start_ray("auto", None)             # the cluster Ray recorded as latest on this machine

Without an address the fleet never joins another cluster: Ray's own default would follow
RAY_ADDRESS or /tmp/ray/ray_current_cluster, which a cluster that died leaves behind, and then
refuse the CPU count. A HOST:PORT the user names is checked before Ray is asked: Ray waits
minutes on an address nothing answers at.
"""
from __future__ import annotations

import logging
import os
import re
import socket

from device_sim.fleetspec import SpecError

CONNECT_TIMEOUT_S = 5.0
HOST_PORT = re.compile(r"^(?P<host>[^:/\s]+):(?P<port>\d+)$")


def _no_cluster(address: str, why: str) -> SpecError:
    return SpecError(f"no Ray cluster to join at --address {address!r} ({why}); start one "
                     "with `ray start --head` (docs/fleet.md), or leave --address out for a "
                     "local Ray of the fleet's own; no run was started")


def check_reachable(address: str, timeout_s: float = CONNECT_TIMEOUT_S) -> None:
    """A HOST:PORT address answers a TCP connection within `timeout_s`, or SpecError.
    Other forms (`auto`, `ray://...`) are left to Ray."""
    m = HOST_PORT.match(address)
    if not m:
        return
    port = int(m["port"])
    if not 0 < port < 65536:
        raise _no_cluster(address, f"port {port} is not a TCP port, 1 to 65535")
    try:
        with socket.create_connection((m["host"], port), timeout=timeout_s):
            pass
    except OSError as e:
        raise _no_cluster(address, f"nothing answered there within {timeout_s:g} s: "
                                   f"{e.strerror or e}") from None


def start_ray(address: str | None, workers: int | None) -> None:
    """Connect this process to Ray: the cluster at `address`, or a new local instance with
    `workers` CPUs (default: every core)."""
    import ray

    if address:
        check_reachable(address)
        try:
            ray.init(address=address, log_to_driver=False, logging_level=logging.WARNING)
        except ConnectionError as e:
            raise _no_cluster(address, str(e)) from None
        return
    # its own local cluster: Ray enables token authentication for it and warned on every run
    # that it had; the choice stays Ray's, the line is not the user's
    logging.getLogger("ray._private.authentication.authentication_token_setup"
                      ).setLevel(logging.ERROR)
    ray.init(address="local", num_cpus=workers or os.cpu_count(), include_dashboard=False,
             log_to_driver=False, logging_level=logging.WARNING)
