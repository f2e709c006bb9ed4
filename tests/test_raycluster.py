"""`edgetrain fleet --address`: an address nothing answers at is refused at once with a clear
error (exit 2), not after Ray's minutes of retries; without --address no cluster is joined."""
from __future__ import annotations

import socket

import pytest

from device_sim.fleetspec import SpecError
from device_sim.raycluster import check_reachable


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_listening_address_passes_and_other_forms_are_left_to_ray():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        check_reachable(f"127.0.0.1:{server.getsockname()[1]}")
    check_reachable("auto")
    check_reachable("ray://head:10001")


@pytest.mark.parametrize("address, why", [
    (f"127.0.0.1:{_free_port()}", "nothing answered there"),
    ("127.0.0.1:425990", "port 425990 is not a TCP port"),
    ("127.0.0.1:0", "port 0 is not a TCP port"),
])
def test_an_address_nothing_answers_at_is_refused_with_the_fix(address, why):
    with pytest.raises(SpecError) as e:
        check_reachable(address, timeout_s=2)
    msg = str(e.value)
    assert repr(address) in msg and why in msg
    assert "ray start --head" in msg and "leave --address out" in msg
