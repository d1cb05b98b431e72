"""The write path's request bodies, and the reader's place in a read's query."""

from __future__ import annotations

from typing import Any, Literal

from aiohttp import web
from pydantic import Field, ValidationError

from o41.core.parts import MAX_PARTS
from o41.core.places import Place
from o41.core.versions import MAX_METADATA_BYTES, MAX_METADATA_KEYS
from o41.core.writes import normal_place
from o41.kube.api import NAME_PATTERN
from o41.webhook.cluster.scope import ARTIFACT_PATTERN
from o41.webhook.http.bodies import Model
from o41.webhook.http.errors import problem

MAX_SIZE = 5 * 1024**4  # 5 TiB, S3's object limit


class PlaceIn(Model):
    cloud: str | None = Field(default=None, pattern=r"^[a-z][a-z0-9-]{0,31}$")
    region: str | None = Field(default=None, pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")
    source: Literal["env", "skypilot", "metadata", "none"]

    @property
    def place(self) -> Place:
        return normal_place(self.cloud, self.region, self.source)


class BeginIn(Model):
    organization: str = Field(pattern=NAME_PATTERN, max_length=253)
    artifact: str = Field(pattern=ARTIFACT_PATTERN)
    place: PlaceIn
    size: int | None = Field(default=None, ge=0, le=MAX_SIZE)
    md5: str | None = Field(default=None, pattern=r"^[0-9a-f]{32}$")
    exclude: list[str] = Field(default_factory=list, max_length=100)
    part_size: int | None = Field(default=None, alias="partSize", ge=1)
    crc32: list[str] | None = Field(default=None, max_length=MAX_PARTS)
    metadata: dict[str, Any] | None = Field(
        default=None,
        description=f"The user's JSON key/values (step, epoch, metrics): at most "
        f"{MAX_METADATA_KEYS} keys, {MAX_METADATA_BYTES} bytes as JSON",
    )
    tag: str | None = Field(
        default=None, max_length=200, description="A tag moved to this version at commit"
    )


class PartsIn(Model):
    parts: list[int] = Field(
        min_length=1,
        max_length=MAX_PARTS,
        description="The numbers (1-based) of the parts to sign again",
    )


class CommitIn(Model):
    etags: list[str] = Field(default_factory=list, max_length=MAX_PARTS)
    md5: str | None = Field(default=None, pattern=r"^[0-9a-f]{32}$")
    metadata: dict[str, Any] | None = Field(
        default=None, description="Merged over the metadata given at begin"
    )
    tag: str | None = Field(
        default=None, max_length=200, description="A tag moved to this version (over begin's)"
    )


def reader_place(request: web.Request) -> PlaceIn:
    """The reader's place from the query (``?cloud=&region=&source=``)."""
    q = request.query
    given = {"cloud": q.get("cloud") or None, "region": q.get("region") or None}
    try:
        return PlaceIn.model_validate({**given, "source": q.get("source", "none")})
    except ValidationError as e:
        message = e.errors(include_url=False)[0]["msg"]
        raise problem(400, f"invalid place in the query: {message}") from None


def again_of(request: web.Request) -> bool:
    """``?again=true``: a download signed again for a read the client began (its URL
    expired, or the rest of a read that stopped), which its first signing counted."""
    flag = request.query.get("again", "false")
    if flag not in ("true", "false"):
        raise problem(400, f"again must be true or false, not {flag[:20]!r}")
    return flag == "true"
