"""The collections' WebSocket: what the service answers to any message, when it closes a
socket (idle, a token no longer accepted, shutting down) and how the client carries on:
an operation the service did not run is sent again, once run it is never sent twice.
Falls back to one POST per operation where the upgrade is refused."""

from __future__ import annotations

import asyncio
import json
import os
import threading
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import WSMsgType, web

from o41.client import transport
from o41.client.collections import (
    Client,
    HttpTransport,
    NotAllowed,
    Unavailable,
)
from o41.state.memory import MemoryStore
from o41.webhook.collections import websocket as routes
from o41.webhook.collections.service import RECONNECT
from o41.webhook.http.errors import problem
from test_collections_support import ServiceThread

from support import wait_for


@pytest.fixture
def service() -> Iterator[ServiceThread]:
    running = ServiceThread(MemoryStore).start()
    try:
        yield running
    finally:
        running.stop()


def transport_of(client: Client) -> HttpTransport:
    transport = client.transport
    assert isinstance(transport, HttpTransport)
    return transport


def test_operations_go_over_the_websocket_and_values_of_any_size_come_back(
    service: ServiceThread,
) -> None:
    client = service.client()
    d = client.dict("sizes")
    # messages under 126 bytes, under 64 KiB and over: each of a frame's length encodings
    values = {size: os.urandom(size) for size in (0, 20, 1_000, 40_000, 400_000)}
    for size, value in values.items():
        d[size] = value
    assert {size: d[size] for size in values} == values
    assert transport_of(client).websocket
    assert service.app is not None and len(service.app[routes.COLLECTIONS].sockets) == 1


async def exchange(url: str, *messages: str | bytes, token: str = "token-a") -> list[Any]:
    """Send ``messages`` on one WebSocket; what came back: answers, then a close's code."""
    got: list[Any] = []
    async with (
        aiohttp.ClientSession() as session,
        session.ws_connect(
            url + routes.WS_ROUTE, headers={"Authorization": f"Bearer {token}"}
        ) as ws,
    ):
        for message in messages:
            if isinstance(message, bytes):
                await ws.send_bytes(message)
            else:
                await ws.send_str(message)
            answer = await ws.receive(timeout=30)
            if answer.type is WSMsgType.TEXT:
                got.append(json.loads(answer.data))
            else:
                got.append(("closed", ws.close_code, answer.extra))
                break
    return got


def op(ident: object, **fields: Any) -> str:
    return json.dumps(
        {"id": ident, "compute": "job", "kind": "dict", "name": "d", "op": "get", **fields}
    )


def test_every_message_gets_a_clear_answer(service: ServiceThread) -> None:
    answers = service.run(
        exchange(
            service.url,
            "not json",
            "[1, 2]",
            op(1, compute=5),
            op(2, args=[]),
            op(3, args={"key": "sk", "value": "!!"}),
            op(4, kind="tree"),
            op(5, op="set", args={"key": "sk", "value": "aGk="}),
            op(6, args={"key": "sk"}),
            b"\x00binary",
        )
    )
    assert answers[0] == {"id": None, "status": 400, "error": answers[0]["error"]}
    assert "JSON object" in answers[0]["error"] and answers[1]["status"] == 400
    assert answers[2] == {"id": 1, "status": 400, "error": "compute must be text"}
    assert answers[3]["status"] == 400 and "arguments must be a JSON object" in answers[3]["error"]
    assert answers[4]["status"] == 400 and "base64" in answers[4]["error"]
    assert answers[5]["status"] == 400 and "unknown collection kind" in answers[5]["error"]
    assert answers[6] == {"id": 5, "status": 200, "result": {}}
    assert answers[7] == {"id": 6, "status": 200, "result": {"found": True, "value": "aGk="}}
    assert answers[8] == ("closed", 1003, "send operations as JSON text")


def test_a_message_over_the_limit_closes_the_socket(service: ServiceThread) -> None:
    huge = op(1, args={"key": "sk", "pad": "x" * (routes.MAX_MESSAGE + 1)})
    (answer,) = service.run(exchange(service.url, huge))
    assert answer[:2] == ("closed", 1009)


def test_the_upgrade_needs_a_token_and_says_how_to_use_the_route(service: ServiceThread) -> None:
    async def get(headers: dict[str, str]) -> tuple[int, Any]:
        async with (
            aiohttp.ClientSession() as session,
            session.get(service.url + routes.WS_ROUTE, headers=headers) as response,
        ):
            return response.status, await response.json()

    status, body = service.run(get({}))
    assert status == 401 and "bearer token" in body["error"]
    status, body = service.run(get({"Authorization": "Bearer token-a"}))
    assert status == 400 and "Upgrade: websocket" in body["error"]
    with pytest.raises(NotAllowed, match="not accepted"):
        service.client(token="forged").counter("c").get()


