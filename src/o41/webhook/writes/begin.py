"""Begin a write: choose its location by the rules of ``o41.core.placement``, sign its
uploads, and leave its pending record. A directory's begin (``o41.webhook.directories``)
places and counts the same way."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from o41 import logs
from o41.core.placement import Placement, place_write
from o41.core.places import Place
from o41.core.versions import check_metadata, check_tag
from o41.core.writes import UploadPlan, upload_plan
from o41.kube.locations import Location
from o41.webhook.buckets import UPLOAD_EXPIRES, OpenBucket, bucket_for, signed
from o41.webhook.cluster.scope import organization_for
from o41.webhook.cluster.view import VIEW
from o41.webhook.identity.auth import Caller
from o41.webhook.records import Pending, new_version
from o41.webhook.usage.counters import USAGE
from o41.webhook.writes.answers import BeginOut, PlacedOut, Upload
from o41.webhook.writes.bodies import BeginIn, PlaceIn
from o41.webhook.writes.pending import put_pending


async def upload(
    opened: OpenBucket, location: str, key: str, plan: UploadPlan, body: BeginIn
) -> tuple[Upload, str | None]:
    """The signed upload requests of ``plan``, and the multipart upload's id."""
    bucket, part_size = opened.bucket, plan.part_size
    if part_size is None:  # one PUT
        single = await opened.sign(
            location, lambda: bucket.presign_put(key, expires=UPLOAD_EXPIRES, size=body.size)
        )
        return {"single": signed(single)}, None
    started = await opened.call(
        location,
        lambda: bucket.start_multipart(
            key, parts=plan.parts, expires=UPLOAD_EXPIRES, crc32=body.crc32
        ),
    )
    parts = [signed(p) for p in started.parts]
    return {"multipart": {"partSize": part_size, "parts": parts}}, started.upload_id


@dataclass(frozen=True, slots=True)
class Placed:
    """Where a new version goes: the caller's organization, the writer's place, the rule
    that chose the location, and the location."""

    organization: str
    place: Place
    chosen: Placement
    location: Location

    def pending(self, namespace: str, artifact: str, version: str, **more: Any) -> Pending:
        """The pending write of ``version`` placed here (``more``: its upload's fields)."""
        return Pending(
            organization=self.organization,
            artifact=artifact,
            version=version,
            namespace=namespace,
            location=self.location.name,
            rule=str(self.chosen.rule),
            cloud=self.place.cloud,
            region=self.place.region,
            source=self.place.source,
            began=time.time(),
            **more,
        )

    def answer(self, version: str) -> PlacedOut:
        """What every begin answers first: the version, where it goes and why."""
        return {
            "version": version,
            "location": self.location.name,
            "cloud": self.location.cloud,
            "region": self.location.region,
            "rule": self.chosen.rule,
            "warning": self.chosen.warning,
        }


def place_new(
    app: web.Application, caller: Caller, organization: str, place_in: PlaceIn, exclude: list[str]
) -> Placed:
    """The location of a new version, by the rules of ``o41.core.placement``."""
    org = organization_for(app, organization, caller)
    view, place = app[VIEW], place_in.place
    chosen = place_write(
        place,
        [loc.facts for loc in view.locations_of(org.name)],
        fallback=org.fallback,
        cloud_defaults=org.cloud_defaults,
        exclude=exclude,
        organization=f"organization {org.name!r}",
    )
    location = view.locations[chosen.location]
    logs.known(organization=org.name, location=location.name)
    return Placed(org.name, place, chosen, location)


def count_begin(app: web.Application, placed: Placed) -> None:
    chosen = placed.chosen
    app[USAGE].add(
        placed.organization,
        "begin",
        {**placed.place.as_json(), "rule": str(chosen.rule), "location": placed.location.name},
        begins=1,
        warnings=1 if chosen.warning else 0,
    )


async def begin(app: web.Application, caller: Caller, body: BeginIn) -> BeginOut:
    """Choose the location for a new version and hand out pre-signed upload requests."""
    plan = upload_plan(body.size, body.part_size, body.crc32)
    metadata = check_metadata(body.metadata)
    tag = None if body.tag is None else check_tag(body.tag)
    placed = place_new(app, caller, body.organization, body.place, body.exclude)
    location = placed.location
    version = new_version()
    key = f"{body.artifact}/{version}"
    opened = await bucket_for(app, location)
    requests, upload_id = await upload(opened, location.name, key, plan, body)
    pending = placed.pending(
        caller.tenant,
        body.artifact,
        version,
        key=key,
        size=body.size,
        md5=body.md5,
        upload_id=upload_id,
        parts=plan.parts,
        crc32=body.crc32,
        metadata=metadata,
        tag=tag,
        part_size=plan.part_size,
    )
    await put_pending(app, version, pending.dump())
    count_begin(app, placed)
    return {**placed.answer(version), "upload": requests, "expiresIn": UPLOAD_EXPIRES}
