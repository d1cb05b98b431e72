"""Hostile input gets a 4xx that says what was wrong, never a 500, over HTTP and over the
WebSocket (whose socket stays open): bodies and keys nested deep, a wrong method, a
TokenReview the Kubernetes API cannot answer.

The collections' service is the real aiohttp app on 127.0.0.1 (ServiceThread); the
placement service is the real process of the test bed (a real TokenReview).
"""

from __future__ import annotations

import base64
import http.client
import json
import urllib.parse
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client as kube_client

from o41.client.transport import LimitReached
from o41.collections import values
from o41.state.etcd import EtcdStore
from o41.state.memory import MemoryStore
from o41.webhook.collections import routes
from o41.webhook.collections.quota import Limits
from o41.webhook.identity import auth
from test_collections_support import ServiceThread
from test_collections_websocket import exchange, op
from testbed.etcd import EtcdCluster
from testbed.kube import Kube
from testbed.process import LOOPBACK, free_port
from testbed.product import PlacementProcess

from support import wait_for


@pytest.fixture
def service() -> Iterator[ServiceThread]:
    running = ServiceThread(MemoryStore).start()
    try:
        yield running
    finally:
        running.stop()


def request(
    url: str,
    method: str,
    path: str,
    body: bytes | None = None,
    token: str | None = "token-a",
) -> tuple[int, dict[str, str], Any]:
    """One HTTP request: the status, the headers and the JSON answer."""
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or LOOPBACK, parts.port, timeout=30)
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    conn.request(method, path, body, headers)
    response = conn.getresponse()
    status, answer, data = response.status, dict(response.getheaders()), response.read()
    conn.close()
    return status, answer, json.loads(data)


DEEP_BODY = b"[" * 100_000
DEEP_KEY = "(" + "[" * 4_000  # a key's canonical text: a tag, then a JSON array


def test_a_deep_body_is_refused_before_it_is_parsed(service: ServiceThread) -> None:
    status, _, body = request(service.url, "POST", "/v1/collections/job/dict/d/get", DEEP_BODY)
    assert status == 400, body
    assert "holds 100000 arrays and objects" in body["error"]
    deep = json.dumps({"key": "sk", "pad": json.loads("[" * 40 + "]" * 40)}).encode()
    status, _, body = request(service.url, "POST", "/v1/collections/job/dict/d/get", deep)
    assert status == 400 and "nests 41 levels deep" in body["error"]


def test_a_deep_key_is_refused_before_it_is_parsed(service: ServiceThread) -> None:
    args = json.dumps({"key": DEEP_KEY}).encode()
    status, _, body = request(service.url, "POST", "/v1/collections/job/dict/d/get", args)
    assert status == 400, body
    assert "not an encoded key" in body["error"] and "a key's array" in body["error"]


def test_deep_messages_get_an_answer_and_the_socket_stays_open(service: ServiceThread) -> None:
    answers = service.run(
        exchange(
            service.url,
            "[" * 100_000,
            op(1, args={"key": DEEP_KEY}),
            op(2, op="set", args={"key": "sk", "value": "aGk="}),
            op(3, args={"key": "sk"}),
        )
    )
    assert answers[0]["status"] == 400 and "arrays and objects" in answers[0]["error"]
    assert answers[1]["id"] == 1 and answers[1]["status"] == 400
    assert "not an encoded key" in answers[1]["error"]
    assert answers[2] == {"id": 2, "status": 200, "result": {}}
    assert answers[3] == {"id": 3, "status": 200, "result": {"found": True, "value": "aGk="}}


def test_a_wrong_method_is_405_with_allow(service: ServiceThread) -> None:
    status, headers, body = request(service.url, "GET", "/v1/collections/job/dict/d/get")
    assert status == 405, body
    assert headers["Allow"] == "POST"
    assert body == {"error": "GET is not allowed on /v1/collections/job/dict/d/get: use POST"}
    status, headers, body = request(service.url, "DELETE", "/v1/collections")
    assert status == 405 and "GET" in headers["Allow"] and "use GET" in body["error"]


