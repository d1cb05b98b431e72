"""JSON logs and request ids, as an operator of the service reads them: the real servers
with ``--log-format json``, requests over HTTP, their log lines parsed as JSON."""

from __future__ import annotations

import json
import logging
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from o41 import logs
from testbed.kube import Kube
from testbed.product import PlacementProcess

from fixtures.operator import Operator
from support import wait_for


def json_lines(path: Path) -> list[dict[str, Any]]:
    """Every line of the log, each one JSON object (a line that is not fails the test)."""
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    return [json.loads(line) for line in lines]


def call(url: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], Any]:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10) as r:
            return r.status, dict(r.headers), json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), json.loads(e.read())


@pytest.fixture(scope="module")
def service(kube: Kube, crds: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The placement service, its state embedded, logging JSON."""
    running = PlacementProcess(
        kube.kubeconfig, [], tmp_path_factory.mktemp("json-logs"), log_format="json"
    ).start()
    try:
        yield running
    finally:
        running.stop()


def log_of(service: PlacementProcess) -> Path:
    return service.directory / f"placement-{service.starts}.log"


def access_line(service: PlacementProcess, request_id: str) -> dict[str, Any]:
    def find() -> dict[str, Any] | None:
        found = [
            line
            for line in json_lines(log_of(service))
            if line.get("request_id") == request_id and line["logger"] == "o41.webhook.requests"
        ]
        return found[0] if found else None

    result: dict[str, Any] = wait_for(find, 10, f"the access line of request {request_id}")
    return result


@pytest.mark.kube
def test_the_request_id_of_the_header_is_in_the_log_line_and_the_error_body(
    service: PlacementProcess,
) -> None:
    # a refusal (no token): the id the server made is in the header, the body and its line
    status, headers, body = call(f"{service.url}/v1/organizations/ml/artifacts")
    assert status == 401
    rid = headers["X-Request-Id"]
    assert len(rid) == 32 and body["requestId"] == rid
    line = access_line(service, rid)
    assert set(line) >= {"time", "level", "logger", "message"}
    assert line["level"] == "INFO" and line["organization"] == "ml"
    assert line["message"].startswith("GET /v1/organizations/ml/artifacts 401 ")
    assert line["time"].endswith("+00:00")

    # a caller's sane id is kept, everywhere
    status, headers, body = call(
        f"{service.url}/v1/organizations/ml/artifacts", {"X-Request-Id": "trace-4bf92f3577b34da6"}
    )
    assert headers["X-Request-Id"] == body["requestId"] == "trace-4bf92f3577b34da6"
    assert access_line(service, "trace-4bf92f3577b34da6")["organization"] == "ml"

    # one that could forge a line or a header is replaced by a new one
    forged = 'x" "level": "ERROR'
    status, headers, body = call(f"{service.url}/nowhere", {"X-Request-Id": forged})
    assert status == 401 and headers["X-Request-Id"] != forged  # no token: 401 first
    assert body["requestId"] == headers["X-Request-Id"]
    assert access_line(service, headers["X-Request-Id"])["message"].startswith("GET /nowhere 401")


@pytest.mark.kube
def test_answers_carry_the_id_and_probes_stay_out_of_the_log(service: PlacementProcess) -> None:
    status, headers, body = call(f"{service.url}/healthz", {"X-Request-Id": "probe-1"})
    assert (status, headers["X-Request-Id"], body["status"]) == (200, "probe-1", "ok")
    call(f"{service.url}/nowhere", {"X-Request-Id": "after-the-probe"})
    access_line(service, "after-the-probe")  # written after the probe's, had it one
    assert not [line for line in json_lines(log_of(service)) if line.get("request_id") == "probe-1"]


@pytest.mark.kube
@pytest.mark.stores
def test_the_operator_logs_kopfs_json_with_the_location_it_is_about(
    operator: Operator, kube: Kube
) -> None:
    """The session's operator runs with --log-format json (tests/fixtures/operator.py)."""
    assert operator.server is not None
    path = operator.directory / f"operator-{operator.starts}.log"

    def about_a_location() -> dict[str, Any] | None:
        lines = json_lines(path)
        found = [line for line in lines if line.get("object", {}).get("kind") == "Location"]
        return found[-1] if found else None

    kube.kubectl(
        "apply",
        "-f",
        "-",
        input=json.dumps(
            {
                "apiVersion": "artifacts.o41.io/v1alpha1",
                "kind": "Location",
                "metadata": {"name": "json-logs-loc"},
                "spec": {
                    "organization": "json-logs",
                    "cloud": "aws",
                    "region": "us-east-1",
                    "backend": {"s3": {"endpoint": "http://127.0.0.1:9"}},  # nothing listens
                },
            }
        ),
    )
    try:
        line = wait_for(about_a_location, 60, "an operator log line about a Location")
        assert set(line) >= {"time", "level", "logger", "message", "location"}
        assert line["location"] == line["object"]["name"]
        assert line["logger"].startswith("kopf")
    finally:  # unfinished (nothing answers at its endpoint), so it may be deleted
        kube.kubectl("delete", "location", "json-logs-loc", "--wait=false", check=False)


def test_a_line_outside_a_request_has_no_request_fields() -> None:
    record = logging.LogRecord("o41.x", logging.WARNING, __file__, 1, "away %s", ("now",), None)
    line = json.loads(logs.JsonFormatter().format(record))
    assert line == {
        "time": line["time"],
        "level": "WARNING",
        "logger": "o41.x",
        "message": "away now",
    }
    with logs.about(request_id="r1", organization="ml"):
        logs.known(location="aws-east", other="ignored")
        inside = json.loads(logs.JsonFormatter().format(record))
    assert (inside["request_id"], inside["organization"], inside["location"]) == (
        "r1",
        "ml",
        "aws-east",
    )
    assert "other" not in inside
