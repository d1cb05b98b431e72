"""How the client moves a large version's bytes: parts and ranges in parallel over kept-alive
connections, whole or not at all.

Everything is real: the operator sets up a Location whose endpoint is a byte-counting TCP
relay in front of a versitygw gateway, the placement service signs the requests, and the
client (``o41.client.artifacts``) writes and reads through it. The relay passes bytes
unchanged (signatures hold); it counts connections and the requests' first lines.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from o41.client import reads, transfers
from o41.client.artifacts import Artifacts
from o41.core.parts import PART_SIZE
from o41.core.places import Place
from testbed.kube import Kube
from testbed.process import LOOPBACK, free_port
from testbed.product import PlacementProcess
from testbed.stores import VersityStore

pytestmark = [pytest.mark.kube, pytest.mark.stores]

MiB = 2**20


@dataclass
class Relay:
    """A TCP relay on loopback: counts connections, records each one's first request line,
    and counts ``Range`` headers (download requests have no body, so every byte a client
    sends on them is a header). With ``hide_ranges``, "Range:" becomes "Xange:" (same
    length), so the store answers the whole object, as a store without ranges would."""

    upstream_port: int
    port: int = field(default_factory=free_port)
    hide_ranges: bool = False
    one_answer: bool = False  # close each connection after its first answer, as an idle
    # kept-alive connection is closed by a server
    first_lines: list[str] = field(default_factory=list)
    ranges: int = 0

    def __post_init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    def connections_with(self, text: str) -> int:
        return sum(text in line for line in self.first_lines)

    def start(self) -> Relay:
        self._thread.start()
        assert self._started.wait(10)
        return self

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    async def _shutdown(self) -> None:
        self._server.close()
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self._server.wait_closed()

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(
            asyncio.start_server(self._serve, LOOPBACK, self.port)
        )
        self._started.set()
        self._loop.run_forever()

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        store_r, store_w = await asyncio.open_connection(LOOPBACK, self.upstream_port)
        first = True

        async def up() -> None:
            nonlocal first
            while block := await client_r.read(1 << 20):
                if first:
                    self.first_lines.append(block.split(b"\r\n", 1)[0].decode("latin-1"))
                    first = False
                self.ranges += block.count(b"\r\nRange: bytes=")
                if self.hide_ranges:
                    block = block.replace(b"\r\nRange: bytes=", b"\r\nXange: bytes=")
                store_w.write(block)
                await store_w.drain()
            store_w.write_eof()

        async def down() -> None:
            while block := await store_r.read(1 << 20):
                client_w.write(block)
                await client_w.drain()
                if self.one_answer:  # a part's answer is one small block
                    break
            client_w.close()
            store_w.close()

        try:
            await asyncio.gather(up(), down())
        except (ConnectionError, OSError):
            pass
        finally:
            store_w.close()
            client_w.close()


@dataclass
class Setup:
    client: Artifacts
    relay: Relay
    org: str
    tmp: Path


@pytest.fixture(scope="module")
def setup(
    kube: Kube,
    operator: object,
    placement: PlacementProcess,
    credentials: dict[str, str],
    s3: VersityStore,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Setup]:
    """An organization whose one location is the relay in front of the us-east-1 gateway."""
    tmp = tmp_path_factory.mktemp("transfers")
    tag = uuid.uuid4().hex[:6]
    org, namespace, loc = f"org-{tag}", f"team-{tag}", f"aws-relay-{tag}"
    gateway_port = int(s3.gateway("us-east-1").rsplit(":", 1)[1])
    relay = Relay(gateway_port).start()
    api = "artifacts.o41.io/v1alpha1"
    objects = [
        {
            "apiVersion": api,
            "kind": "Organization",
            "metadata": {"name": org},
            "spec": {"namespaces": [namespace]},
        },
        {
            "apiVersion": api,
            "kind": "Location",
            "metadata": {"name": loc},
            "spec": {
                "organization": org,
                "cloud": "aws",
                "region": "us-east-1",
                "backend": {"s3": {"endpoint": relay.url}},
                "credentials": {"secretName": credentials["s3"]},
            },
        },
    ]
    for obj in objects:
        kube.kubectl("apply", "-f", "-", input=json.dumps(obj))
    kube.kubectl("wait", "--for=condition=Ready", f"location/{loc}", "--timeout=60s")
    kube.kubectl("create", "namespace", namespace)
    token = kube.token(namespace)
    token_file = tmp / "token"
    token_file.write_text(token)
    client = Artifacts(placement.url, str(token_file), Place("aws", "us-east-1", "env"))
    try:
        yield Setup(client, relay, org, tmp)
    finally:
        relay.stop()


def _file(setup: Setup, size: int) -> tuple[Path, bytes]:
    data = os.urandom(size)
    path = setup.tmp / uuid.uuid4().hex
    path.write_bytes(data)
    return path, data


def test_parts_and_ranges_share_kept_alive_connections(
    setup: Setup, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Four parts on two threads go up on at most two connections (one per thread, kept
    alive), and come back as four ranges on at most two: not a connection per request."""
    monkeypatch.setattr(transfers, "PARALLEL_PARTS", 2)
    monkeypatch.setattr(reads, "PARALLEL_RANGES", 2)
    monkeypatch.setattr(reads, "RANGE_SIZE", PART_SIZE)
    path, data = _file(setup, 3 * PART_SIZE + MiB)  # four parts
    relay = setup.relay
    before_parts, before_gets = relay.connections_with("partNumber="), relay.connections_with("GET")
    written = setup.client.write(setup.org, "big", path)
    part_connections = relay.connections_with("partNumber=") - before_parts
    assert 1 <= part_connections <= 2

    ranges = relay.ranges
    out = setup.tmp / "back.bin"
    read = setup.client.read(setup.org, "big", written.version, out)
    assert read.size == len(data)
    assert out.read_bytes() == data
    assert relay.ranges - ranges == 4
    assert relay.connections_with("GET") - before_gets <= 2


def test_a_store_that_ignores_ranges_still_gives_the_whole_version(
    setup: Setup, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(reads, "RANGE_SIZE", PART_SIZE)
    path, data = _file(setup, PART_SIZE + MiB)
    written = setup.client.write(setup.org, "ranges", path)
    setup.relay.hide_ranges = True
    try:
        out = setup.tmp / "whole.bin"
        setup.client.read(setup.org, "ranges", written.version, out)
    finally:
        setup.relay.hide_ranges = False
    assert out.read_bytes() == data
    assert not (setup.tmp / "whole.bin.o41-partial").exists()


def test_a_connection_the_store_closed_is_opened_again(
    setup: Setup, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each part finds its kept-alive connection closed by the other side: the part is sent
    again on a new one, once, and the write succeeds (instead of failing the location)."""
    monkeypatch.setattr(transfers, "PARALLEL_PARTS", 1)
    path, data = _file(setup, 2 * PART_SIZE + MiB)  # three parts, one thread
    before = setup.relay.connections_with("partNumber=")
    setup.relay.one_answer = True
    try:
        written = setup.client.write(setup.org, "closed", path)
    finally:
        setup.relay.one_answer = False
    assert setup.relay.connections_with("partNumber=") - before == 3
    out = setup.tmp / "closed.bin"
    setup.client.read(setup.org, "closed", written.version, out)
    assert out.read_bytes() == data
