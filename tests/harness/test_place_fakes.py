"""The metadata fakes refuse what the real services refuse, so the client tests mean something."""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from testbed.metadata import AwsImds, AzureImds, GcpMetadata, isolate

_opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@pytest.fixture(autouse=True)
def isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    escapes = isolate(monkeypatch, tmp_path)
    yield
    assert escapes == []


def call(url: str, method: str = "GET", headers: dict[str, str] | None = None) -> tuple[int, str]:
    req = urllib.request.Request(url, method=method, headers=headers or {})
    try:
        with _opener.open(req, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_imds_wants_the_ttl_header_on_the_token_put() -> None:
    with AwsImds() as imds:
        assert call(imds.url + "/latest/api/token", "PUT")[0] == 400
        ttl = {"X-aws-ec2-metadata-token-ttl-seconds": "0"}
        assert call(imds.url + "/latest/api/token", "PUT", ttl)[0] == 400
        assert call(imds.url + "/latest/api/token", "GET")[0] == 405


def test_imds_refuses_a_get_without_a_valid_token() -> None:
    with AwsImds("eu-north-1") as imds:
        region = imds.url + "/latest/meta-data/placement/region"
        assert call(region)[0] == 401
        assert call(region, headers={"X-aws-ec2-metadata-token": "forged"})[0] == 401
        ttl = {"X-aws-ec2-metadata-token-ttl-seconds": "60"}
        status, token = call(imds.url + "/latest/api/token", "PUT", ttl)
        assert status == 200
        assert call(region, headers={"X-aws-ec2-metadata-token": token}) == (200, "eu-north-1")
        proxied = {"X-aws-ec2-metadata-token-ttl-seconds": "60", "X-Forwarded-For": "10.0.0.1"}
        assert call(imds.url + "/latest/api/token", "PUT", proxied)[0] == 403


def test_gcp_wants_the_flavor_header_and_says_it_back() -> None:
    with GcpMetadata("projects/1/zones/us-west1-b") as gcp:
        zone = gcp.url + "/computeMetadata/v1/instance/zone"
        assert call(zone)[0] == 403
        req = urllib.request.Request(zone, headers={"Metadata-Flavor": "Google"})
        with _opener.open(req, timeout=5) as resp:
            assert resp.status == 200
            assert resp.headers["Metadata-Flavor"] == "Google"
            assert resp.read().decode() == "projects/1/zones/us-west1-b"


def test_azure_wants_the_metadata_header_and_an_api_version() -> None:
    with AzureImds("uksouth") as azure:
        base = azure.url + "/metadata/instance/compute/location"
        assert call(base + "?api-version=2021-02-01&format=text")[0] == 400
        assert call(base + "?format=text", headers={"Metadata": "true"})[0] == 400
        ok = call(base + "?api-version=2021-02-01&format=text", headers={"Metadata": "true"})
        assert ok == (200, "uksouth")


def test_fakes_count_requests() -> None:
    with AzureImds() as azure:
        call(azure.url + "/anything")
        call(azure.url + "/anything")
        assert azure.count == 2
