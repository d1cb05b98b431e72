"""The test bed's delaying relay (testbed/relay.py): bytes pass both ways unchanged, in
order, a half close is passed on, each way waits at least its delay, and it forwards to
loopback only."""

from __future__ import annotations

import socket
import socketserver
import threading
import time
from collections.abc import Iterator

import pytest

from testbed.process import LOOPBACK, free_port
from testbed.relay import Relay


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        while data := self.request.recv(65536):
            self.request.sendall(data)


@pytest.fixture
def echo() -> Iterator[int]:
    port = free_port()
    server = socketserver.ThreadingTCPServer((LOOPBACK, port), _Echo)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield port
    finally:
        server.shutdown()
        server.server_close()


def _exchange(port: int, payload: bytes) -> bytes:
    with socket.create_connection((LOOPBACK, port), timeout=10) as s:
        s.sendall(payload)
        s.shutdown(socket.SHUT_WR)  # the half close reaches the echo server: it ends
        received = b""
        while data := s.recv(65536):
            received += data
    return received


def test_bytes_pass_unchanged_in_order_both_ways(echo: int) -> None:
    payload = bytes(range(256)) * 4096  # 1 MiB: many chunks
    with Relay(f"http://{LOOPBACK}:{echo}", delay=0.005) as relay:
        assert _exchange(relay.port, payload) == payload
        assert _exchange(relay.port, b"again") == b"again"
        assert relay.connections == 2


def test_a_round_trip_waits_at_least_both_delays(echo: int) -> None:
    with Relay(f"{LOOPBACK}:{echo}", up=0.05, down=0.1) as relay:
        start = time.monotonic()
        assert _exchange(relay.port, b"ping") == b"ping"
        assert time.monotonic() - start >= 0.15  # a floor: the delays are added, never less


def test_it_forwards_to_loopback_only() -> None:
    with pytest.raises(ValueError, match="loopback only"):
        Relay("http://10.0.0.1:80")
    with pytest.raises(ValueError, match="host and a port"):
        Relay("http://127.0.0.1")


def test_an_upstream_that_is_down_closes_the_connection() -> None:
    with (
        Relay(f"{LOOPBACK}:{free_port()}") as relay,
        socket.create_connection(relay.address, timeout=10) as s,
    ):
        assert s.recv(1) == b""  # closed, not left hanging
