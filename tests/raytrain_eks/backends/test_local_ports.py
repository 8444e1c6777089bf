"""The local services' ports (raytrain_eks/backends/local_services.py) are picked where the OS never
assigns one by itself.

Linux gives every ``bind(0)`` and every outgoing connection a port of
``net.ipv4.ip_local_port_range`` (kernel Documentation/networking/ip-sysctl.rst). The local Ray
heads' workers bind such OS-assigned ports (``ray start --min-worker-port=0``), so a port that
``free_port`` picks and ``ray start`` binds seconds later must lie outside that range, or a
worker of another run on the machine could take it in between.
"""
from __future__ import annotations

import socket
from pathlib import Path

from raytrain_eks.backends.local_services import LOOPBACK, PICKED_PORTS, free_port

EPHEMERAL = Path("/proc/sys/net/ipv4/ip_local_port_range")


def test_picked_ports_lie_outside_this_machines_ephemeral_range():
    low, high = map(int, EPHEMERAL.read_text().split())
    assert PICKED_PORTS.stop - 1 < low or PICKED_PORTS.start > high, (PICKED_PORTS, (low, high))


def test_a_picked_port_is_in_the_range_and_free():
    port = free_port()
    assert port in PICKED_PORTS
    with socket.socket() as sock:
        sock.bind((LOOPBACK, port))  # raises if it were taken


def test_a_port_bound_by_the_os_is_never_a_picked_one():
    with socket.socket() as sock:
        sock.bind((LOOPBACK, 0))
        assert sock.getsockname()[1] not in PICKED_PORTS
