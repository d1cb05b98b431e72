"""What the versions' routes answer (listings, tags, a reference resolved): each answer's
one description, built by the views and made the document's schemas by
``o41.webhook.openapi``."""

from __future__ import annotations

from typing import Annotated, Any, NotRequired

from pydantic import Field
from typing_extensions import TypedDict


class Writer(TypedDict):
    """The place its writer reported."""

    cloud: str | None
    region: str | None
    source: str


class VersionOut(TypedDict):
    version: str
    location: str
    size: int
    md5: str | None
    committed: Annotated[float, Field(description="Seconds since the epoch.")]
    writer: Writer
    rule: str
    metadata: dict[str, Any]
    files: NotRequired[Annotated[int, Field(description="A directory version's number of files.")]]


class VersionsOut(TypedDict):
    """One page, newest first; ``next`` is the cursor of the following page (null: last)."""

    organization: str
    artifact: str
    versions: list[VersionOut]
    next: str | None
    keepVersions: Annotated[
        int | None,
        Field(
            description="how many of the newest versions the organization's retention rule "
            "for this artifact keeps (tagged ones are kept too); null: no rule, every version "
            "is kept"
        ),
    ]


class ArtifactOut(TypedDict):
    artifact: str
    lastVersion: str
    lastCommitted: float


class ArtifactsOut(TypedDict):
    organization: str
    artifacts: list[ArtifactOut]
    next: str | None


class TagOut(TypedDict):
    artifact: str
    tag: str
    version: str
    set: float


class TagMoved(TagOut):
    previous: str | None


class TagsOut(TypedDict):
    organization: str
    artifact: str
    tags: list[TagOut]


class TagDeleted(TypedDict):
    artifact: str
    tag: str
    deleted: str


class ResolvedOut(VersionOut):
    requested: str
    tag: str | None
