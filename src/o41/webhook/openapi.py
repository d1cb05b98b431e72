"""The service's OpenAPI document, built from the same request models it validates with."""

from __future__ import annotations

from functools import cache
from typing import Any

from o41 import __version__
from o41.webhook.placement import BeginIn, CommitIn

_ERROR = {
    "description": "refused: the body says what was wrong and what to do",
    "content": {
        "application/json": {
            "schema": {"type": "object", "properties": {"error": {"type": "string"}}}
        }
    },
}


def _json(schema: dict[str, Any]) -> dict[str, Any]:
    return {"content": {"application/json": {"schema": schema}}}


@cache
def document() -> dict[str, Any]:
    errors = {str(c): _ERROR for c in (400, 401, 403, 404, 409, 413, 415, 503)}
    place_query = [
        {"name": n, "in": "query", "required": False, "schema": {"type": "string"}}
        for n in ("cloud", "region", "source")
    ]
    return {
        "openapi": "3.1.0",
        "info": {"title": "O41 Artifacts placement service", "version": __version__},
        "components": {
            "securitySchemes": {"pod": {"type": "http", "scheme": "bearer"}},
            "schemas": {
                "Begin": BeginIn.model_json_schema(ref_template="#/components/schemas/{model}"),
                "Commit": CommitIn.model_json_schema(ref_template="#/components/schemas/{model}"),
            },
        },
        "security": [{"pod": []}],
        "paths": {
            "/v1/writes": {
                "post": {
                    "summary": "Begin a write: choose the location, get pre-signed uploads",
                    "requestBody": _json({"$ref": "#/components/schemas/Begin"}),
                    "responses": {"201": {"description": "the version and its uploads"}, **errors},
                }
            },
            "/v1/writes/{version}/commit": {
                "post": {
                    "summary": "Commit a write once the bucket holds it",
                    "parameters": [
                        {
                            "name": "version",
                            "in": "path",
                            "required": True,
                            "schema": {"type": "string"},
                        }
                    ],
                    "requestBody": _json({"$ref": "#/components/schemas/Commit"}),
                    "responses": {"200": {"description": "committed"}, **errors},
                }
            },
            "/v1/organizations/{organization}/artifacts/{artifact}/versions/{version}": {
                "get": {
                    "summary": "Read a version: where it lives, locality, a download",
                    "parameters": [
                        {"name": n, "in": "path", "required": True, "schema": {"type": "string"}}
                        for n in ("organization", "artifact", "version")
                    ]
                    + place_query,
                    "responses": {"200": {"description": "the version"}, **errors},
                }
            },
            "/v1/usage": {
                "get": {
                    "summary": "Usage counters of one organization",
                    "parameters": [
                        {
                            "name": "organization",
                            "in": "query",
                            "required": True,
                            "schema": {"type": "string"},
                        }
                    ],
                    "responses": {"200": {"description": "counter records"}, **errors},
                }
            },
            "/healthz": {"get": {"security": [], "responses": {"200": {"description": "up"}}}},
            "/readyz": {"get": {"security": [], "responses": {"200": {"description": "ready"}}}},
        },
    }
