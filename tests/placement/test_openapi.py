"""The OpenAPI document is valid and names every route the service serves, and no other."""

from __future__ import annotations

import re

from openapi_spec_validator import validate

from o41.webhook.app import Settings, make_app
from o41.webhook.openapi import document


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


def test_the_begin_body_refers_to_schemas_that_exist() -> None:
    schemas = document()["components"]["schemas"]
    refs = re.findall(r'"\$ref": "#/components/schemas/(\w+)"', str(document()).replace("'", '"'))
    assert refs and set(refs) <= set(schemas)
    assert "PlaceIn" in schemas
