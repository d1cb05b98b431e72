"""The hop to the collections service alone, layer by layer, next to its floor (issue 18).

No etcd: the service runs on the embedded store (``python -m o41.webhook.collections``
without ``--etcd``), so what is measured is the service's and the client's own cost and
the wake-ups of two processes, which a strong operation adds to its etcd call. Each row is
p50 and p10 over ``--ops`` messages from one client thread on a blocking socket, and the
CPU each side spent per message (the server from ``/proc``, the client's own):

- the floor: a bare asyncio ``Protocol`` echo, and a bare aiohttp WebSocket handler that
  answers a fixed text (the least any aiohttp service can cost);
- the collections service through the client's raw connection (a prebuilt message), then
  ``HttpTransport.call``, then the whole ``sky`` client (``dict.get``, eventual);
- ``--locks``: also lock cycles (``with lock: pass``) for 1 and 16 worker threads on one
  lock: p50, p99, hand-overs a second, and CPU per cycle on each side. Run it in two
  checkouts to compare two versions of the protocol.

    .venv/bin/python bench/sky_hop.py [--ops 5000] [--locks]
"""

from __future__ import annotations

import argparse
import os
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "src")]

from o41.client.collections import Client, HttpTransport  # noqa: E402
from testbed.process import LOOPBACK, free_port, plain_websocket  # noqa: E402

ANSWER = '{"id":null,"status":200,"result":{"found":true,"value":"TXZ2dg=="}}'
FLOOR = f"""
import asyncio, sys
from aiohttp import web
kind, port = sys.argv[1], int(sys.argv[2])
if kind == "aiohttp":
    async def ws(request):
        w = web.WebSocketResponse(compress=False)
        await w.prepare(request)
        async for _ in w:
            await w.send_str({ANSWER!r})
        return w
    app = web.Application()
    app.router.add_get("/", ws)
    web.run_app(app, host={LOOPBACK!r}, port=port, print=lambda *a: print("ready", flush=True),
                access_log=None)
else:
    class Echo(asyncio.Protocol):
        def connection_made(self, transport):
            self.transport = transport
        def data_received(self, data):
            self.transport.write(data)
    async def main():
        await asyncio.get_running_loop().create_server(Echo, {LOOPBACK!r}, port)
        print("ready", flush=True)
        await asyncio.Event().wait()
    asyncio.run(main())
"""


def cpu_seconds(pid: int) -> float:
    """User and system CPU of process ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextmanager
def server(argv: list[str]) -> Iterator[tuple[int, int]]:
    """A server process on a free port of loopback that prints a line once it listens:
    its port and pid; stopped by its pid."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    process = subprocess.Popen([*argv, str(port)], stdout=subprocess.PIPE, env=env)
    try:
        assert process.stdout is not None
        process.stdout.readline()
        yield port, process.pid
    finally:
        process.terminate()
        process.wait(timeout=30)


def exchange(
    send: Callable[[bytes], object], receive: Callable[[], bytes], message: bytes
) -> bytes:
    """One message out and its answer back."""
    send(message)
    return receive()


def measure(name: str, pid: int, ops: int, call: Callable[[], object]) -> None:
    for _ in range(min(500, ops)):
        call()  # warm
    latencies = []
    server_before, client_before = cpu_seconds(pid), time.process_time()
    for _ in range(ops):
        started = time.perf_counter()
        call()
        latencies.append(time.perf_counter() - started)
    server_us = (cpu_seconds(pid) - server_before) / ops * 1e6
    client_us = (time.process_time() - client_before) / ops * 1e6
    latencies.sort()
    print(
        f"{name:<48} p50 {latencies[ops // 2] * 1e3:6.3f} ms  p10 {latencies[ops // 10] * 1e3:6.3f}"
        f" ms  server {server_us:5.0f} us  client {client_us:5.0f} us per message",
        flush=True,
    )


def floor(kind: str, ops: int) -> None:
    with server([sys.executable, "-c", FLOOR, kind]) as (port, pid):
        payload = b"x" * 100
        frame = payload
        if kind == "aiohttp":
            sock = plain_websocket(port)
            frame = struct.pack("!BB", 0x81, 0x80 | len(payload)) + b"\0\0\0\0" + payload
        else:
            sock = socket.create_connection((LOOPBACK, port))
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            measure(
                f"floor: bare {kind}",
                pid,
                ops,
                lambda: exchange(sock.sendall, lambda: sock.recv(4096), frame),
            )
        finally:
            sock.close()


def service_layers(ops: int) -> None:
    argv = [sys.executable, "-m", "o41.webhook.collections", "--port"]
    with server(argv) as (port, pid):
        transport = HttpTransport(f"http://{LOOPBACK}:{port}", token="bench")
        client = Client(transport, "bench")
        d = client.dict("hop", consistency="eventual")
        d["k"] = b"v" * 64
        args = {"key": "sk", "consistency": "eventual"}
        conn = transport._connection()  # the client's own connection, as the client uses it
        message = (
            b'{"compute":"bench","kind":"dict","name":"hop","op":"get",'
            b'"args":{"key":"sk","consistency":"eventual"}}'
        )
        measure(
            "service: the client's raw connection",
            pid,
            ops,
            lambda: exchange(conn.send, conn.receive, message),
        )
        measure(
            "service: HttpTransport.call",
            pid,
            ops,
            lambda: transport.call("bench", "dict", "hop", "get", dict(args)),
        )
        measure("service: sky dict.get (eventual)", pid, ops, lambda: d.get("k"))
        transport.close()


def lock_cycles(workers: int, ops: int) -> None:
    """``with lock: pass`` from ``workers`` threads, each its own client, on one lock."""
    argv = [sys.executable, "-m", "o41.webhook.collections", "--port"]
    with server(argv) as (port, pid):
        url = f"http://{LOOPBACK}:{port}"
        clients = [Client(HttpTransport(url, token="bench"), "bench") for _ in range(workers)]
        latencies: list[float] = []
        guard, start = threading.Lock(), threading.Barrier(workers)

        def worker(i: int) -> None:
            lock = clients[i].lock("hop", timeout=60)
            with lock:
                pass
            start.wait()
            mine = []
            for _ in range(ops // workers):
                started = time.perf_counter()
                with lock:
                    pass
                mine.append(time.perf_counter() - started)
            with guard:
                latencies.extend(mine)

        server_before, client_before = cpu_seconds(pid), time.process_time()
        began = time.perf_counter()
        with ThreadPoolExecutor(workers) as pool:
            list(pool.map(worker, range(workers)))
        elapsed = time.perf_counter() - began
        n = len(latencies)
        server_us = (cpu_seconds(pid) - server_before) / n * 1e6
        client_us = (time.process_time() - client_before) / n * 1e6
        latencies.sort()
        print(
            f"locks: {workers:2} workers on one lock  p50 {latencies[n // 2] * 1e3:7.3f} ms  "
            f"p99 {latencies[int(n * 0.99)] * 1e3:7.2f} ms  {n / elapsed:6.0f} cycles/s  "
            f"server {server_us:4.0f} us  clients {client_us:4.0f} us per cycle",
            flush=True,
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--ops", type=int, default=5000, help="messages per row")
    parser.add_argument("--locks", action="store_true", help="also lock cycles, 1 and 16")
    args = parser.parse_args()
    print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}")
    floor("protocol", args.ops)
    floor("aiohttp", args.ops)
    service_layers(args.ops)
    if args.locks:
        lock_cycles(1, min(args.ops, 3000))
        lock_cycles(16, min(args.ops, 3200))
    return 0


if __name__ == "__main__":
    sys.exit(main())
