"""Locations for the placement service run in-process (``make_app`` on the embedded store,
as tests/placement/test_writes.py, bench/capacity.py and bench/retention.py run it): one
organization, its Locations as the operator would have recorded them, ready, each on a
bucket of the stand-in (``testbed.standin_bucket``), put straight into the service's
view, and the keys the service opens their buckets with.
"""

from __future__ import annotations

from collections.abc import Mapping

from o41.kube.location_record import LocationRecord
from o41.kube.locations import Location, read_location

ORG = "ml"
KEYS = {"accessKeyId": "id", "secretAccessKey": "secret"}


class Keys:
    async def credentials(self, location: Location) -> Mapping[str, str] | None:
        return KEYS


def location(name: str, cloud: str, region: str, n: int) -> Location:
    created = f"2026-01-0{n}T00:00:00Z"
    obj = {
        "metadata": {"name": name, "uid": f"uid-{name}", "creationTimestamp": created},
        "spec": {
            "organization": ORG,
            "cloud": cloud,
            "region": region,
            "bucket": f"bucket-{name}",
            "backend": {"s3": {}},
        },
    }
    return read_location(obj, LocationRecord(f"uid-{name}", name, ready=True, ready_since=created))
