"""The placement service's records in the store survive a round trip, and replicas of two
versions can read each other's records during a rolling upgrade."""

from __future__ import annotations

import json

from o41.webhook.records import Pending, Version, new_version

PENDING = Pending(
    organization="ml",
    artifact="model",
    version=new_version(),
    namespace="team-a",
    location="aws-east",
    key="model/v",
    rule="region",
    cloud="aws",
    region="us-east-1",
    source="env",
    size=1024,
    md5=None,
    upload_id="up-1",
    parts=2,
    began=1.5,
    crc32=["AAAAAA==", "AQIDBA=="],
)


def test_records_round_trip() -> None:
    assert Pending.load(PENDING.dump()) == PENDING
    version = Version(
        organization="ml", artifact="model", version="v", location="aws-east", key="model/v",
        size=1024, md5="0" * 32, rule="region", cloud="aws", region="us-east-1",
        source="env", committed=2.5,
    )  # fmt: skip
    assert Version.load(version.dump()) == version


def test_a_record_of_an_older_replica_loads_without_the_newer_fields() -> None:
    older = json.loads(PENDING.dump())
    del older["crc32"]
    loaded = Pending.load(json.dumps(older).encode())
    assert loaded.crc32 is None and loaded.upload_id == "up-1"


def test_a_record_of_a_newer_replica_loads_without_its_extra_fields() -> None:
    newer = {**json.loads(PENDING.dump()), "someFutureField": {"x": 1}}
    assert Pending.load(json.dumps(newer).encode()) == PENDING
