"""Answers lost after the service acted (issue 39, point 2): a proxy in front of two
replicas of the service (on one 3-member etcd) relays each request to either replica and
cuts a share of the connections the moment the service's answer comes back, so the
service acted and the caller never hears of it. Callers send every operation with an id
and send it again (to either replica) until an answer gets through. A counter ends exact;
every queue item offered is delivered exactly once."""

from __future__ import annotations

import base64
import contextlib
import http.client
import json
import random
import socket
import threading
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from o41.state.etcd import EtcdStore
from test_collections_support import ServiceThread
from testbed.etcd import EtcdCluster
from testbed.process import LOOPBACK

pytestmark = pytest.mark.etcd


class CuttingProxy:
    """TCP on 127.0.0.1: each connection goes to a random upstream; with probability
    ``cut`` it is closed when the upstream's first answer bytes arrive (dropped)."""

    def __init__(self, upstreams: list[tuple[str, int]], cut: float, seed: int) -> None:
        self.upstreams, self.cut = upstreams, cut
        self.random = random.Random(seed)
        self.cuts = 0
        self._lock = threading.Lock()
        self._server = socket.create_server((LOOPBACK, 0))
        self.port = self._server.getsockname()[1]
        self._stopped = False
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._stopped:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            with self._lock:
                upstream = self.random.choice(self.upstreams)
                cutting = self.random.random() < self.cut
            threading.Thread(
                target=self._serve, args=(client, upstream, cutting), daemon=True
            ).start()

    def _serve(self, client: socket.socket, upstream: tuple[str, int], cutting: bool) -> None:
        try:
            server = socket.create_connection(upstream, timeout=30)
        except OSError:
            client.close()
            return

        def forward() -> None:
            try:
                while data := client.recv(65536):
                    server.sendall(data)
            except OSError:
                pass

        threading.Thread(target=forward, daemon=True).start()
        try:
            while data := server.recv(65536):
                if cutting:  # the service answered: it acted; the caller never hears
                    with self._lock:
                        self.cuts += 1
                    break
                client.sendall(data)
        except OSError:
            pass
        finally:
            for s in (client, server):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                s.close()

    def stop(self) -> None:
        self._stopped = True
        self._server.close()


def call(port: int, compute: str, what: str, **args: Any) -> tuple[dict[str, Any], int]:
    """One operation with an id, sent until an answer comes back: the answer, and how
    many attempts lost theirs."""
    kind, name, op = what.split(".")
    args = {"operation": uuid.uuid4().hex, **args}
    if "value" in args:
        args["value"] = base64.b64encode(args["value"]).decode()
    body = json.dumps(args)
    lost = 0
    for _ in range(50):
        connection = http.client.HTTPConnection(LOOPBACK, port, timeout=30)
        try:
            connection.request(
                "POST",
                f"/v1/collections/{compute}/{kind}/{name}/{op}",
                body,
                {"Authorization": "Bearer token-a", "Content-Type": "application/json"},
            )
            response = connection.getresponse()
            answer = json.loads(response.read())
        except (OSError, http.client.HTTPException):
            lost += 1
            continue
        finally:
            connection.close()
        if response.status == 503:
            continue
        assert response.status == 200, answer
        if isinstance(answer.get("value"), str):
            answer["value"] = base64.b64decode(answer["value"])
        return answer, lost
    raise AssertionError(f"{what}: no answer in 50 attempts")


@pytest.fixture
def proxied(state_etcd: EtcdCluster) -> Iterator[tuple[CuttingProxy, str]]:
    services = [
        ServiceThread(lambda: EtcdStore(state_etcd.endpoints, timeout=5)).start() for _ in range(2)
    ]
    proxy = CuttingProxy([(LOOPBACK, s.port) for s in services], cut=0.3, seed=39)
    try:
        yield proxy, f"job-{uuid.uuid4().hex[:10]}"
    finally:
        proxy.stop()
        for s in services:
            s.stop()


def test_a_counter_ends_exact_when_answers_are_lost(proxied: tuple[CuttingProxy, str]) -> None:
    proxy, compute = proxied
    workers, adds = 8, 40

    def work(w: int) -> int:
        lost = 0
        for _ in range(adds):
            _, cut = call(proxy.port, compute, "counter.c.add", n=w + 1)
            lost += cut
        return lost

    with ThreadPoolExecutor(workers) as pool:
        lost = sum(pool.map(work, range(workers)))
    total = sum(w + 1 for w in range(workers)) * adds
    value = call(proxy.port, compute, "counter.c.get")[0]["value"]
    print(f"{workers * adds} adds, {lost} answers lost and sent again: the counter is {value}")
    assert lost >= 20  # the cuts happened, and each one was retried
    assert value == total


def test_every_queue_item_is_delivered_once_when_answers_are_lost(
    proxied: tuple[CuttingProxy, str],
) -> None:
    proxy, compute = proxied
    items = [b"item-%d" % i for i in range(240)]
    delivered: list[bytes] = []
    lost = [0, 0]
    done = threading.Event()

    counting = threading.Lock()

    def offer(chunk: list[bytes]) -> None:
        for item in chunk:
            cut = call(proxy.port, compute, "queue.q.offer", value=item)[1]
            with counting:
                lost[0] += cut

    def poll() -> None:
        while True:
            answer, cut = call(proxy.port, compute, "queue.q.poll")
            with counting:
                lost[1] += cut
            if answer["found"]:
                delivered.append(answer["value"])
            elif done.is_set():
                return

    with ThreadPoolExecutor(10) as pool:
        offers = [pool.submit(offer, items[i::4]) for i in range(4)]
        polls = [pool.submit(poll) for _ in range(4)]
        for f in offers:
            f.result()
        done.set()
        for f in polls:
            f.result()
    print(
        f"{len(items)} items offered ({lost[0]} offer answers lost), {len(delivered)} "
        f"delivered ({lost[1]} poll answers lost)"
    )
    assert lost[0] >= 10 and lost[1] >= 10
    assert sorted(delivered) == sorted(items)  # none twice, none lost
