"""No abandoned uploads, in the buckets: the lifecycle rule ``ensure`` keeps (S3's
AbortIncompleteMultipartUpload) read back from the stand-in that keeps it (moto), the
warning of the one that refuses it (versitygw answers NotImplemented), GCS's rules (a
``Delete`` of objects with a Custom-Time, which only part objects have, and
``AbortIncompleteMultipartUpload``), nothing to set on Azurite (docs/storage.md says why),
and ``abort_multipart`` dropping a started upload's parts on each stand-in.
"""

from __future__ import annotations

import re
import uuid
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from o41.storage import BucketRef, Kind, bucket_name, open_bucket
from o41.storage.base import ABORT_RULE_ID
from o41.storage.gcs import CUSTOM_TIME, GcsBucket, abort_rules
from test_storage import offline as offline
from test_storage_stores import _azure, _gcs, _s3, upload_parts
from testbed.stores import AzureStore, GcsStore, S3Store, VersityStore

pytestmark = pytest.mark.stores

MiB = 2**20


def _name(kind: Kind) -> str:
    return bucket_name(kind, "abandoned", str(uuid.uuid4()))


def _rules(sdk: Any, bucket: str) -> list[dict[str, Any]]:
    rules: list[dict[str, Any]] = sdk.get_bucket_lifecycle_configuration(Bucket=bucket)["Rules"]
    return rules


def _ours(days: int) -> dict[str, Any]:
    return {
        "ID": ABORT_RULE_ID,
        "Status": "Enabled",
        "Filter": {"Prefix": ""},
        "AbortIncompleteMultipartUpload": {"DaysAfterInitiation": days},
    }


def test_s3_bucket_gets_the_abort_rule_and_keeps_the_users_rules(s3_moto: S3Store) -> None:
    """moto keeps lifecycle rules (versitygw has none to read back). The user's rule stays
    through every setup; only o41's rule, by its ID, is added and then changed."""
    backend = _s3(s3_moto)
    name = _name("s3")
    bucket = open_bucket(backend.ref(name))
    assert bucket.ensure("loc-1", abort_uploads_after_days=2).warnings == ()
    assert _rules(backend.sdk, name) == [_ours(2)]

    users = {
        "ID": "users-own-expiry",
        "Status": "Enabled",
        "Filter": {"Prefix": "tmp/"},
        "Expiration": {"Days": 30},
    }
    backend.sdk.put_bucket_lifecycle_configuration(
        Bucket=name, LifecycleConfiguration={"Rules": [users, _ours(9)]}
    )
    # a restarted operator with another setting: ours replaced, the user's kept
    again = open_bucket(backend.ref(name)).ensure("loc-1", abort_uploads_after_days=3)
    assert not again.created and again.warnings == ()
    assert _rules(backend.sdk, name) == [users, _ours(3)]
    # the same setting again: nothing changes, no duplicate
    open_bucket(backend.ref(name)).ensure("loc-1", abort_uploads_after_days=3)
    assert _rules(backend.sdk, name) == [users, _ours(3)]
    # no setting (0 in the chart): the bucket's rules are left as they are
    open_bucket(backend.ref(name)).ensure("loc-1")
    assert _rules(backend.sdk, name) == [users, _ours(3)]


def test_s3_store_without_lifecycle_rules_is_a_warning(s3: VersityStore) -> None:
    """versitygw answers NotImplemented to Get/PutBucketLifecycleConfiguration: outside
    AWS that is a warning for an Event, the setup goes on (as with encryption)."""
    backend = _s3(s3)
    name = _name("s3")
    ensured = open_bucket(backend.ref(name)).ensure("loc-1", abort_uploads_after_days=2)
    assert ensured.created
    assert ensured.warnings[-1] == (
        f"{s3.endpoint} takes no lifecycle rules: multipart uploads left unfinished are "
        "aborted by the placement service only"
    )
    again = open_bucket(backend.ref(name)).ensure("loc-1", abort_uploads_after_days=2)
    assert again.warnings == ensured.warnings


def test_azure_sets_no_rule_and_warns_nothing(azure: AzureStore) -> None:
    """Azure discards uncommitted blocks after 7 days by itself: nothing to set."""
    backend = _azure(azure)
    name = _name("azure_blob")
    open_bucket(backend.ref(name)).ensure("loc-1")
    plain = open_bucket(backend.ref(name)).ensure("loc-1")  # adopted, as the next below
    ensured = open_bucket(backend.ref(name)).ensure("loc-1", abort_uploads_after_days=2)
    assert ensured.warnings == plain.warnings


