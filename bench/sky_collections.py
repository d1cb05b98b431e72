"""What the distributed collections cost, next to raw etcd on the same machine.

Starts a 3-member etcd and the collections service (a process of its own, on 127.0.0.1),
then prints, for 1 and 16 concurrent workers: p50/p99 latency and throughput of
- raw etcd puts and gets on the leader, the ceiling: through ``aetcd.Client`` (the Python
  client the service uses, as a program talking to etcd directly would call it), and, for
  reference, through aetcd's gRPC stubs called directly, as the service's store calls them
  (2% faster than ``Client``; with ``--tls`` the only ceiling: ``Client`` cannot speak TLS);
- strong and eventual dict writes and reads, and counter adds, through the service (the
  o41.sky client over its WebSocket, one connection per worker thread), each consistency
  on collections of its own; and, for reference, strong writes to the dict the service
  follows for the eventual ones (each such write also feeds the replica's watch);
and checks the targets (issue 18): strong p50 <= 1.2x raw; eventual p50 <= 1/3 of strong;
16 workers adding to one counter at least at the raw sequential put rate; a lock's
acquire+release <= 1.5x a raw put, 16 workers on one lock >= 0.6x the raw sequential put
rate with p99 < 100 ms; a queue poll <= 1.3x a raw put, 16 pollers >= the raw put rate.

Every measurement is made in ``--rounds`` slices, one round after the other, and pooled:
on a shared machine a slow minute then weighs on raw etcd and the service alike. The ratio
of each round is printed too. For reference it also times raw calls paced 0.3 ms apart: a
service's etcd calls are never back to back (a round trip from its client apart), and an
idle etcd and gRPC take longer to answer; and the floor of any aiohttp service: a bare
WebSocket handler that makes the raw call and answers a fixed text, called over a plain
socket (the issue's "one raw etcd call plus the hop to the service", measured).

``--tls``: etcd speaks TLS and asks for client certificates (``--client-cert-auth``), as a
production etcd does; the service and the raw calls show it one, and the ceiling is the
stubs.

    .venv/bin/python bench/sky_collections.py [--ops 3000] [--workers 16] [--rounds 5] [--tls]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "src")]

import aetcd  # noqa: E402
import grpc.aio  # type: ignore[import-untyped]  # noqa: E402
from aetcd import rpc  # noqa: E402

from o41.client.collections import Client, HttpTransport  # noqa: E402
from o41.state import EtcdTls  # noqa: E402
from o41.state.etcd import connection_settings  # noqa: E402
from testbed.etcd import EtcdCluster  # noqa: E402
from testbed.kube import bin_dir  # noqa: E402
from testbed.process import LOOPBACK, free_port, plain_websocket  # noqa: E402
from testbed.product import SAFE_ENV, CollectionsProcess  # noqa: E402

VALUE = b"v" * 64
PACE = 0.0003  # seconds
FLOOR_PUT, FLOOR_GET = "bare handler + raw put", "bare handler + raw get"


@dataclass
class Result:
    name: str
    workers: int
    latencies: list[float]  # seconds
    elapsed: float

    def pct(self, p: float) -> float:
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))] * 1000

    @classmethod
    def merged(cls, parts: Sequence[Result]) -> Result:
        """One measurement made of several, as if made at once."""
        latencies = [x for p in parts for x in p.latencies]
        return cls(parts[0].name, parts[0].workers, latencies, sum(p.elapsed for p in parts))

    @property
    def p50(self) -> float:
        return self.pct(50)

    @property
    def rate(self) -> float:
        return len(self.latencies) / self.elapsed

    def line(self) -> str:
        return (
            f"{self.name:<28} {self.workers:>7} {self.p50:>9.3f} {self.pct(99):>9.3f} "
            f"{self.rate:>10.0f}"
        )


Measure = Callable[[int], Result]  # ops -> one measurement of that many operations


# raw etcd: aetcd on the leader


class RawEtcd:
    """aetcd on its own event loop, kept between measurements (warm channels): its
    ``Client`` (plain HTTP/2 only) and its gRPC stubs called directly."""

    def __init__(self, endpoint: str, tls: EtcdTls | None) -> None:
        (self.target,), self.credentials = connection_settings([endpoint], tls)
        self.loop = asyncio.new_event_loop()
        self.etcd: aetcd.Client | None = None
        self.loop.run_until_complete(self._warm())

    async def _warm(self) -> None:
        if self.credentials is None:
            self.channel = grpc.aio.insecure_channel(self.target)
            host, port = self.target.rsplit(":", 1)
            self.etcd = aetcd.Client(host=host, port=int(port), timeout=5)
            await self.etcd.connect()
        else:
            self.channel = grpc.aio.secure_channel(self.target, self.credentials)
        self.kv = rpc.KVStub(self.channel)
        for i in range(50):
            await self.kv.Put(rpc.PutRequest(key=b"/bench/raw/warm/%d" % i, value=VALUE))

    def measure(self, name: str, n: int, op: str, pace: float = 0, stubs: bool = False) -> Measure:
        etcd, kv = self.etcd, self.kv

        async def put(w: int, i: int) -> object:
            key = b"/bench/raw/%d/%d" % (w, i)
            if etcd is None or stubs:
                return await kv.Put(rpc.PutRequest(key=key, value=VALUE), timeout=5)
            return await etcd.put(key, VALUE)

        async def get(w: int, i: int) -> object:
            key = b"/bench/raw/%d/%d" % (w, i)
            if etcd is None or stubs:
                return await kv.Range(rpc.RangeRequest(key=key), timeout=5)
            return await etcd.get(key)

        call = put if op == "put" else get

        async def run(ops: int) -> Result:
            latencies: list[float] = []

            async def worker(w: int) -> None:
                for i in range(ops // n):
                    if pace:
                        time.sleep(pace)  # noqa: ASYNC251 - idle time between calls, on purpose
                    started = time.perf_counter()
                    await call(w, i)
                    latencies.append(time.perf_counter() - started)

            started = time.perf_counter()
            await asyncio.gather(*(worker(w) for w in range(n)))
            return Result(name, n, latencies, time.perf_counter() - started)

        return lambda ops: self.loop.run_until_complete(run(ops))

    def close(self) -> None:
        if self.etcd is not None:
            self.loop.run_until_complete(self.etcd.close())
        self.loop.run_until_complete(self.channel.close())
        self.loop.close()


# the floor of any aiohttp service: a bare WebSocket handler making one etcd call a message

BARE_ANSWER = '{"id":null,"status":200,"result":{}}'
BARE = f"""
import asyncio, sys
import grpc.aio
from aiohttp import web
from aetcd import rpc
port, target = int(sys.argv[1]), sys.argv[2]
VALUE = b"v" * 64
BARE_ANSWER = {BARE_ANSWER!r}
async def main():
    kv = rpc.KVStub(grpc.aio.insecure_channel(target))
    n = 0
    async def ws(request):
        nonlocal n
        w = web.WebSocketResponse(compress=False)
        await w.prepare(request)
        async for message in w:
            n += 1
            key = b"/bench/floor/%d" % (n % 500)
            if message.data == "put":
                await kv.Put(rpc.PutRequest(key=key, value=VALUE), timeout=5)
            else:
                await kv.Range(rpc.RangeRequest(key=key), timeout=5)
            await w.send_str(BARE_ANSWER)
        return w
    app = web.Application()
    app.router.add_get("/", ws)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, {LOOPBACK!r}, port).start()
    for i in range(500):
        await kv.Put(rpc.PutRequest(key=b"/bench/floor/%d" % i, value=VALUE))
    print("ready", flush=True)
    await asyncio.Event().wait()
