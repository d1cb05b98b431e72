"""The operator's record of bucket creations (``creatingBucket`` in its record ConfigMap)
when the API server cannot take it: the storage then creates nothing
(tests/storage/test_storage_stores.py shows that part against the stand-ins;
tests/operator/test_operator.py the record doing its job)."""

from __future__ import annotations

import pytest
from kubernetes import client

from o41.kube.location_record import LocationRecord
from o41.operator.buckets import RecordCreations
from o41.operator.cluster import Cluster
from o41.operator.records import Records
from o41.storage import SetupFailed
from testbed.process import LOOPBACK, free_port


@pytest.fixture
def api_server_away() -> Records:
    """The operator's records, through a cluster client pointed at a loopback port where
    nothing listens."""
    config = client.Configuration()
    config.host = f"http://{LOOPBACK}:{free_port()}"
    config.retries = 0
    away = Cluster("o41-system")
    away.__dict__["_api"] = client.ApiClient(config)  # the cached client
    return Records(away)


def test_a_creation_the_api_server_cannot_record_is_a_retryable_failure(
    api_server_away: Records,
) -> None:
    creations = RecordCreations(api_server_away, LocationRecord("uid-1", "aws-east"))
    with pytest.raises(SetupFailed) as failed:
        creations.record("o41-aws-east-0123")
    assert failed.value.reason == "RecordNotWritten"
    assert failed.value.retryable
    assert "'o41-aws-east-0123'" in str(failed.value)
    assert "not created until" in str(failed.value)
    assert not creations.recorded("o41-aws-east-0123")


def test_a_recorded_creation_is_not_written_again(api_server_away: Records) -> None:
    """The resumed setup finds its record and sends no second patch (which would fail
    here)."""
    record = LocationRecord("uid-1", "aws-east", creating_bucket="o41-aws-east-0123")
    creations = RecordCreations(api_server_away, record)
    creations.record("o41-aws-east-0123")
    assert creations.recorded("o41-aws-east-0123")
    assert not creations.recorded("o41-aws-east-4567")