def test_gcs_parts_carry_a_custom_time_and_the_rules_are_asked_for(gcs: GcsStore) -> None:
    """GCS: a part object has a Custom-Time (what the lifecycle rule ``Delete`` on
    ``daysSinceCustomTime`` selects), the composed version none; fake-gcs-server keeps no
    lifecycle rules, which ``ensure`` says in a warning (Google keeps them)."""
    backend = _gcs(gcs)
    name = _name("gcs")
    open_bucket(backend.ref(name)).ensure("loc-1")
    plain = open_bucket(backend.ref(name)).ensure("loc-1")  # adopted, as the next below
    bucket = open_bucket(backend.ref(name))
    ensured = bucket.ensure("loc-1", abort_uploads_after_days=2)
    assert ensured.warnings == (
        *plain.warnings,
        f"{gcs.endpoint} keeps no lifecycle rules: the parts of uploads left unfinished are "
        "removed by the placement service only",
    )
    started = bucket.start_multipart("a/v1", parts=2, expires=600)
    for part in started.parts:  # signed in: the part's PUT must carry it, Google keeps it
        signed = parse_qs(urlsplit(part.url).query)["X-Goog-SignedHeaders"][0].split(";")
        assert CUSTOM_TIME in signed
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", part.headers[CUSTOM_TIME])
    # fake-gcs-server takes the header and keeps no Custom-Time (docs/storage.md); the
    # upload goes through all the same
    upload_parts(started.parts, [b"x" * 1024, b"y" * 10])
    assert len(list(gcs.client().list_blobs(name, prefix="a/v1.o41part-"))) == 2
    bucket.complete_multipart("a/v1", started, ["", ""])
    stat = bucket.stat("a/v1")
    assert stat is not None and stat.size == 1034
    single = bucket.presign_put("a/v2", expires=600, size=1)
    assert CUSTOM_TIME not in single.headers  # a version's own upload: never the rule's


class _Rules:
    """A bucket's lifecycle rules as the SDK's Bucket holds them (the merge of ``ensure``
    over what a bucket has; Google's side of it is not testable here)."""

    def __init__(self, rules: list[dict[str, Any]]) -> None:
        self.lifecycle_rules = rules
        self.patches = 0

    def patch(self, **_: Any) -> None:
        self.patches += 1


def test_gcs_abort_rules_keep_the_users_rules_and_patch_once() -> None:
    users = {"action": {"type": "Delete"}, "condition": {"age": 30, "matchesPrefix": ["tmp/"]}}
    held = _Rules([users, *abort_rules(5)])
    bucket = open_bucket(BucketRef("gcs", "o41-abandoned-x", "us-central1"))
    assert isinstance(bucket, GcsBucket)
    assert bucket._abort_rules(held, 2) == []
    assert held.lifecycle_rules == [users, *abort_rules(2)] and held.patches == 1
    assert bucket._abort_rules(held, 2) == [] and held.patches == 1  # the same: no patch
    assert abort_rules(2) == [
        {"action": {"type": "Delete"}, "condition": {"daysSinceCustomTime": 2}},
        {"action": {"type": "AbortIncompleteMultipartUpload"}, "condition": {"age": 2}},
    ]


@pytest.mark.parametrize("days", [0, -1, 3651])
def test_days_outside_the_range_are_refused(s3: VersityStore, days: int) -> None:
    with pytest.raises(ValueError, match="abort_uploads_after_days"):
        open_bucket(_s3(s3).ref(_name("s3"))).ensure("loc-1", abort_uploads_after_days=days)


def test_s3_abort_drops_the_uploads_parts_and_is_idempotent(s3: VersityStore) -> None:
    """versitygw: a started upload with a part is listed, after the abort it is gone, and
    a second abort (another replica's) is not an error."""
    backend = _s3(s3)
    name = _name("s3")
    bucket = open_bucket(backend.ref(name))
    bucket.ensure("loc-1")
    started = bucket.start_multipart("a/v1", parts=2, expires=600)
    upload_parts(started.parts[:1], [b"x" * (5 * MiB)])
    listed = backend.sdk.list_multipart_uploads(Bucket=name).get("Uploads", [])
    assert [u["UploadId"] for u in listed] == [started.upload_id]
    parts = backend.sdk.list_parts(Bucket=name, Key="a/v1", UploadId=started.upload_id)
    assert [p["PartNumber"] for p in parts["Parts"]] == [1]
    bucket.abort_multipart("a/v1", started.upload_id)
    assert backend.sdk.list_multipart_uploads(Bucket=name).get("Uploads", []) == []
    bucket.abort_multipart("a/v1", started.upload_id)  # already aborted: fine


def test_gcs_abort_deletes_the_part_objects(gcs: GcsStore) -> None:
    backend = _gcs(gcs)
    name = _name("gcs")
    bucket = open_bucket(backend.ref(name))
    bucket.ensure("loc-1")
    started = bucket.start_multipart("a/v1", parts=2, expires=600)
    upload_parts(started.parts[:1], [b"x" * 1024])
    listed = [b.name for b in gcs.client().list_blobs(name, prefix="a/v1")]
    assert len(listed) == 1 and ".o41part-" in listed[0]
    bucket.abort_multipart("a/v1", started.upload_id)
    assert [b.name for b in gcs.client().list_blobs(name, prefix="a/v1")] == []
    bucket.abort_multipart("a/v1", started.upload_id)  # already aborted: fine
