"""The service's OpenAPI document: every route, its bodies and its answers.

Each body and answer is described once, next to the capability that takes or answers it:
the request bodies are the pydantic models the views validate with
(``o41.webhook.writes.bodies``...), the answers the TypedDicts the views build
(``o41.webhook.writes.answers``, ``versions.answers``, ``directories.answers``,
``usage.answers``, ``collections.answers``, ``health``, ``buckets.Signed``,
``http.errors.Error``): plain dicts at runtime, their keys checked by mypy. Their schemas
here are pydantic's, so a field added to a model is in the views' answers and in this
document at once. Only the paths and operations are written here. An answer may carry
fields a later version adds: clients ignore the ones they do not know. The suite checks
the document with an OpenAPI validator, checks that the service answers exactly these
schemas, and fuzzes the running service against it (schemathesis).
"""

from __future__ import annotations

from functools import cache
from typing import Any

from pydantic import TypeAdapter

from o41 import __version__
from o41.core.usage import DEFAULT_WINDOW, WINDOWS
from o41.webhook.collections.answers import CollectionArgs, CollectionOut, CollectionsUsage
from o41.webhook.directories.answers import (
    DirectoryBeginOut,
    DirectoryCommitOut,
    FileReadOut,
    FilesOut,
)
from o41.webhook.directories.write import DirectoryBeginIn, DirectoryCommitIn
from o41.webhook.health import Health
from o41.webhook.http.errors import Error
from o41.webhook.usage.answers import UsageOut, UsageRecordsOut
from o41.webhook.usage.page import SignInForm
from o41.webhook.versions.answers import (
    ArtifactsOut,
    ResolvedOut,
    TagDeleted,
    TagMoved,
    TagsOut,
    VersionsOut,
)
from o41.webhook.versions.tags import TagIn
from o41.webhook.writes.answers import (
    BeginOut,
    CommitOut,
    DirectoryReadOut,
    PartsOut,
    ProgressOut,
    ReadOut,
)
from o41.webhook.writes.bodies import BeginIn, CommitIn, PartsIn

REF = "#/components/schemas/{model}"

#: Every body and answer of the document, a component schema each (and the ones they use).
MODELS: tuple[Any, ...] = (
    BeginIn,
    CommitIn,
    PartsIn,
    TagIn,
    DirectoryBeginIn,
    DirectoryCommitIn,
    CollectionArgs,
    SignInForm,
    Error,
    BeginOut,
    ProgressOut,
    PartsOut,
    CommitOut,
    ReadOut,
    DirectoryReadOut,
    DirectoryBeginOut,
    DirectoryCommitOut,
    FilesOut,
    FileReadOut,
    VersionsOut,
    ArtifactsOut,
    TagsOut,
    TagMoved,
    TagDeleted,
    ResolvedOut,
    UsageOut,
    UsageRecordsOut,
    CollectionOut,
    CollectionsUsage,
    Health,
)


def schemas(models: tuple[Any, ...] = MODELS) -> dict[str, Any]:
    """The component schemas of ``models`` (pydantic's JSON schemas, named by the models'
    names), and of every model they use."""
    _, defs = TypeAdapter.json_schemas(
        [(m, "validation", TypeAdapter(m)) for m in models], ref_template=REF
    )
    found: dict[str, Any] = defs["$defs"]
    return found


COLLECTION_KINDS = ("dict", "set", "registry", "counter", "queue", "barrier", "lock")
ERRORS = (400, 401, 403, 404, 405, 409, 413, 415, 422, 429, 503)
HTML_ANSWERS = (
    (200, "the page"),
    (400, "a wrong window"),
    (401, "the sign-in form: no token, or one not accepted"),
    (403, "the namespace may not use the organization, or a form from elsewhere"),
    (404, "no such organization"),
    (405, "a wrong method"),
    (503, "the state store is unavailable"),
)


def _ref(model: Any) -> dict[str, str]:
    return {"$ref": REF.format(model=model.__name__)}


def _either(*models: Any) -> dict[str, Any]:
    return {"anyOf": [_ref(m) for m in models]}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _body(model: Any) -> dict[str, Any]:
    return {"required": True, "content": {"application/json": {"schema": _ref(model)}}}


