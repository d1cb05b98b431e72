"""The OpenAPI document is valid, names every route the service serves and no other, and
its schemas are the very models the views answer with: the document's component schemas
are the models' own (pydantic's), a field added to a model is in the document, and every
JSON answer of every route, in process, is exactly its documented model (no field the
model does not declare, every field it requires)."""

from __future__ import annotations

import copy
import hashlib
import re
import zlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Annotated, Any, NotRequired

import aiohttp
import pytest
from openapi_schema_validator import OAS31Validator
from openapi_spec_validator import validate
from pydantic import Field

from o41.core.parts import crc32_b64
from o41.webhook.app import Settings, make_app
from o41.webhook.openapi import MODELS, document, schemas
from o41.webhook.writes import answers
from test_writes import Service, serve
from testbed.locations import ORG

MIB = 1024 * 1024


def test_the_document_is_valid_openapi() -> None:
    validate(document())  # raises on a dangling $ref, a wrong type, a missing field


def test_every_route_is_documented_and_only_those() -> None:
    app = make_app(Settings(authentication="none"))
    served = set()
    for route in app.router.routes():
        if route.method == "HEAD":
            continue  # aiohttp adds HEAD beside GET
        info = route.resource.get_info() if route.resource else {}
        path = info.get("path") or info.get("formatter", "")
        served.add((route.method.lower(), re.sub(r"\{(\w+)(:[^}]*)?\}", r"{\1}", path)))
    documented = {(method, path) for path, item in document()["paths"].items() for method in item}
    assert served == documented


def test_every_request_body_is_required_and_every_answer_has_a_schema() -> None:
    doc = document()
    for path, item in doc["paths"].items():
        for method, op in item.items():
            body = op.get("requestBody")
            if body is not None and "{op}" not in path:  # an operation may take no argument
                assert body["required"] is True, (method, path)
            for code, answer in op["responses"].items():
                if code in ("101", "303"):
                    continue
                assert answer.get("content"), (method, path, code)


def test_the_schemas_are_the_models_own_and_every_model_is_used() -> None:
    components = document()["components"]["schemas"]
    assert components == schemas(MODELS)
    refs = set(re.findall(r"#/components/schemas/(\w+)", str(document()["paths"])))
    assert refs == {m.__name__ for m in MODELS}
    used = set(re.findall(r"#/components/schemas/(\w+)", str(components)))
    assert refs | used == set(components)  # no dangling $ref, no schema unused


def test_a_field_added_to_an_answer_is_in_the_document() -> None:
    class CommitOut(answers.CommitOut):  # the same answer, a field more
        added: NotRequired[Annotated[int, Field(description="A new field.")]]

    before, after = schemas((answers.CommitOut,))["CommitOut"], schemas((CommitOut,))["CommitOut"]
    assert after["properties"] == {
        **before["properties"],
        "added": {"description": "A new field.", "title": "Added", "type": "integer"},
    }
    assert after["required"] == before["required"]  # NotRequired: it may be absent


# --- every answer, as the service gives it ----------------------------------------------


def closed(schemas: dict[str, Any]) -> dict[str, Any]:
    """``schemas`` with no field beyond those declared: every object schema that lists
    properties and says nothing of others refuses them (a map, ``dict[str, ...]``, keeps
    its ``additionalProperties``; a collection operation's result, which declares none,
    stays open)."""
    strict = copy.deepcopy(schemas)

    def close(node: Any) -> None:
        if isinstance(node, dict):
            if node.get("properties") and "additionalProperties" not in node:
                node["additionalProperties"] = False
            for value in node.values():
                close(value)
        elif isinstance(node, list):
            for value in node:
                close(value)

    close(strict)
    return strict


OPERATIONS = {
    (method, path): op
    for path, item in document()["paths"].items()
    for method, op in item.items()
    if path != "/openapi.json"
}
JSON_OPERATIONS = {
    op["operationId"]
    for op in OPERATIONS.values()
    if "application/json" in str(op["responses"].get("200") or op["responses"].get("201"))
}


@pytest.fixture
async def service(tmp_path: Path) -> AsyncIterator[Service]:
    async for s in serve(tmp_path):
        yield s