def test_a_status_aiohttp_names_keeps_its_meaning() -> None:
    from o41.webhook.http.errors import problem

    for status in (405, 408, 413, 418, 429, 451, 501, 507):
        error = problem(status, "why", headers={"Retry-After": "3"})
        assert error.status == status
        assert json.loads(error.text or "") == {"error": "why"}
        assert error.headers["Retry-After"] == "3"


def unreachable_api() -> Any:
    """A Kubernetes client of an API server that is away (nothing listens on its port)."""
    configuration = kube_client.Configuration()
    configuration.host = f"http://{LOOPBACK}:{free_port()}"
    configuration.retries = 0
    return kube_client.ApiClient(configuration)


def test_a_tokenreview_that_cannot_be_made_is_503_with_retry_after() -> None:
    api = unreachable_api()
    running = ServiceThread(MemoryStore)
    running.tokens = auth.KubernetesTokenReviewer(api)  # type: ignore[assignment]
    running.start()
    try:
        status, headers, body = request(running.url, "POST", "/v1/collections/job/dict/d/len")
        assert status == 503, body
        assert headers["Retry-After"] == str(auth.RETRY_AFTER)
        assert "the token could not be checked now" in body["error"]
        assert "try again" in body["error"]
    finally:
        running.stop()
        api.close()


def test_a_tokenreview_down_refuses_the_websocket_upgrade_with_503(service: ServiceThread) -> None:
    service.tokens.down = True
    parts = urllib.parse.urlsplit(service.url)
    conn = http.client.HTTPConnection(parts.hostname or LOOPBACK, parts.port, timeout=30)
    conn.request(
        "GET",
        "/v1/collections",
        headers={
            "Authorization": "Bearer token-a",
            "Connection": "Upgrade",
            "Upgrade": "websocket",
            "Sec-WebSocket-Version": "13",
            "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
        },
    )
    response = conn.getresponse()
    assert response.status == 503
    assert response.getheader("Retry-After") == str(auth.RETRY_AFTER)
    assert "could not be checked" in json.loads(response.read())["error"]
    conn.close()


# the placement service (a real process, a real TokenReview)


@pytest.fixture(scope="module")
def pod_token(kube: Kube, placement: PlacementProcess) -> str:
    return kube.token("attack-input")


@pytest.mark.kube
@pytest.mark.etcd
def test_placement_refuses_deep_bodies_and_wrong_methods(
    placement: PlacementProcess, pod_token: str
) -> None:
    status, _, body = request(placement.url, "POST", "/v1/writes", DEEP_BODY, pod_token)
    assert status == 400 and "arrays and objects" in body["error"], body
    nested = b'{"organization": "o", "artifact": "a", "place": ' + b"[" * 50 + b"]" * 50 + b"}"
    status, _, body = request(placement.url, "POST", "/v1/writes", nested, pod_token)
    assert status == 400 and "nests 51 levels deep" in body["error"], body
    status, headers, body = request(placement.url, "GET", "/v1/writes", None, pod_token)
    assert status == 405 and headers["Allow"] == "POST", body


# quota per namespace, rate per token: against the real etcd


def quota_service(cluster: EtcdCluster, limits: Limits) -> tuple[ServiceThread, str, str]:
    """A service on ``cluster`` with ``limits``, and two tokens of fresh namespaces."""
    first, second = (f"quota-{uuid.uuid4().hex[:8]}" for _ in range(2))
    running = ServiceThread(
        lambda: EtcdStore(cluster.endpoints, timeout=5),
        routes.Options(limits=limits),
        tokens={"token-full": first, "token-other": second},
    ).start()
    return running, first, second