def _refused() -> dict[str, Any]:
    return _json(_ref(Error), "refused: the body says what was wrong and what to do")


def _answers(code: int, schema: Any, description: str) -> dict[str, Any]:
    """``schema``: a model, or a schema (``_either``)."""
    answer = schema if isinstance(schema, dict) else _ref(schema)
    return {str(code): _json(answer, description), **{str(c): _refused() for c in ERRORS}}


def _path(*names: str) -> list[dict[str, Any]]:
    return [
        {"name": n, "in": "path", "required": True, "schema": {"type": "string", "minLength": 1}}
        for n in names
    ]


#: ``?again=true``: a download signed again for a read begun, not counted twice.
AGAIN: dict[str, Any] = {
    "name": "again",
    "in": "query",
    "required": False,
    "description": "true: the download of a read the client began, signed again (its URL "
    "expired, or the rest of a read that stopped); not counted again when this replica "
    "counted that read within twice the URL's life",
    "schema": {"enum": ["true", "false"], "default": "false"},
}


def _query(*names: str, required: bool = False) -> list[dict[str, Any]]:
    return [
        {"name": n, "in": "query", "required": required, "schema": {"type": "string"}}
        for n in names
    ]


def _page() -> list[dict[str, Any]]:
    return [
        {
            "name": "limit",
            "in": "query",
            "required": False,
            "schema": {"type": "integer", "minimum": 1, "maximum": 1000},
        },
        {
            "name": "cursor",
            "in": "query",
            "required": False,
            "schema": {"type": "string", "description": "The 'next' of the previous page."},
        },
    ]