async def every_answer(service: Service) -> list[tuple[str, int, Any]]:
    """(operationId, status, answer) of every JSON route, in one flow: a file version in
    one PUT and one in parts, a directory version, their reads, the listings, tags, usage,
    collections and the health checks; and refusals."""
    seen: list[tuple[str, int, Any]] = []

    async def call(op: str, method: str, path: str, body: Any = None) -> Any:
        status, answer = await service.api(method, path, body)
        seen.append((op, status, answer))
        return answer

    place = {"cloud": "aws", "region": "us-east-1", "source": "env"}
    m = f"/v1/organizations/{ORG}/artifacts/m"
    d = f"/v1/organizations/{ORG}/artifacts/d"
    data = b"x" * 1000
    one = await call(
        "begin",
        "POST",
        "/v1/writes",
        {"organization": ORG, "artifact": "m", "place": place, "size": len(data)},
    )
    parts = [b"a" * (5 * MIB), b"b" * 100]
    two = await call(
        "begin",
        "POST",
        "/v1/writes",
        {
            "organization": ORG,
            "artifact": "m",
            "place": place,
            "size": sum(map(len, parts)),
            "partSize": 5 * MIB,
            "crc32": [crc32_b64(zlib.crc32(p)) for p in parts],
            "metadata": {"step": 1},
        },
    )
    files = {"a.txt": b"alpha", "sub/b.bin": b"beta!"}
    three = await call(
        "beginDirectory",
        "POST",
        "/v1/directories",
        {
            "organization": ORG,
            "artifact": "d",
            "place": place,
            "files": [
                {"path": p, "size": len(b), "md5": hashlib.md5(b).hexdigest()}
                for p, b in files.items()
            ],
        },
    )
    etags = []
    async with aiohttp.ClientSession() as s:
        single = one["upload"]["single"]
        async with s.put(single["url"], data=data, headers=single["headers"]) as r:
            assert r.status == 200
        for signed, part in zip(two["upload"]["multipart"]["parts"], parts, strict=True):
            async with s.put(signed["url"], data=part, headers=signed["headers"]) as r:
                etags.append(r.headers["ETag"])
        for signed in three["files"]:
            body = files[signed["path"]]
            async with s.put(signed["url"], data=body, headers=signed["headers"]) as r:
                assert r.status == 200
    one, two, three = one["version"], two["version"], three["version"]
    await call("progress", "GET", f"/v1/writes/{two}")
    await call("signParts", "POST", f"/v1/writes/{two}/parts", {"parts": [2]})
    await call("commit", "POST", f"/v1/writes/{one}/commit", {"tag": "best"})
    await call("commit", "POST", f"/v1/writes/{two}/commit", {"etags": etags})
    await call("commitDirectory", "POST", f"/v1/directories/{three}/commit", {"tag": "t"})
    q = "?cloud=aws&region=us-west-2&source=env"
    for ref in (one, two, "latest", "best"):
        await call("read", "GET", f"{m}/versions/{ref}{q}")
    await call("read", "GET", f"{d}/versions/{three}")
    await call("files", "GET", f"{d}/versions/{three}/files{q}")
    await call("files", "GET", f"{d}/versions/{three}/files?download=true")
    await call("readFile", "GET", f"{d}/versions/{three}/files/sub/b.bin{q}")
    await call("artifacts", "GET", f"/v1/organizations/{ORG}/artifacts?limit=1")
    await call("versions", "GET", f"{m}/versions?limit=1")
    await call("versions", "GET", f"{d}/versions")
    await call("versions", "GET", f"/v1/organizations/{ORG}/artifacts/none/versions")
    await call("moveTag", "PUT", f"{m}/tags/next", {"version": two})
    await call("moveTag", "PUT", f"{m}/tags/next", {"version": one, "expected": one})
    await call("tags", "GET", f"{m}/tags")
    await call("resolve", "GET", f"{m}/tags/best")
    await call("resolve", "GET", f"{d}/tags/latest")
    await call("deleteTag", "DELETE", f"{m}/tags/next?expected={two}")
    await call("usage", "GET", f"/v1/usage?organization={ORG}")
    await call("usage", "GET", f"/v1/usage?organization={ORG}&records=true&limit=2")
    await call(
        "collection", "POST", "/v1/collections/job/dict/d/set", {"key": "sk", "value": "TaF2"}
    )
    await call("collection", "POST", "/v1/collections/job/dict/d/get", {"key": "sk"})
    await call("collection", "POST", "/v1/collections/job/counter/n/add", {"n": 2})
    await call("collectionsUsage", "GET", "/v1/collections/usage")
    await call("healthz", "GET", "/healthz")
    await call("readyz", "GET", "/readyz")
    await call("begin", "POST", "/v1/writes", {"organization": ORG})
    await call("progress", "GET", f"/v1/writes/{one}")
    await call("read", "GET", f"{m}/versions/v0")
    return seen


async def test_every_answer_is_exactly_its_model(service: Service) -> None:
    components = closed(document()["components"]["schemas"])
    by_id = {op["operationId"]: op for op in OPERATIONS.values()}
    seen = await every_answer(service)
    answered = set()
    for op, status, answer in seen:
        schema = by_id[op]["responses"][str(status)]["content"]["application/json"]["schema"]
        validator = OAS31Validator({**schema, "components": {"schemas": components}})
        errors = [
            f"{'.'.join(map(str, e.absolute_path))}: {e.message}"
            for e in validator.iter_errors(answer)
        ]
        assert not errors, (op, status, errors[:3], answer)
        if status < 300:
            answered.add(op)
    assert answered == JSON_OPERATIONS  # every JSON route, answered
    assert {s for _, s, _ in seen if s >= 400} == {400, 404, 409}  # and some refusals