@pytest.mark.etcd
def test_a_namespace_at_its_quota_is_refused_others_are_not(state_etcd: EtcdCluster) -> None:
    limits = Limits(bytes=96 * 1024, entries=10_000, recount=3600)  # no background count
    service, namespace, _ = quota_service(state_etcd, limits)
    try:
        full = service.client("token-full").dict("d")
        other = service.client("token-other").dict("d")
        value = b"v" * 20_000
        stored, refused = fill(full, value)
        assert 1 <= stored < 5
        message = str(refused)
        assert refused.status == 429
        assert "this namespace's collections hold" in message and "of its 96.0 KiB quota" in message
        assert "delete entries or clear collections" in message
        assert "placement.collectionLimits.bytesPerNamespace" in message
        quota = service.app[routes.COLLECTIONS].quota if service.app else None
        assert quota is not None
        counts = quota.counts
        for i in range(20):
            other[i] = value[:1000]  # another namespace: its own quota
        assert quota.counts == counts + 1  # one first count, then none on the hot path
        status, headers, body = request(
            service.url, "POST", "/v1/collections/job-1/dict/d/set", _set(99, value), "token-full"
        )
        assert status == 429 and "Retry-After" not in headers and "quota" in body["error"]
        status, _, usage = request(service.url, "GET", "/v1/collections/usage", None, "token-full")
        assert status == 200 and usage["namespace"] == namespace
        assert usage["entries"] == stored and stored * 20_000 < usage["bytes"] <= 96 * 1024
        assert usage["limits"]["bytesPerNamespace"] == 96 * 1024
        del full[0]  # room again, found at the next write's recount
        full["again"] = value
        assert full["again"] == value
    finally:
        service.stop()


@pytest.mark.etcd
def test_entries_are_limited_over_the_websocket_too(state_etcd: EtcdCluster) -> None:
    service, _, _ = quota_service(state_etcd, Limits(entries=5, recount=3600))
    try:
        queue = service.client("token-full").queue("q")
        for i in range(5):  # admitted by the estimate; the queue's sequence key is one more
            queue.offer(i)
        answers = service.run(
            exchange(
                service.url,
                op(1, compute="job-1", kind="queue", name="q", op="offer", args={"value": "aGk="}),
                op(2, compute="job-1", kind="queue", name="q", op="poll", args={}),
                token="token-full",
            )
        )
        assert answers[0]["status"] == 429  # by the estimate: 5 writes (etcd holds 6 keys)
        assert "hold 5 entries, its quota is 5" in answers[0]["error"]
        assert answers[1]["status"] == 200  # reads and claims go on: they make room
        assert queue.poll() == 1
        queue.offer("room")  # after the polls, a count finds the room
    finally:
        service.stop()


