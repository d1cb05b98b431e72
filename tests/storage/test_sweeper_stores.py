"""The sweeper against real parts: an expired write's multipart upload in versitygw is
listed (with its part) before and gone after (ListMultipartUploads); etcd's watch gives
a lease expiry's delete with the record it removed (``prev_kv``), as the embedded store
does in tests/placement/test_sweeper.py.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from o41.core.parts import PART_SIZE
from o41.state.etcd import EtcdStore
from o41.storage import BucketRef, bucket_name, open_bucket
from test_storage import offline as offline
from test_sweeper import PLACE, MiB, prev_kv_events, short_leases, until
from test_writes import serve
from testbed.etcd import EtcdCluster
from testbed.locations import ORG
from testbed.stores import VersityStore

__all__ = ["offline", "short_leases"]


@pytest.mark.stores
@pytest.mark.usefixtures("short_leases")
async def test_an_expired_writes_upload_is_gone_from_versitygw(
    s3: VersityStore, tmp_path: Path
) -> None:
    name = bucket_name("s3", "sweep", str(uuid.uuid4()))
    creds = {"accessKeyId": s3.access_key, "secretAccessKey": s3.secret_key}

    def ref(_: BucketRef) -> BucketRef:  # every location of the service: this one bucket
        return BucketRef("s3", name, "us-east-1", endpoint=s3.endpoint, credentials=creds)

    open_bucket(ref(None)).ensure("loc-sweep")  # type: ignore[arg-type]
    sdk: Any = s3.client("us-east-1")

    def opener(_: object) -> Any:
        return lambda given: open_bucket(ref(given))

    async for service in serve(tmp_path, opener):
        body = {"organization": ORG, "artifact": "left", "size": PART_SIZE + MiB, "place": PLACE}
        status, began = await service.api("POST", "/v1/writes", body)
        assert status == 201, began
        first = began["upload"]["multipart"]["parts"][0]
        async with (
            aiohttp.ClientSession() as s,
            s.put(first["url"], data=b"p" * PART_SIZE, headers=first["headers"]) as r,
        ):
            assert r.status == 200, await r.text()
        key = f"left/{began['version']}"
        uploads = sdk.list_multipart_uploads(Bucket=name).get("Uploads", [])
        assert [u["Key"] for u in uploads] == [key]
        upload_id = uploads[0]["UploadId"]
        parts = sdk.list_parts(Bucket=name, Key=key, UploadId=upload_id)["Parts"]
        assert [(p["PartNumber"], p["Size"]) for p in parts] == [(1, PART_SIZE)]

        await until(lambda: not sdk.list_multipart_uploads(Bucket=name).get("Uploads"), 15)
        assert sdk.list_objects_v2(Bucket=name).get("KeyCount", 0) == 0  # nothing left


@pytest.mark.etcd
async def test_etcd_watch_with_prev_kv_gives_what_an_expiry_removed(
    state_etcd: EtcdCluster,
) -> None:
    store = EtcdStore(state_etcd.endpoints, timeout=5)
    try:
        await prev_kv_events(store, f"/test/{uuid.uuid4().hex}/".encode())
    finally:
        await store.close()