def test_a_revoked_token_stops_working_on_an_open_socket(
    service: ServiceThread, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(routes, "RECHECK", 0.0)  # check the token before every operation
    client = service.client(token="token-a")
    client.counter("c").add(5)
    service.tokens.revoke("token-a")
    with pytest.raises(NotAllowed, match="not accepted"):
        client.counter("c").add(1)
    service.tokens.grant("token-a2", "team-a")
    assert service.client(token="token-a2").counter("c").get() == 5  # the refused add: not run


def test_a_token_that_cannot_be_checked_again_closes_the_socket_unrun(
    service: ServiceThread, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(routes, "RECHECK", 0.0)
    monkeypatch.setenv("O41_ARTIFACTS_RETRY_DEADLINE", "0")  # the 503 itself, not a retry
    client = service.client()
    client.counter("c").add(5)
    service.tokens.down = True
    with pytest.raises(Unavailable, match="could not be checked now") as refused:
        client.counter("c").add(1)  # closed unrun; the upgrade again: a 503, logged
    assert refused.value.status == 503
    assert "checking a WebSocket's token again failed" in caplog.text
    service.tokens.down = False
    assert client.counter("c").get() == 5


def test_a_client_that_leaves_mid_operation_is_no_error(
    service: ServiceThread, caplog: pytest.LogCaptureFixture
) -> None:
    async def leave_mid_wait() -> None:
        message = op(
            1,
            kind="barrier",
            name="b",
            op="wait",
            args={"parties": 2, "participant": "p", "timeout": 0.5},
        )
        async with (
            aiohttp.ClientSession() as session,
            session.ws_connect(
                service.url + routes.WS_ROUTE, headers={"Authorization": "Bearer token-a"}
            ) as ws,
        ):
            await ws.send_str(message)
        # gone before the answer: the service's send finds the socket closed

    service.run(leave_mid_wait())
    assert service.app is not None
    sockets = service.app[routes.COLLECTIONS].sockets
    wait_for(lambda: not sockets, 10, "the handler done")
    assert service.client().counter("c").add(1) == 1  # the service carries on
    assert not [r for r in caplog.records if r.levelname == "ERROR"], caplog.text


def test_a_rotated_token_is_read_again_and_the_operation_runs_once(
    service: ServiceThread, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(routes, "RECHECK", 0.0)
    token_file = tmp_path / "token"
    token_file.write_text("token-a\n")
    client = Client(HttpTransport(service.url, token_file=str(token_file)), "job-1")
    counter = client.counter("c")
    assert counter.add(1) == 1
    service.tokens.grant("token-a2", "team-a")  # the kubelet rotated the projected token
    token_file.write_text("token-a2\n")
    service.tokens.revoke("token-a")
    assert counter.add(1) == 2  # closed unrun (4000), sent again with the new token: once
    assert counter.get() == 2


def test_a_rotated_token_is_handed_over_in_band_and_the_socket_goes_on(
    service: ServiceThread, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The kubelet renews a projected token before it expires: the client sends the new
    one on the open WebSocket, which outlives the token it began with."""
    monkeypatch.setattr(routes, "RECHECK", 0.0)
    monkeypatch.setattr(transport, "TOKEN_REFRESH", 0.0)  # the file read before each call
    token_file = tmp_path / "token"
    token_file.write_text("token-a\n")
    client = Client(HttpTransport(service.url, token_file=str(token_file)), "job-1")
    counter = client.counter("c")
    assert counter.add(1) == 1
    assert service.app is not None
    sockets = service.app[routes.COLLECTIONS].sockets
    (first,) = list(sockets)
    service.tokens.grant("token-a2", "team-a")
    token_file.write_text("token-a2\n")
    service.tokens.revoke("token-a")
    assert counter.add(1) == 2
    assert list(sockets) == [first]  # the same socket, now known by the new token

    service.tokens.grant("token-b2", "team-b")  # a token of another namespace: refused
    token_file.write_text("token-b2\n")
    with pytest.raises(NotAllowed, match="not accepted as this connection's caller"):
        counter.add(1)
    wait_for(lambda: not sockets, 10, "the refused socket closed")


def test_a_token_in_band_must_name_the_same_caller(service: ServiceThread) -> None:
    service.tokens.grant("token-a2", "team-a")
    got = service.run(
        exchange(
            service.url,
            op(1, op="len"),
            json.dumps({"id": "auth", "auth": "token-a2"}),
            json.dumps({"id": "bad", "auth": 5}),
        )
    )
    assert [a["status"] for a in got[:2]] == [200, 200]
    assert got[2]["status"] == 400 and "auth must be the new token" in got[2]["error"]
    got = service.run(exchange(service.url, json.dumps({"id": "auth", "auth": "token-b"}), op(2)))
    assert got[0]["status"] == 401 and "reconnect" in got[0]["error"]
    assert got[1][:2] == ("closed", RECONNECT)


def test_an_idle_socket_is_closed_and_the_client_reconnects(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(routes, "IDLE", 0.2)  # looked at every 0.05 s
    running = ServiceThread(MemoryStore).start()
    try:
        client = running.client()
        client.counter("c").add(1)
        assert running.app is not None
        sockets = running.app[routes.COLLECTIONS].sockets
        wait_for(lambda: not sockets, 10, "the idle socket closed")
        assert client.counter("c").add(1) == 2  # on a new socket, once
        assert len(sockets) == 1
    finally:
        running.stop()


def test_the_client_falls_back_to_post_where_the_upgrade_is_refused() -> None:
    posts: list[str] = []

    @web.middleware
    async def older_service(
        request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        if request.path == routes.WS_ROUTE:
            raise problem(404, "not found")  # as a service before the WebSocket answers
        posts.append(request.path)
        return await handler(request)

    running = ServiceThread(MemoryStore, middlewares=[older_service]).start()
    try:
        client = running.client()
        client.dict("d")["k"] = [1, 2]
        assert client.dict("d")["k"] == [1, 2]
        assert not transport_of(client).websocket
        assert posts == ["/v1/collections/job-1/dict/d/set", "/v1/collections/job-1/dict/d/get"]
    finally:
        running.stop()


def arrived(service: ServiceThread) -> bool:
    """Whether a participant waits at barrier ``b`` of job-1 (its operation is running)."""
    return bool(service.run(service.store.range(b"/o41/collections/team-a/job-1/barrier/b/s/")))


def test_shutdown_closes_idle_sockets_and_answers_busy_ones_first(
    service: ServiceThread,
) -> None:
    idle, busy = service.client(), service.client()
    idle.dict("d")["k"] = "kept"
    waited: list[object] = []

    def wait() -> None:
        try:
            waited.append(busy.barrier("b", parties=2).wait(timeout=2))
        except Exception as e:  # the outcome is what the test looks at
            waited.append(e)

    waiter = threading.Thread(target=wait)
    waiter.start()
    wait_for(lambda: arrived(service), 10, "the barrier wait in flight")
    service.stop()  # graceful: the idle socket closes at once, the busy one after its answer
    waiter.join(30)
    assert len(waited) == 1 and isinstance(waited[0], TimeoutError), waited
    assert service.app is not None and not service.app[routes.COLLECTIONS].sockets

    again = ServiceThread(MemoryStore, port=service.port).start()  # the same address
    try:
        again.client().dict("d")["k"] = "new"  # a fresh client: fine
        assert idle.dict("d")["k"] == "new"  # the idle one reconnects by itself
    finally:
        again.stop()


async def test_the_client_answers_pings_while_it_waits(aiohttp_server: Any) -> None:
    """A proxy or a newer service may ping; the client pongs and still gets its answer."""
    pongs: list[bytes] = []

    async def pinging(request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(autoping=False)
        await ws.prepare(request)
        async for message in ws:
            if message.type is WSMsgType.TEXT:
                await ws.ping(b"are you there")
                pong = await ws.receive(timeout=10)
                pongs.append(pong.data if pong.type is WSMsgType.PONG else b"not a pong")
                await ws.send_str(json.dumps({"status": 200, "result": {"value": 7}}))
        return ws

    app = web.Application()
    app.router.add_get(routes.WS_ROUTE, pinging)
    server = await aiohttp_server(app, host="127.0.0.1")
    transport = HttpTransport(str(server.make_url("/")), token="t")
    try:  # the client blocks: in a thread, while this loop serves
        answer = await asyncio.to_thread(transport.call, "job", "counter", "c", "get", {})
    finally:
        await asyncio.to_thread(transport.close)
    assert answer == {"value": 7} and pongs == [b"are you there"]


def test_an_operation_cut_short_is_not_called_unrun(monkeypatch: pytest.MonkeyPatch) -> None:
    """A handler cancelled during an operation (a shutdown that ran out of time) may have
    run it: the socket closes with 1001, never 4000, and the client does not take it for
    unrun. (A barrier's wait is idempotent, so the client's retries would send it again
    within its timeout: off here, to see the close itself.)"""
    monkeypatch.setenv("O41_ARTIFACTS_RETRY_DEADLINE", "0")
    tasks: list[asyncio.Task[Any]] = []

    @web.middleware
    async def remember(
        request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        tasks.append(request.task)
        return await handler(request)

    running = ServiceThread(MemoryStore, middlewares=[remember]).start()
    waited: list[object] = []

    def wait() -> None:
        try:
            waited.append(running.client().barrier("b", parties=2).wait(timeout=3))
        except Exception as e:  # the outcome is what the test looks at
            waited.append(e)

    waiter = threading.Thread(target=wait)
    waiter.start()
    try:
        wait_for(lambda: arrived(running), 10, "the barrier wait in flight")

        async def cancel() -> None:
            tasks[-1].cancel()

        running.run(cancel())
        waiter.join(30)
    finally:
        running.stop()
    assert len(waited) == 1 and isinstance(waited[0], Unavailable), waited
    assert "1001" in str(waited[0]) and "did not answer" in str(waited[0]), waited


@pytest.mark.parametrize("quiet", [True, False], ids=["quiet", "answered"])
def test_a_release_is_not_waited_for_and_is_never_lost(
    service: ServiceThread,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    quiet: bool,
) -> None:
    """A lock's release is sent without waiting: quiet (answered only if refused) where the
    service takes it, else its answer is read before the next one's. Another client gets
    the lock; a release sent before the connection broke is sent again, waiting; one the
    service refused is sent again and its failure logged; closing the transport learns
    what is still unanswered first."""
    if not quiet:  # as a service from before quiet messages: it chooses no subprotocol
        monkeypatch.setattr(routes, "PROTOCOL", "o41.collections.v1")
    client, other = service.client(), service.client()
    transport = transport_of(client)
    holder = f"/o41/collections/team-a/{client.compute}/lock/l/holder".encode()
    lock = client.lock("l", ttl=10)
    assert lock.acquire(timeout=0)
    lock.release()
    conn = transport._local.conn
    assert conn.quiet is quiet
    pending = conn.unconfirmed if quiet else conn.deferred
    assert len(pending) == 1  # sent, not known to be taken yet
    with other.lock("l", timeout=10) as theirs:  # no one is kept waiting by it
        assert theirs.token > 0
    assert client.dict("d").get("x") is None and not pending  # answered before it: taken

    # the connection breaks after the release was sent: it is sent again
    assert lock.acquire(timeout=10)
    lock.release()
    transport._local.conn.sock.shutdown(2)
    client.dict("d")["x"] = 1  # retried afresh, the release sent again first
    assert client.dict("d")["x"] == 1
    assert service.run(service.store.get(holder)) is None
    assert lock.acquire(timeout=0)

    # refused (a token the service cannot take): sent again, and said in the log
    transport.send_later(client.compute, "lock", "l", "release", {"owner": "x", "token": 0})
    assert client.dict("d")["x"] == 1  # the operation at hand is answered as ever
    assert "failed again" in caplog.text and "token" in caplog.text
    caplog.clear()

    # closing learns the fate of what was sent last: taken, or refused and sent again
    lock.release()
    transport.send_later(client.compute, "lock", "l", "release", {"owner": "y", "token": 0})
    transport.close()
    wait_for(lambda: service.run(service.store.get(holder)) is None, 5, "the release")
    assert "failed again" in caplog.text


def test_a_quiet_message_is_answered_only_when_refused_and_a_ping_comes_after(
    service: ServiceThread,
) -> None:
    """The protocol itself: a quiet operation the service ran gets no answer, a refused one
    is answered with its id, and a ping is answered after every message before it."""

    async def talk() -> tuple[str | None, list[Any]]:
        got: list[Any] = []
        async with (
            aiohttp.ClientSession() as session,
            session.ws_connect(
                service.url + routes.WS_ROUTE,
                headers={"Authorization": "Bearer token-a"},
                protocols=(routes.PROTOCOL,),
                autoping=False,
            ) as ws,
        ):
            await ws.send_str(op("q1", op="set", args={"key": "sk", "value": "aGk="}, quiet=True))
            await ws.send_str(op("q2", op="set", args={"key": "sk", "value": "!!"}, quiet=True))
            await ws.send_str(op("q3", op="delete", args={"key": "sk"}, quiet=True))
            await ws.ping(b"sync")
            while (answer := await ws.receive(timeout=30)).type is not WSMsgType.PONG:
                got.append(json.loads(answer.data))
            got.append(("pong", answer.data))
            await ws.send_str(op(4, args={"key": "sk"}))
            got.append(json.loads((await ws.receive(timeout=30)).data))
            return ws.protocol, got

    protocol, got = service.run(talk())
    assert protocol == routes.PROTOCOL
    assert got[0]["id"] == "q2" and got[0]["status"] == 400 and "base64" in got[0]["error"]
    assert got[1:] == [
        ("pong", b"sync"),
        {"id": 4, "status": 200, "result": {"found": False, "value": None}},
    ]