@pytest.mark.etcd
def test_the_rate_per_token_answers_429_and_recovers(
    state_etcd: EtcdCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("O41_ARTIFACTS_RETRY_DEADLINE", "0")  # the 429 itself, not a retry
    service, _, _ = quota_service(state_etcd, Limits(ops_per_second=5, bytes_per_second=1))
    try:
        refusals = []
        for _ in range(40):  # a burst is 10 operations
            status, headers, body = request(
                service.url, "POST", "/v1/collections/job-1/dict/d/len", None, "token-full"
            )
            if status == 429:
                refusals.append((headers, body))
            else:
                assert status == 200, body
        assert refusals, "40 operations at once, 5 a second allowed: none refused"
        headers, body = refusals[0]
        assert int(headers["Retry-After"]) >= 1
        assert "this token sends more than 5 operations" in body["error"]
        assert "placement.collectionLimits.opsPerSecondPerToken" in body["error"]
        status, _, _ = request(
            service.url, "POST", "/v1/collections/job-1/dict/d/len", None, "token-other"
        )
        assert status == 200  # another token: its own bucket

        def answered() -> bool | None:
            status, _, _ = request(
                service.url, "POST", "/v1/collections/job-1/dict/d/len", None, "token-full"
            )
            return status == 200 or None

        wait_for(answered, 10, "the token's bucket refilled")
        big = service.client("token-other").dict("big")  # 2 MiB of bytes a burst
        stored, refused = fill(big, b"x" * 400_000)
        assert stored <= 5 and "try again in" in str(refused)
    finally:
        service.stop()


@pytest.mark.etcd
def test_the_usage_is_counted_page_by_page(state_etcd: EtcdCluster) -> None:
    service, namespace, _ = quota_service(state_etcd, Limits())
    try:
        registry = service.client("token-full").registry("r")
        for i in range(150):  # pages of 64 keys, then as many as 4 MiB hold
            registry.register(f"model-{i}", b"w" * 100)
        key = len(f"/o41/collections/{namespace}/job-1/registry/r/e/smodel-")
        digits = sum(len(str(i)) for i in range(150))
        value = len(values.dumps(b"w" * 100))  # the format byte and msgpack's header too

        def counted() -> dict[str, Any] | None:
            """The usage, once counted after the writes (a count under 1 s old is reused,
            with this replica's writes since added as new)."""
            status, _, usage = request(
                service.url, "GET", "/v1/collections/usage", None, "token-full"
            )
            assert status == 200 and usage["namespace"] == namespace
            assert usage["entries"] == 150  # counted, or estimated from a count and writes
            assert usage["bytes"] >= 150 * (key + value) + digits  # an estimate errs high
            return usage if usage["counted"]["entries"] == 150 else None

        usage = wait_for(counted, 10, "a count of the namespace after its writes")
        assert usage["counted"]["bytes"] == usage["bytes"] == 150 * (key + value) + digits
    finally:
        service.stop()


def fill(d: Any, value: bytes) -> tuple[int, LimitReached]:
    """Store ``value`` under 0, 1, ... until refused: how many went in, and the refusal."""
    for i in range(20):
        try:
            d[i] = value
        except LimitReached as e:
            return i, e
    raise AssertionError("20 writes and none refused")


def _set(key: int, value: bytes) -> bytes:
    return json.dumps({"key": f"i{key}", "value": base64.b64encode(value).decode()}).encode()


def test_limits_come_from_the_environment() -> None:
    env = {"O41_COLLECTIONS_QUOTA_BYTES": "1048576", "O41_COLLECTIONS_RATE_OPS": "0"}
    limits = Limits.from_environment(env)
    assert limits.bytes == 1048576 and limits.ops_per_second == 0 and limits.entries == 50_000
    with pytest.raises(ValueError, match="O41_COLLECTIONS_QUOTA_ENTRIES must be a number"):
        Limits.from_environment({"O41_COLLECTIONS_QUOTA_ENTRIES": "many"})
    with pytest.raises(ValueError, match="0 \\(no limit\\) or more"):
        Limits.from_environment({"O41_COLLECTIONS_RATE_BYTES": "-1"})


@pytest.mark.kube
def test_the_service_audience_when_required_refuses_a_token_meant_for_the_api_server(
    kube: Kube,
) -> None:
    """placement.audiences=[o41]: this cluster's TokenReview is asked for that audience, so
    the default ServiceAccount token (audience: the API server) is refused and a projected
    token for o41 is taken (issue 31, point 1)."""
    running = ServiceThread(MemoryStore)
    running.tokens = auth.KubernetesTokenReviewer(kube.api, audiences=["o41"])  # type: ignore[assignment]
    running.start()
    try:
        api_server_token = kube.token("audience-test")
        status, _, body = request(
            running.url, "POST", "/v1/collections/job/dict/d/len", token=api_server_token
        )
        assert status == 401, body
        o41_token = kube.kubectl(
            "-n", "audience-test", "create", "token", "default", "--audience", "o41"
        ).strip()
        status, _, body = request(
            running.url, "POST", "/v1/collections/job/dict/d/len", token=o41_token
        )
        assert (status, body) == (200, {"len": 0})
    finally:
        running.stop()