asyncio.run(main())
"""


class BareHandler:
    """The physical limit of a strong operation through any aiohttp service, measured:
    a bare aiohttp WebSocket handler (no engine, checks or JSON) that makes the raw call
    (aetcd's stubs, on the leader, as the service's store calls them) and answers a fixed
    text, called from one thread over a plain socket (prebuilt frames, no client library).
    Its own process and environment, as the service's; stopped by its pid."""

    def __init__(self, target: str) -> None:
        self.port = free_port()
        self.process = subprocess.Popen(
            [sys.executable, "-c", BARE, str(self.port), target],
            stdout=subprocess.PIPE,
            env={**os.environ, **SAFE_ENV},  # as the service's own (no proxy, its malloc)
        )
        try:
            self.sock = self._connect()
        except BaseException:
            self.close()
            raise

    def _connect(self) -> socket.socket:
        """Once the handler says it is ready: a WebSocket to it (a plain socket)."""
        assert self.process.stdout is not None
        if self.process.stdout.readline().strip() != b"ready":
            raise RuntimeError("the bare handler did not start")
        return plain_websocket(self.port)

    def measure(self, name: str, op: str) -> Measure:
        frame = struct.pack("!BB", 0x81, 0x80 | len(op)) + b"\0\0\0\0" + op.encode()
        answer = 2 + len(BARE_ANSWER)  # its frame: two bytes of header, the text
        sock = self.sock

        def run(ops: int) -> Result:
            latencies: list[float] = []
            began = time.perf_counter()
            for _ in range(ops):
                started = time.perf_counter()
                sock.sendall(frame)
                got = 0
                while got < answer:  # one read on loopback, almost always
                    data = sock.recv(answer - got)
                    if not data:
                        raise ConnectionResetError("the bare handler closed the connection")
                    got += len(data)
                latencies.append(time.perf_counter() - started)
            return Result(name, 1, latencies, time.perf_counter() - began)

        return run

    def close(self) -> None:
        with contextlib.suppress(OSError, AttributeError):
            self.sock.close()
        self.process.terminate()
        self.process.wait(timeout=30)


