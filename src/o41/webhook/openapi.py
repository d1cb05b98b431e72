"""The service's OpenAPI document: every route, its bodies and its answers.

Request schemas come from the very models the views validate with; answers from the
models below, which exist for this document only. The suite checks the document with an
OpenAPI validator and fuzzes the running service against it (schemathesis), so a view
whose answer drifts from its schema fails a test.
"""

from __future__ import annotations

from functools import cache
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.json_schema import models_json_schema

from o41 import __version__
from o41.core.usage import DEFAULT_WINDOW, WINDOWS
from o41.webhook.directories.write import DirectoryBeginIn, DirectoryCommitIn
from o41.webhook.versions.tags import TagIn
from o41.webhook.writes.bodies import BeginIn, CommitIn, PartsIn

REF = "#/components/schemas/{model}"


class Out(BaseModel):
    """An answer: more fields may come in later versions, so clients ignore the unknown."""

    model_config = ConfigDict(extra="allow")


class Error(Out):
    error: str = Field(description="What was wrong and what to do.")
    request_id: str | None = Field(
        default=None,
        alias="requestId",
        description="The request's id, as in its X-Request-Id header and its log lines.",
    )


class Signed(Out):
    """A pre-signed request: send it as it is, with these headers."""

    method: str
    url: str
    headers: dict[str, str]


class Multipart(Out):
    part_size: int = Field(alias="partSize")
    parts: list[Signed]


class Upload(Out):
    """Exactly one of ``single`` (one PUT) or ``multipart`` (one PUT per part)."""

    single: Signed | None = None
    multipart: Multipart | None = None


class BeginOut(Out):
    version: str
    location: str
    cloud: str
    region: str
    rule: Literal["region", "cloud", "fallback"]
    warning: str | None
    upload: Upload
    expires_in: int = Field(alias="expiresIn", description="Seconds the upload URLs last.")


class PresentPart(Out):
    number: int
    size: int
    etag: str | None = Field(description="As the part's PUT answered it; null on Azure.")
    crc32: str | None = Field(description="The part's CRC32 where the bucket checked one.")


class ProgressOut(Out):
    """A pending write and the parts its bucket holds: a resume sends only the others."""

    version: str
    organization: str
    artifact: str
    location: str
    rule: str
    size: int | None
    multipart: bool
    part_size: int | None = Field(alias="partSize")
    parts: int = Field(description="How many parts the write has in all.")
    crc32: list[str] | None = Field(
        description="Each part's CRC32 as its writer recorded it at begin (null: none sent); "
        "a resume refuses a file whose parts differ."
    )
    present: list[PresentPart]
    expires_in: int = Field(alias="expiresIn", description="Seconds left to commit it.")


class SignedPart(Signed):
    number: int


class PartsOut(Out):
    version: str
    parts: list[SignedPart]
    expires_in: int = Field(alias="expiresIn", description="Seconds the upload URLs last.")


class CommitOut(Out):
    version: str
    location: str
    size: int
    md5: str | None
    tag: str | None = Field(description="The tag moved to this version, if any.")


class ReadOut(Out):
    version: str
    location: str
    cloud: str
    region: str
    locality: Literal["local", "cross-region", "cross-cloud"]
    size: int
    md5: str | None
    part_size: int | None = Field(
        None,
        alias="partSize",
        description="A multipart version's part size, when its parts' CRC32s are recorded.",
    )
    crc32: list[str] | None = Field(
        None,
        description="Each part's CRC32 (base64, big-endian) as written: a reader checks "
        "every part it downloads whole. Absent for single-PUT versions (use md5).",
    )
    download: Signed | None = Field(
        description="Null for a directory version: read its files (the files route)."
    )
    requested: str = Field(description="The reference asked for: an id, 'latest' or a tag.")
    tag: str | None = Field(description="The tag it resolved, when it was one.")
    committed: float
    metadata: dict[str, Any]
    files: int | None = Field(None, description="A directory version's number of files.")


class SignedFile(Signed):
    path: str


class DirectoryBeginOut(Out):
    version: str
    location: str
    cloud: str
    region: str
    rule: Literal["region", "cloud", "fallback"]
    warning: str | None
    files: list[SignedFile] = Field(description="One PUT per file, in the manifest's order.")
    expires_in: int = Field(alias="expiresIn", description="Seconds the upload URLs last.")


class DirectoryCommitOut(CommitOut):
    files: int


class FileOut(Out):
    path: str
    size: int
    md5: str
    download: Signed | None = Field(None, description="With download=true.")


class FilesOut(Out):
    """A directory version's files, sorted by path, and where they live."""

    version: str
    location: str
    cloud: str
    region: str
    locality: Literal["local", "cross-region", "cross-cloud"]
    size: int = Field(description="Of all its files.")
    requested: str
    tag: str | None
    committed: float
    metadata: dict[str, Any]
    files: list[FileOut]


class FileReadOut(ReadOut):
    path: str


class Writer(Out):
    cloud: str | None
    region: str | None
    source: str


class VersionOut(Out):
    version: str
    location: str
    size: int
    md5: str | None
    committed: float = Field(description="Seconds since the epoch.")
    writer: Writer
    rule: str
    metadata: dict[str, Any]
    files: int | None = Field(None, description="A directory version's number of files.")


