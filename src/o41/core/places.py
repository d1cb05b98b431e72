"""A place: the cloud and region a writer or reader runs in, and how that was found."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Literal

Source = Literal["env", "skypilot", "metadata", "none"]
SOURCES: tuple[Source, ...] = ("env", "skypilot", "metadata", "none")


class Locality(enum.StrEnum):
    """How far a read travels from the reader's place to the location holding the version."""

    LOCAL = "local"
    CROSS_REGION = "cross-region"
    CROSS_CLOUD = "cross-cloud"


@dataclass(frozen=True, slots=True)
class Place:
    """Where a process runs. ``cloud`` and ``region`` are None when unknown.

    Clouds are lower-case (``aws``, ``gcp``, ``azure``, ``nebius``...); regions are the
    cloud's own names, the same strings a Location is tagged with.
    """

    cloud: str | None
    region: str | None
    source: Source

    def __post_init__(self) -> None:
        if self.region is not None and self.cloud is None:
            raise ValueError("a place with a region must name its cloud")
        if self.cloud is not None and self.cloud != self.cloud.lower():
            raise ValueError(f"cloud must be lower-case, got {self.cloud!r}")
        if self.source not in SOURCES:
            raise ValueError(f"source must be one of {', '.join(SOURCES)}, got {self.source!r}")

    @classmethod
    def unknown(cls) -> Place:
        return cls(cloud=None, region=None, source="none")

    def as_json(self) -> dict[str, str | None]:
        return {"cloud": self.cloud, "region": self.region, "source": self.source}


def locality(reader: Place, cloud: str, region: str) -> Locality:
    """How far a read from ``reader`` to a location in ``cloud``/``region`` travels.

    An unknown reader cloud counts as cross-cloud: we cannot show the bytes stayed home,
    and the usage page should rather over-report egress than hide it.
    """
    if reader.cloud != cloud:
        return Locality.CROSS_CLOUD
    if reader.region != region:
        return Locality.CROSS_REGION
    return Locality.LOCAL
