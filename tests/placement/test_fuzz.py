"""Fuzz the running placement service against its own OpenAPI document (schemathesis).

The real service process (TokenReview against the real API server, state in a 3-member
etcd, a Location on the S3 stand-in) is called with a valid token of a namespace that may
use the organization, with no token and with a forged one. Every answer must be no 5xx and
must match the document (status code, content type, schema). A bounded number of examples
per operation, on loopback only.
"""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import positive_data_acceptance
from schemathesis.config import SchemathesisConfig

from o41.webhook.openapi import document
from testbed.kube import Kube
from testbed.product import PlacementProcess as PlacementService
from testbed.stores import AzureStore, GcsStore, S3Store

from fixtures.world import World

pytestmark = [pytest.mark.kube, pytest.mark.stores, pytest.mark.etcd]

EXAMPLES = int(os.environ.get("O41_FUZZ_EXAMPLES", "25"))


def _forged_token() -> str:
    """A JWT-shaped token whose signature no key of the cluster made."""
    part = [
        base64.urlsafe_b64encode(json.dumps(p).encode()).rstrip(b"=").decode()
        for p in (
            {"alg": "RS256", "kid": "forged"},
            {"iss": "https://kubernetes.default.svc", "sub": "system:serviceaccount:x:y"},
        )
    ]
    return f"{part[0]}.{part[1]}.{base64.urlsafe_b64encode(os.urandom(256)).decode()}"


@pytest.fixture(scope="module")
def fuzz_world(
    kube: Kube,
    credentials: dict[str, str],
    s3: S3Store,
    gcs: GcsStore,
    azure: AzureStore,
    placement: PlacementService,
    tmp_path_factory: pytest.TempPathFactory,
) -> World:
    w = World(kube, credentials, s3, gcs, azure, placement, tmp_path_factory.mktemp("fuzz"))
    w.organization(["team-a"])
    w.east = w.location(
        "aws-east", "aws", "us-east-1", {"s3": {"endpoint": s3.endpoint}}, credentials["s3"]
    )
    w.ready(w.east)
    w.team_a = w.token("team-a")
    return w


# A schema-violating body is rejected by any 4xx that says so, 413 too: a body over the
# service's 1 MiB limit (a directory's begin with more files than it takes, each with a
# long path, is megabytes) is refused before it is parsed.
REJECTED = [400, 401, 403, 404, 405, 406, 409, 413, 415, 422, 428, 429, "5xx"]
schema = schemathesis.openapi.from_dict(
    document(),
    config=SchemathesisConfig.from_dict(
        {"checks": {"negative_data_rejection": {"expected-statuses": REJECTED}}}
    ),
)


def _headers(token: str, world: World) -> dict[str, str]:
    """A valid token of a namespace that may use the organization, none, or a forged one."""
    if token == "valid":
        return {"Authorization": f"Bearer {Path(world.team_a).read_text()}"}
    if token == "forged":
        return {"Authorization": f"Bearer {_forged_token()}"}
    return {}


@pytest.mark.parametrize("token", ["valid", "none", "forged"])
@schema.parametrize()
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    derandomize=True,
    database=None,
)
def test_no_5xx_and_every_answer_matches_the_document(
    case: Any, token: str, fuzz_world: World, placement: PlacementService
) -> None:
    case.call_and_validate(
        base_url=placement.url,
        headers=_headers(token, fuzz_world),
        timeout=30,
        # a well-formed request of an organization or version that does not exist is
        # refused (404/403), as it must be
        excluded_checks=[positive_data_acceptance],
    )
