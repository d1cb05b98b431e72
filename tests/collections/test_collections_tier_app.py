"""The collections tier's app in this process (``o41.webhook.tier``), on the embedded store
and without authentication: the collections answer as the hub's do, artifacts routes say
they go to the hub, /readyz follows the store, and the hub's ``--collections-etcd`` puts
the collections in a store of their own. Tokens are the process tests'
(test_collections_tier.py: a real TokenReview of a second cluster)."""

from __future__ import annotations

import base64
import uuid
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from o41.collections.keys import encode_key
from o41.state.memory import MemoryStore
from o41.webhook.__main__ import main
from o41.webhook.http.settings import Settings
from o41.webhook.identity import auth
from o41.webhook.tier import make_collections_app


def _app(store: MemoryStore) -> Any:
    settings = Settings(authentication="none")
    return make_collections_app(settings, auth.NoAuthentication("ml"), store=store)


async def test_the_collections_answer_as_the_hubs_do(aiohttp_client: Any) -> None:
    store = MemoryStore()
    client: TestClient[Any, Any] = await aiohttp_client(_app(store))
    path = "/v1/collections/job/counter/steps"
    once = {"n": 2, "operation": uuid.uuid4().hex}
    first = await client.post(f"{path}/add", json=once)
    again = await client.post(f"{path}/add", json=once)  # a retry of it
    assert (first.status, again.status) == (200, 200)
    got = await client.post(f"{path}/get", json={})
    assert (await got.json())["value"] == 2  # the operation id applied it once
    put = await client.post(
        "/v1/collections/job/dict/d/set",
        json={"key": encode_key("k"), "value": base64.b64encode(b"v").decode()},
    )
    assert put.status == 200, await put.text()
    usage = await client.get("/v1/collections/usage")
    assert (await usage.json())["namespace"] == "ml"
    keys = [kv.key for kv in await store.range(b"/o41/collections/")]
    assert keys and all(k.startswith(b"/o41/collections/ml/") for k in keys)


async def test_artifacts_routes_say_they_go_to_the_hub(aiohttp_client: Any) -> None:
    client: TestClient[Any, Any] = await aiohttp_client(_app(MemoryStore()))
    for method, path in (("POST", "/v1/writes"), ("GET", "/v1/organizations/ml/artifacts")):
        answer = await client.request(method, path)
        assert answer.status == 404
        body = await answer.json()
        assert "this is a collections tier" in body["error"]
        assert "$O41_ARTIFACTS_ENDPOINT" in body["error"]
    unknown = await client.post("/v1/collections/job/counter")  # a collections path: plain 404
    assert unknown.status == 404
    assert "collections tier" not in (await unknown.json())["error"]
    assert (await client.get("/healthz")).status == 200
    ready = await client.get("/readyz")
    assert (ready.status, await ready.json()) == (200, {"status": "ready"})
    assert (await client.get("/metrics")).status == 200


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--collections-etcd", "http://127.0.0.1:1"], "--collections-etcd is for --serve all"),
        (["--backup-organization", "platform"], "--backup-organization is for --serve all"),
    ],
)
def test_the_tier_refuses_the_hubs_flags(
    flags: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--serve", "collections", *flags])
    assert exited.value.code == 2
    assert said in capsys.readouterr().err