# the service, from threads as pods would call it


class Service:
    """The o41.sky client (its WebSocket, one connection per worker thread)."""

    def __init__(self, url: str, compute: str = "bench") -> None:
        self.url = url
        self.compute = compute

    def measure(self, name: str, n: int, op: Callable[[Client, int, int], object]) -> Measure:
        clients = [Client(HttpTransport(self.url, token="bench"), self.compute) for _ in range(n)]

        def run(ops: int) -> Result:
            latencies: list[float] = []
            lock = threading.Lock()
            # the clock starts when every worker is ready (connected, the replica's copy
            # loaded, a queue filled): what comes before is not the operation measured
            barrier = threading.Barrier(n, action=lambda: starts.append(time.perf_counter()))
            starts: list[float] = []

            def worker(w: int) -> None:
                c = clients[w]
                op(c, w, -1)  # connect, load the replica's copy
                mine = []
                barrier.wait()
                for i in range(ops // n):
                    started = time.perf_counter()
                    op(c, w, i)
                    mine.append(time.perf_counter() - started)
                with lock:
                    latencies.extend(mine)

            with ThreadPoolExecutor(n) as pool:
                list(pool.map(worker, range(n)))
            return Result(name, n, latencies, time.perf_counter() - starts[0])

        return run


# Strong and eventual operations use collections of their own: the eventual ones make the
# service follow their dict (a replica and its etcd watch), and a strong write to a
# followed dict also costs the watch event. That case is measured apart ("followed").


def dict_set(consistency: str, name: str = "") -> Callable[[Client, int, int], object]:
    name = name or f"bench-{consistency}"

    def op(c: Client, w: int, i: int) -> None:
        c.dict(name, consistency)[f"{w}-{i % 500}"] = VALUE  # type: ignore[arg-type]

    return op


def dict_get(consistency: str) -> Callable[[Client, int, int], object]:
    name = f"bench-{consistency}"

    def op(c: Client, w: int, i: int) -> object:
        return c.dict(name, consistency).get(f"{w}-{i % 500}")  # type: ignore[arg-type]

    return op


def counter_add(consistency: str) -> Callable[[Client, int, int], object]:
    name = f"hot-{consistency}"

    def op(c: Client, w: int, i: int) -> object:
        return c.counter(name, consistency).add(1)  # type: ignore[arg-type]

    return op


def lock_cycle(name: str) -> Callable[[Client, int, int], object]:
    """One acquire and one release of a lock (``with lock: pass``)."""

    def op(c: Client, w: int, i: int) -> None:
        with c.lock(name, ttl=30, timeout=60):
            pass

    return op


def queue_offer(name: str) -> Callable[[Client, int, int], object]:
    """A strong offer to a queue."""

    def op(c: Client, w: int, i: int) -> object:
        c.queue(name).offer(b"x")
        return None

    return op


def queue_poll(name: str, fill: int) -> Callable[[Client, int, int], object]:
    """A strong poll of a queue kept full: the first call of each worker (``i == -1``)
    offers what that worker will poll, so the timed calls are polls alone."""

    def op(c: Client, w: int, i: int) -> object:
        q = c.queue(name)
        if i == -1:
            for _ in range(fill):
                q.offer(b"x")
            return None
        return q.poll()

    return op


def measurements(
    raw: RawEtcd, bare: BareHandler | None, service: Service, workers: int, per_round: int
) -> list[Measure]:
    """Every measurement, in the order of one round."""
    found: list[Measure] = []
    for n in (1, workers):
        found += [raw.measure("raw etcd put", n, "put"), raw.measure("raw etcd get", n, "get")]
        if n == 1 and bare is not None:
            found += [bare.measure(FLOOR_PUT, "put"), bare.measure(FLOOR_GET, "get")]
        for consistency in ("strong", "eventual"):
            found += [
                service.measure(f"dict set {consistency}", n, dict_set(consistency)),
                service.measure(f"dict get {consistency}", n, dict_get(consistency)),
            ]
        for consistency in ("strong", "eventual"):
            found.append(
                service.measure(f"counter add {consistency} (one)", n, counter_add(consistency))
            )
        found += [
            service.measure("lock acquire+release (one)", n, lock_cycle(f"bench-lock-{n}")),
            service.measure(
                "queue poll strong (one)", n, queue_poll(f"bench-queue-{n}", per_round // n + 5)
            ),
        ]
    found.append(  # after the eventual ones of the round: their dict is followed
        service.measure("dict set strong, followed", 1, dict_set("strong", "bench-eventual"))
    )
    # not back to back: 0.3 ms idle between calls, as a service's calls are (a round trip
    # from its client apart); etcd and gRPC then wake from idle on every call
    found += [
        raw.measure("raw etcd put, paced", 1, "put", PACE),
        raw.measure("raw etcd get, paced", 1, "get", PACE),
    ]
    if raw.etcd is not None:  # the stubs too, for reference (with --tls they are the ceiling)
        found += [
            raw.measure("raw etcd put, stubs", 1, "put", stubs=True),
            raw.measure("raw etcd get, stubs", 1, "get", stubs=True),
        ]
    return found


def cpu_times() -> list[int]:
    """The machine's CPU time so far, by kind (``/proc/stat``'s first line, in ticks)."""
    return [int(t) for t in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]


def steal_share(before: list[int], after: list[int]) -> str:
    """What the hypervisor gave other machines of these CPUs' time meanwhile (``steal``):
    on a VM with busy neighbours every figure moves with it, raw etcd's included."""
    spent = [b - a for a, b in zip(before, after, strict=True)]
    total = sum(spent[:8])  # user .. steal; guest time is counted in user already
    share = spent[7] / total if total else 0.0
    return f"steal {share:.1%} of CPU time, load average {os.getloadavg()[0]:.2f} at the end"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--ops", type=int, default=3000, help="operations per measurement")
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=5, help="measurements interleave")
    parser.add_argument("--tls", action="store_true", help="etcd over TLS, client certificates")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="o41-bench-") as tmp:
        cluster = EtcdCluster(bin_dir() / "etcd", Path(tmp) / "etcd", size=3, tls=args.tls)
        cluster.start()
        tls = cluster.client_tls if args.tls else None
        service = CollectionsProcess(
            cluster.endpoints, Path(tmp) / "service.log", env=tls.environment() if tls else {}
        )
        raw: RawEtcd | None = None
        bare: BareHandler | None = None
        try:
            service.start()
            leader = cluster.endpoints[cluster.leader()]
            how = "over TLS with client certificates" if tls else "over plain HTTP/2"
            print(f"etcd: 3 members on {LOOPBACK} {how}, leader {leader}; {os.cpu_count()} CPUs")
            raw = RawEtcd(leader, tls)
            if tls is None:  # the bare handler speaks plain HTTP/2 to etcd
                bare = BareHandler(raw.target)
            each = measurements(
                raw, bare, Service(service.url), args.workers, args.ops // args.rounds
            )
            before = cpu_times()
            rounds = [[m(args.ops // args.rounds) for m in each] for _ in range(args.rounds)]
            stolen = steal_share(before, cpu_times())
        finally:
            if bare is not None:
                bare.close()
            if raw is not None:
                raw.close()
            service.stop()
            cluster.stop()

    results = [Result.merged(column) for column in zip(*rounds, strict=True)]
    print(
        f"{args.rounds} rounds of every measurement, one after the other, pooled "
        "(so both sides of each ratio see the same moments of a shared machine); "
        f"{stolen}"
    )
    print(f"{'':<28} {'workers':>7} {'p50 ms':>9} {'p99 ms':>9} {'ops/s':>10}")
    for r in results:
        print(r.line())
    by = {(r.name, r.workers): r for r in results}
    by_round = [{(r.name, r.workers): r for r in column} for column in rounds]

    def ratio(a: str, b: str, n: int = 1) -> float:
        return by[(a, n)].p50 / by[(b, n)].p50

    def spread(a: str, b: str) -> str:
        each = sorted(r[(a, 1)].p50 / r[(b, 1)].p50 for r in by_round)
        return f"{each[0]:.2f}-{each[-1]:.2f}"

    print()
    print(
        f"round by round: strong set / raw put {spread('dict set strong', 'raw etcd put')}, "
        f"strong get / raw get {spread('dict get strong', 'raw etcd get')}, "
        f"lock / raw put {spread('lock acquire+release (one)', 'raw etcd put')}, "
        f"poll / raw put {spread('queue poll strong (one)', 'raw etcd put')}"
        + (
            f", bare handler + put / raw put {spread(FLOOR_PUT, 'raw etcd put')}, "
            f"bare handler + get / raw get {spread(FLOOR_GET, 'raw etcd get')}"
            if (FLOOR_PUT, 1) in by
            else ""
        )
    )
    lock, poll = "lock acquire+release (one)", "queue poll strong (one)"
    for k, one in enumerate(by_round, 1):
        raw_put = one[("raw etcd put", 1)]
        print(
            f"round {k}: raw put {raw_put.p50:.3f} ms, get {one[('raw etcd get', 1)].p50:.3f} ms; "
            + ", ".join(
                f"{what} {one[(what, 1)].p50 / one[(base, 1)].p50:.2f}x"
                for what, base in (
                    ("dict set strong", "raw etcd put"),
                    ("dict get strong", "raw etcd get"),
                    ("lock acquire+release (one)", "raw etcd put"),
                    ("queue poll strong (one)", "raw etcd put"),
                )
            )
            + f"; {args.workers} on one lock {one[(lock, args.workers)].rate / raw_put.rate:.2f}x"
            + f", {args.workers} pollers {one[(poll, args.workers)].rate / raw_put.rate:.2f}x"
        )
    checks = [
        ("strong set p50 / raw put p50", ratio("dict set strong", "raw etcd put"), "<= 1.2"),
        ("strong get p50 / raw get p50", ratio("dict get strong", "raw etcd get"), "<= 1.2"),
        (
            "eventual set p50 / strong set p50",
            ratio("dict set eventual", "dict set strong"),
            "<= 0.333",
        ),
        (
            "eventual get p50 / strong get p50",
            ratio("dict get eventual", "dict get strong"),
            "<= 0.333",
        ),
        (
            f"{args.workers} workers on one counter / raw sequential puts (rate)",
            by[("counter add strong (one)", args.workers)].rate / by[("raw etcd put", 1)].rate,
            ">= 1.0",
        ),
        (
            "lock acquire+release p50 / raw put p50",
            ratio("lock acquire+release (one)", "raw etcd put"),
            "<= 1.5",
        ),
        (
            f"{args.workers} workers on one lock / raw sequential puts (rate)",
            by[("lock acquire+release (one)", args.workers)].rate / by[("raw etcd put", 1)].rate,
            ">= 0.6",
        ),
        (
            f"{args.workers} workers on one lock: p99 ms",
            by[("lock acquire+release (one)", args.workers)].pct(99),
            "<= 100",
        ),
        (
            "queue poll p50 / raw put p50",
            ratio("queue poll strong (one)", "raw etcd put"),
            "<= 1.3",
        ),
        (
            f"{args.workers} pollers of one queue / raw sequential puts (rate)",
            by[("queue poll strong (one)", args.workers)].rate / by[("raw etcd put", 1)].rate,
            ">= 1.0",
        ),
    ]
    print(
        "(for reference, against raw calls paced like a service's: strong set "
        f"{ratio('dict set strong', 'raw etcd put, paced'):.2f}x, strong get "
        f"{ratio('dict get strong', 'raw etcd get, paced'):.2f}x)"
    )
    print(
        "(a strong set to a dict this service also follows for eventual readers: "
        f"{ratio('dict set strong, followed', 'raw etcd put'):.2f}x a raw put)"
    )
    if ("raw etcd get, stubs", 1) in by:
        print(
            "(against aetcd's stubs called directly, the stricter ceiling: strong set "
            f"{ratio('dict set strong', 'raw etcd put, stubs'):.2f}x, strong get "
            f"{ratio('dict get strong', 'raw etcd get, stubs'):.2f}x)"
        )
    else:
        print("(the ceiling is aetcd's stubs called directly: aetcd.Client cannot speak TLS)")
    if (FLOOR_PUT, 1) in by:
        print(
            "(the floor of any aiohttp service, a bare handler making the raw call: put "
            f"{ratio(FLOOR_PUT, 'raw etcd put'):.2f}x a raw put, get "
            f"{ratio(FLOOR_GET, 'raw etcd get'):.2f}x a raw get; the service's strong set "
            f"{ratio('dict set strong', FLOOR_PUT):.2f}x that floor, strong get "
            f"{ratio('dict get strong', FLOOR_GET):.2f}x, lock acquire+release "
            f"{ratio('lock acquire+release (one)', FLOOR_PUT):.2f}x, poll "
            f"{ratio('queue poll strong (one)', FLOOR_PUT):.2f}x)"
        )
    ok = True
    for what, value, target in checks:
        bound = float(target.split()[1])
        met = value <= bound if target.startswith("<=") else value >= bound
        ok &= met
        print(f"{what:<62} {value:6.2f}  target {target:<8} {'met' if met else 'MISSED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
