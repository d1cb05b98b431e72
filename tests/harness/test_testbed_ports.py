"""The test bed's ports: outside the kernel's ephemeral range, which outgoing connections
take their local ports from (a server once failed to bind a port the kernel had picked)."""

from __future__ import annotations

import socket
from pathlib import Path

from testbed.process import LOOPBACK, free_port


def test_free_ports_are_bindable_distinct_and_never_ephemeral() -> None:
    low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    ports = [free_port() for _ in range(300)]
    assert len(set(ports)) == len(ports)
    assert not [p for p in ports if low <= p <= high]
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOOPBACK, ports[-1]))  # nothing took it meanwhile
        s.listen()
