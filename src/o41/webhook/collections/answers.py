"""The collections' POST route's body and answers, and the namespace's usage: each one's
one description, made the document's schemas by ``o41.webhook.openapi``."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field
from typing_extensions import TypedDict


class CollectionArgs(TypedDict, total=False):
    """The union of every operation's arguments; which apply depends on the operation
    (docs/collections.md)."""

    key: Annotated[str, Field(description="A key in its canonical text.")]
    value: Annotated[str, Field(json_schema_extra={"contentEncoding": "base64"})]
    consistency: Literal["strong", "eventual"]
    n: Annotated[int, Field(description="A counter's increment.")]
    parties: Annotated[int, Field(ge=1)]
    participant: str
    owner: str
    ttl: Annotated[int, Field(ge=1)]
    timeout: Annotated[float, Field(ge=0)]
    final: bool
    operation: Annotated[
        str,
        Field(
            pattern="^[0-9a-f]{32}$",
            description=(
                "The operation's id (uuid4().hex), the same in every attempt: a repeat of "
                "a write that acted is answered its first answer (remembered 10-11 minutes)."
            ),
        ),
    ]


class CollectionOut(TypedDict, total=False):
    """The operation's result: its fields depend on the operation (see docs/collections.md)."""


class Counted(TypedDict):
    """The count alone: ``bytes`` and ``entries`` add this replica's writes since."""

    bytes: int
    entries: int
    secondsAgo: float


class CollectionsUsage(TypedDict):
    """The caller's namespace's collections against its limits."""

    namespace: str
    bytes: int
    entries: int
    counted: Counted
    limits: dict[str, float]
    accuracy: Annotated[str, Field(description="How exact bytes, entries and the limits are.")]