@cache
def document() -> dict[str, Any]:
    plain: list[dict[str, list[str]]] = []  # no authentication
    return {
        "openapi": "3.1.0",
        "info": {"title": "O41 Artifacts placement service", "version": __version__},
        "components": {
            "securitySchemes": {
                "pod": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "The pod's ServiceAccount token (checked by TokenReview).",
                }
            },
            "schemas": schemas(),
        },
        "security": [{"pod": []}],
        "paths": {
            "/v1/writes": {
                "post": {
                    "operationId": "begin",
                    "summary": "Begin a write: choose the location, get pre-signed uploads",
                    "requestBody": _body(BeginIn),
                    "responses": _answers(201, BeginOut, "the version and its uploads"),
                }
            },
            "/v1/writes/{version}": {
                "get": {
                    "operationId": "progress",
                    "summary": "A pending write and the parts its bucket holds already "
                    "(to resume it); another namespace's write is a 404",
                    "parameters": _path("version"),
                    "responses": _answers(200, ProgressOut, "the write and its parts"),
                }
            },
            "/v1/writes/{version}/parts": {
                "post": {
                    "operationId": "signParts",
                    "summary": "Sign the uploads of some parts of a pending multipart "
                    "write again (a resume, or a long write whose URLs expire)",
                    "parameters": _path("version"),
                    "requestBody": _body(PartsIn),
                    "responses": _answers(200, PartsOut, "fresh upload requests"),
                }
            },
            "/v1/writes/{version}/commit": {
                "post": {
                    "operationId": "commit",
                    "summary": "Commit a write once the bucket holds it",
                    "parameters": _path("version"),
                    "requestBody": _body(CommitIn),
                    "responses": _answers(200, CommitOut, "committed"),
                }
            },
            "/v1/organizations/{organization}/artifacts": {
                "get": {
                    "operationId": "artifacts",
                    "summary": "An organization's artifacts, by name, a page at a time",
                    "parameters": _path("organization") + _page(),
                    "responses": _answers(200, ArtifactsOut, "a page of artifacts"),
                }
            },
            "/v1/organizations/{organization}/artifacts/{artifact}/versions": {
                "get": {
                    "operationId": "versions",
                    "summary": "An artifact's versions, newest first, a page at a time",
                    "parameters": _path("organization", "artifact") + _page(),
                    "responses": _answers(200, VersionsOut, "a page of versions"),
                }
            },
            "/v1/organizations/{organization}/artifacts/{artifact}/tags": {
                "get": {
                    "operationId": "tags",
                    "summary": "An artifact's tags and the versions they point at",
                    "parameters": _path("organization", "artifact"),
                    "responses": _answers(200, TagsOut, "the tags"),
                }
            },
            "/v1/organizations/{organization}/artifacts/{artifact}/tags/{tag}": {
                "get": {
                    "operationId": "resolve",
                    "summary": "The version a tag, 'latest' or an id names (no download)",
                    "parameters": _path("organization", "artifact", "tag"),
                    "responses": _answers(200, ResolvedOut, "the version it names"),
                },
                "put": {
                    "operationId": "moveTag",
                    "summary": "Point a tag at a version; with 'expected', only if it points "
                    "there now (null: only if it does not exist); 409 names its target; 404 "
                    "when the version does not exist or retention is deleting it",
                    "parameters": _path("organization", "artifact", "tag"),
                    "requestBody": _body(TagIn),
                    "responses": _answers(200, TagMoved, "moved"),
                },
                "delete": {
                    "operationId": "deleteTag",
                    "summary": "Delete a tag; with 'expected', only if it points there",
                    "parameters": _path("organization", "artifact", "tag") + _query("expected"),
                    "responses": _answers(200, TagDeleted, "deleted"),
                },
            },
            "/v1/organizations/{organization}/artifacts/{artifact}/versions/{version}": {
                "get": {
                    "operationId": "read",
                    "summary": "Read a version (an id, 'latest' or a tag): where it lives, "
                    "its locality, a download; the answer names the version it read",
                    "parameters": _path("organization", "artifact", "version")
                    + _query("cloud", "region", "source")
                    + [AGAIN],
                    "responses": _answers(
                        200,
                        _either(ReadOut, DirectoryReadOut),
                        "the version: a file's, with its download, or a directory's",
                    ),
                }
            },
            "/v1/directories": {
                "post": {
                    "operationId": "beginDirectory",
                    "summary": "Begin a directory version: one location for all its files, "
                    "one pre-signed PUT per file (each under the version's prefix)",
                    "requestBody": _body(DirectoryBeginIn),
                    "responses": _answers(201, DirectoryBeginOut, "the version and its uploads"),
                }
            },
            "/v1/directories/{version}/commit": {
                "post": {
                    "operationId": "commitDirectory",
                    "summary": "Commit a directory version once the bucket holds every file: "
                    "the version and its manifest appear together",
                    "parameters": _path("version"),
                    "requestBody": _body(DirectoryCommitIn),
                    "responses": _answers(200, DirectoryCommitOut, "committed"),
                }
            },
            "/v1/organizations/{organization}/artifacts/{artifact}/versions/{version}/files": {
                "get": {
                    "operationId": "files",
                    "summary": "A directory version's files (path, size, MD5); with "
                    "download=true, a signed download of each",
                    "parameters": _path("organization", "artifact", "version")
                    + _query("cloud", "region", "source")
                    + [
                        {
                            "name": "download",
                            "in": "query",
                            "required": False,
                            "schema": {"enum": ["true", "false"], "default": "false"},
                        }
                    ],
                    "responses": _answers(200, FilesOut, "the files"),
                }
            },
            "/v1/organizations/{organization}/artifacts/{artifact}/versions/{version}/files/"
            "{path}": {
                "get": {
                    "operationId": "readFile",
                    "summary": "Read one file of a directory version: where it lives, a download",
                    "parameters": _path("organization", "artifact", "version", "path")
                    + _query("cloud", "region", "source")
                    + [AGAIN],
                    "responses": _answers(200, FileReadOut, "the file"),
                }
            },
            "/v1/usage": {
                "get": {
                    "operationId": "usage",
                    "summary": "Usage of one organization: both answers of the window, or a "
                    "page of its raw counter records (records=true)",
                    "parameters": [
                        *_query("organization", required=True),
                        {
                            "name": "window",
                            "in": "query",
                            "required": False,
                            "schema": {"enum": list(WINDOWS), "default": DEFAULT_WINDOW},
                        },
                        {
                            "name": "records",
                            "in": "query",
                            "required": False,
                            "description": "true: a page of the raw records, not the answers",
                            "schema": {"enum": ["true", "false"], "default": "false"},
                        },
                        {
                            "name": "limit",
                            "in": "query",
                            "required": False,
                            "description": "Raw records per page (records=true)",
                            "schema": {
                                "type": "integer",
                                "minimum": 1,
                                "maximum": 5000,
                                "default": 1000,
                            },
                        },
                        {
                            "name": "cursor",
                            "in": "query",
                            "required": False,
                            "description": "The previous page's next (records=true)",
                            "schema": {"type": "string"},
                        },
                    ],
                    "responses": _answers(
                        200,
                        _either(UsageOut, UsageRecordsOut),
                        "the usage of the window, or a page of its records",
                    ),
                }
            },
            "/v1/collections/{compute}/{kind}/{name}/{op}": {
                "post": {
                    "operationId": "collection",
                    "summary": "One operation on a distributed collection of the caller's "
                    "namespace (the same operations go over the WebSocket at /v1/collections)",
                    "parameters": [
                        *_path("compute"),
                        {
                            "name": "kind",
                            "in": "path",
                            "required": True,
                            "schema": {"enum": list(COLLECTION_KINDS)},
                        },
                        *_path("name", "op"),
                    ],
                    "requestBody": {
                        "required": False,
                        "content": {"application/json": {"schema": _ref(CollectionArgs)}},
                    },
                    "responses": _answers(200, CollectionOut, "the operation's result"),
                }
            },
            "/v1/collections/usage": {
                "get": {
                    "operationId": "collectionsUsage",
                    "summary": "The bytes and entries the caller's namespace keeps in "
                    "collections, and its limits",
                    "responses": _answers(200, CollectionsUsage, "the namespace's usage"),
                }
            },
            "/v1/collections": {
                "get": {
                    "operationId": "collectionsSocket",
                    "summary": "The collections' WebSocket: send 'Upgrade: websocket', then one "
                    "JSON text message per operation (see docs/collections.md)",
                    "responses": {
                        "101": {"description": "switching to the WebSocket"},
                        **{str(c): _refused() for c in ERRORS},
                    },
                }
            },
            "/usage": {
                "get": {
                    "operationId": "usagePage",
                    "summary": "The usage page (HTML): the sign-in form, the organization "
                    "list, or one organization's page",
                    "security": plain,
                    "parameters": _query("organization", "window"),
                    "responses": {
                        str(c): {"description": why, "content": {"text/html": {}}}
                        for c, why in HTML_ANSWERS
                    },
                },
                "post": {
                    "operationId": "usageSignIn",
                    "summary": "Sign in to the usage page with a pasted token (a form)",
                    "security": plain,
                    "requestBody": {
                        "required": True,
                        "content": {
                            "application/x-www-form-urlencoded": {"schema": _ref(SignInForm)}
                        },
                    },
                    "responses": {
                        "303": {"description": "signed in (or out): on to the page"},
                        **{
                            str(c): {"description": why, "content": {"text/html": {}}}
                            for c, why in HTML_ANSWERS
                            if c != 200
                        },
                    },
                },
            },
            "/healthz": {
                "get": {
                    "operationId": "healthz",
                    "security": plain,
                    "responses": {"200": _json(_ref(Health), "up")},
                }
            },
            "/readyz": {
                "get": {
                    "operationId": "readyz",
                    "security": plain,
                    "responses": {
                        "200": _json(_ref(Health), "ready"),
                        "503": _json(_ref(Error), "the view of the cluster is still loading"),
                    },
                }
            },
            "/openapi.json": {
                "get": {
                    "operationId": "openapi",
                    "security": plain,
                    "responses": {"200": _json({"type": "object"}, "this document")},
                }
            },
            "/metrics": {
                "get": {
                    "operationId": "metrics",
                    "summary": "Prometheus metrics; they name organizations, so keep the port "
                    "behind the chart's NetworkPolicy",
                    "security": plain,
                    "responses": {
                        "200": {
                            "description": "the Prometheus text format",
                            "content": {"text/plain": {"schema": {"type": "string"}}},
                        }
                    },
                }
            },
        },
    }