class VersionsOut(Out):
    """One page, newest first; ``next`` is the cursor of the following page (null: last)."""

    organization: str
    artifact: str
    versions: list[VersionOut]
    next: str | None
    keep_versions: int | None = Field(
        alias="keepVersions",
        description="how many of the newest versions the organization's retention rule for "
        "this artifact keeps (tagged ones are kept too); null: no rule, every version is kept",
    )


class ArtifactOut(Out):
    artifact: str
    last_version: str = Field(alias="lastVersion")
    last_committed: float = Field(alias="lastCommitted")


class ArtifactsOut(Out):
    organization: str
    artifacts: list[ArtifactOut]
    next: str | None


class TagOut(Out):
    artifact: str
    tag: str
    version: str
    set: float


class TagMoved(TagOut):
    previous: str | None


class TagsOut(Out):
    organization: str
    artifact: str
    tags: list[TagOut]


class TagDeleted(Out):
    artifact: str
    tag: str
    deleted: str


class ResolvedOut(VersionOut):
    requested: str
    tag: str | None


class UsageRecord(Out):
    """A stored counter record: of one hour (``hour``) or one day (``day``), UTC."""

    kind: str
    hour: str | None = Field(None, description="YYYY-MM-DDTHH, on an hourly record.")
    day: str | None = Field(None, description="YYYY-MM-DD, on a daily record.")
    dims: dict[str, str]
    counts: dict[str, int]


class UsageOut(Out):
    """Both answers of the usage page for the window (``summary``, ``saving``, ``writes``,
    ``reads``, ``prices``); with ``records=true``, a page of the window's raw counter
    records instead (``records``, ``next``)."""

    organization: str
    window: Literal["24h", "7d", "30d"]
    from_: str = Field(alias="from", description="The window's first hour, YYYY-MM-DDTHH.")
    to: str = Field(description="The window's last hour (this one).")
    summary: str | None = Field(None, description="Where a new location pays, in words.")
    saving: dict[str, Any] | None = Field(
        None, description="The region the summary names, what it keeps and saves, net."
    )
    writes: dict[str, Any] | None = None
    reads: dict[str, Any] | None = None
    cleanup: list[dict[str, Any]] | None = Field(
        None,
        description="Per location: the uploads of expired writes (abandoned, aborted, "
        "notAborted: uploads and the bytes their writes declared) and the versions "
        "retention deleted (versions, bytes).",
    )
    prices: dict[str, Any] | None = None
    records: list[UsageRecord] | None = Field(
        None, description="With records=true: a page of the window's raw records."
    )
    next: str | None = Field(
        None, description="With records=true: the cursor of the next page; null on the last."
    )


class CollectionOut(Out):
    """The operation's result: its fields depend on the operation (see docs/collections.md)."""


class CollectionsUsage(Out):
    """The caller's namespace's collections against its limits."""

    namespace: str
    bytes: int
    entries: int
    limits: dict[str, int]


class Health(Out):
    status: str


_MODELS: list[type[BaseModel]] = [
    BeginIn,
    CommitIn,
    PartsIn,
    TagIn,
    DirectoryBeginIn,
    DirectoryCommitIn,
    Error,
    BeginOut,
    ProgressOut,
    PartsOut,
    CommitOut,
    ReadOut,
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
    CollectionOut,
    CollectionsUsage,
    Health,
]

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


def _ref(model: type[BaseModel]) -> dict[str, str]:
    return {"$ref": REF.format(model=model.__name__)}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _body(model: type[BaseModel]) -> dict[str, Any]:
    return {"required": True, "content": {"application/json": {"schema": _ref(model)}}}


def _refused() -> dict[str, Any]:
    return _json(_ref(Error), "refused: the body says what was wrong and what to do")


def _answers(code: int, model: type[BaseModel], description: str) -> dict[str, Any]:
    return {str(code): _json(_ref(model), description), **{str(c): _refused() for c in ERRORS}}


def _path(*names: str) -> list[dict[str, Any]]:
    return [
        {"name": n, "in": "path", "required": True, "schema": {"type": "string", "minLength": 1}}
        for n in names
    ]


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


def _collection_args() -> dict[str, Any]:
    """The union of every operation's arguments; which apply depends on the operation."""
    return {
        "type": "object",
        "properties": {
            "key": {"type": "string", "description": "A key in its canonical text."},
            "value": {"type": "string", "contentEncoding": "base64"},
            "consistency": {"enum": ["strong", "eventual"]},
            "n": {"type": "integer", "description": "A counter's increment."},
            "parties": {"type": "integer", "minimum": 1},
            "participant": {"type": "string"},
            "owner": {"type": "string"},
            "ttl": {"type": "integer", "minimum": 1},
            "timeout": {"type": "number", "minimum": 0},
            "final": {"type": "boolean"},
        },
    }


@cache
def document() -> dict[str, Any]:
    _, defs = models_json_schema(
        [(m, "validation") for m in _MODELS], ref_template=REF, by_alias=True
    )
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
            "schemas": defs["$defs"],
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
                    + _query("cloud", "region", "source"),
                    "responses": _answers(200, ReadOut, "the version"),
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
                    + _query("cloud", "region", "source"),
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
                    "responses": _answers(200, UsageOut, "the usage of the window"),
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
                        "content": {"application/json": {"schema": _collection_args()}},
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
                            "application/x-www-form-urlencoded": {
                                "schema": {
                                    "type": "object",
                                    "properties": {
                                        k: {"type": "string"}
                                        for k in ("token", "organization", "window", "signout")
                                    },
                                }
                            }
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
