"""Issue 39, point 1: the hub may blink, the training step must not. Every call to the
service is retried when waiting can cure what failed (a connection refused, a reset, a
timeout, 429/502/503/504), with backoff and the service's ``Retry-After``, until the
deadline; a bad request is not; a call that is not idempotent is sent again only when it
provably never reached the service. Against a stand-in of the service that answers what
each test scripts (tests/client/stub_service.py), with the real ``o41`` command as a
process; the real service SIGKILLed and restarted under CLI writes is
tests/client/test_hub_blink_stack.py.
"""

from __future__ import annotations

import email.utils
import json
import os
import subprocess
import sys
import time
from typing import Any

import pytest

from o41.client import backoff
from o41.client.backoff import Retries, retryable
from o41.client.collections import Client as Collections
from o41.client.connection import Connection
from o41.client.errors import (
    BadRequest,
    ConnectError,
    LimitReached,
    ServiceUnavailable,
    TransportError,
    retry_after_seconds,
    service_error,
)
from stub_service import CLOSE, HANG, Answer, StubService, page
from testbed.process import LOOPBACK, free_port

ORG, ARTIFACT = "ml", "model"
VERSIONS = f"/v1/organizations/{ORG}/artifacts/{ARTIFACT}/versions"
TAG = f"/v1/organizations/{ORG}/artifacts/{ARTIFACT}/tags/best"


def o41(*args: str, deadline: float | None = None) -> subprocess.CompletedProcess[str]:
    """The ``o41`` command as a pod runs it, with a token, and a retry deadline if given."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("O41_ARTIFACTS_")}
    env["O41_ARTIFACTS_TOKEN"] = "a-token"
    env["O41_ARTIFACTS_CLOUD"], env["O41_ARTIFACTS_REGION"] = "aws", "us-east-1"
    if deadline is not None:
        env["O41_ARTIFACTS_RETRY_DEADLINE"] = str(deadline)
    return subprocess.run(
        [sys.executable, "-m", "o41.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def retries_logged(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "attempt " in line and "WARNING" in line]


def test_a_503_with_retry_after_is_waited_for_then_answered() -> None:
    refusals = [2]

    def script(method: str, path: str, body: Any) -> Answer:
        if refusals[0]:
            refusals[0] -= 1
            return Answer(503, {"error": "the token cannot be checked now"}, {"Retry-After": "1"})
        return Answer(200, page())

    with StubService(script) as stub:
        started = time.monotonic()
        done = o41(
            "versions", "--org", ORG, "--artifact", ARTIFACT, "--json", "--endpoint", stub.url
        )
        took = time.monotonic() - started
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["versions"][0]["location"] == "aws-east"
    assert stub.asked(VERSIONS) == 3
    assert took >= 2.0  # the two seconds the service asked for
    logged = retries_logged(done.stderr)
    assert len(logged) == 2, done.stderr  # one line per retry
    assert f"GET {VERSIONS}" in logged[0] and "attempt 2 in 1.0 s" in logged[0]
    assert "Retry-After 1 s" in logged[0] and "the token cannot be checked now" in logged[0]
    assert "attempt 3" in logged[1]


def test_a_400_is_not_retried() -> None:
    def script(method: str, path: str, body: Any) -> Answer:
        return Answer(400, {"error": "limit must be 1-1000"})

    with StubService(script) as stub:
        done = o41("versions", "--org", ORG, "--artifact", ARTIFACT, "--endpoint", stub.url)
    assert done.returncode == 1
    assert stub.asked(VERSIONS) == 1
    assert done.stderr.strip() == "o41 versions: limit must be 1-1000"


def test_the_deadline_ends_it_naming_what_was_waited_for() -> None:
    def script(method: str, path: str, body: Any) -> Answer:
        return Answer(503, {"error": "the state store is unavailable (no majority); retry shortly"})

    with StubService(script) as stub:
        started = time.monotonic()
        done = o41(
            "versions", "--org", ORG, "--artifact", ARTIFACT, "--endpoint", stub.url, deadline=3
        )
        took = time.monotonic() - started
    assert done.returncode == 1
    assert 3.0 <= took < 20, took
    assert stub.asked(VERSIONS) >= 3  # backoff: not one try per millisecond
    error = done.stderr.strip().splitlines()[-1]
    assert error.startswith("o41 versions: the state store is unavailable"), error
    assert f"GET {VERSIONS}: gave up after {stub.asked(VERSIONS)} attempts" in error
    assert "retry deadline of 3 s (O41_ARTIFACTS_RETRY_DEADLINE)" in error
    assert "Traceback" not in done.stderr


def test_a_service_down_then_up_loses_no_write_of_any_kind() -> None:
    """Refused connections are retried for every call, a commit and a compare-and-set tag
    too: nothing was sent. The stand-in starts listening once the command said it waits."""
    port = free_port()
    moved = {"version": "v1", "previous": None, "set": 1_700_000_000.0}
    env = {k: v for k, v in os.environ.items() if not k.startswith("O41_ARTIFACTS_")}
    env.update(O41_ARTIFACTS_TOKEN="t", O41_ARTIFACTS_CLOUD="aws", O41_ARTIFACTS_REGION="x")
    command = [
        sys.executable, "-m", "o41.cli", "tag", "--org", ORG, "--artifact", ARTIFACT, "best",
        "v1", "--expect-absent", "--endpoint", f"http://{LOOPBACK}:{port}",
    ]  # fmt: skip
    with subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as cli:
        assert cli.stderr is not None and cli.stdout is not None
        first = cli.stderr.readline().decode()  # the first retry's line: it is waiting
        stub = StubService(lambda method, path, body: Answer(200, moved), port=port).start()
        try:
            rest = cli.stderr.read().decode()
            out = cli.stdout.read().decode()
            assert cli.wait(60) == 0, first + rest
        finally:
            stub.stop()
    assert "attempt 2" in first and "Connection refused" in first, first
    assert f"PUT {TAG}" in first
    assert stub.requests == [("PUT", TAG)]
    assert "tag best now points at v1" in out


def test_what_may_have_been_applied_is_not_sent_again() -> None:
    """The connection closes after the request came: a tag move, plain or compare-and-set,
    is sent again (a repeat of one that landed answers success, issue 39 point 2); a
    tag's delete is not: it says it may or may not have been applied."""
    closed = [1]

    def script(method: str, path: str, body: Any) -> Answer | str:
        if closed[0]:
            closed[0] -= 1
            return CLOSE
        return Answer(200, {"version": "v1", "previous": None, "set": 1.0})

    with StubService(script) as stub:
        done = o41(
            "tag", "--org", ORG, "--artifact", ARTIFACT, "best", "v1", "--endpoint", stub.url
        )
        assert done.returncode == 0, done.stderr
        assert stub.asked(TAG) == 2

        closed[0] = 1
        done = o41(
            "tag", "--org", ORG, "--artifact", ARTIFACT, "best", "v1", "--expect", "v0",
            "--endpoint", stub.url,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert stub.asked(TAG) == 4  # sent again

        closed[0] = 1
        done = o41(
            "tag", "--org", ORG, "--artifact", ARTIFACT, "best", "--delete", "--json",
            "--endpoint", stub.url,
        )  # fmt: skip
        assert done.returncode == 1
        assert stub.asked(TAG) == 5  # once
    error = json.loads(done.stderr)
    assert error["status"] is None
    assert "the request may or may not have been applied" in error["error"]


def test_a_hung_service_times_out_and_a_wait_adds_to_the_read_timeout() -> None:
    def script(method: str, path: str, body: Any) -> Answer | str:
        if path.startswith("/hang"):
            return HANG
        return Answer(200, {"waited": True}, delay=1.2)

    with StubService(script) as stub:
        connection = Connection(stub.url, token="t", timeout=0.5, retry_deadline=1.5)
        started = time.monotonic()
        with pytest.raises(TransportError) as hung:
            connection.request("GET", "/hang")
        assert 1.5 <= time.monotonic() - started < 10
        assert "no answer within 0.5 s" in str(hung.value)
        assert stub.asked("/hang") >= 2  # a GET: sent again
        # a long poll that may wait 1 s on the service: 0.5 + 1 s for its answer
        assert connection.request("POST", "/wait", {}, idempotent=True, wait=1.0) == {
            "waited": True
        }
        assert stub.asked("/wait") == 1


def test_a_rate_is_waited_for_a_quota_is_not() -> None:
    answers = [
        Answer(429, {"error": "this token sends more than 5 a second"}, {"Retry-After": "1"}),
        Answer(200, {"version": "v1"}),
        Answer(429, {"error": "the namespace holds 5 entries, its quota is 5"}),
    ]  # fmt: skip

    def script(method: str, path: str, body: Any) -> Answer:
        return answers.pop(0)

    with StubService(script) as stub:
        connection = Connection(stub.url, token="t", retry_deadline=30)
        assert connection.request("POST", "/v1/writes/v1/commit", {}) == {"version": "v1"}
        with pytest.raises(LimitReached, match="quota"):
            connection.request("POST", "/v1/writes/v1/commit", {})
    assert stub.asked("/v1/writes/v1/commit") == 3


def test_collections_over_posts_wait_for_a_503_and_are_refused_a_400_at_once() -> None:
    """The collections' transport: a 503 with Retry-After, then the answer; a refusal as
    it is. (The stand-in speaks no WebSocket: the client falls back to POSTs.)"""
    refusals = [1]

    def script(method: str, path: str, body: Any) -> Answer:
        if path == "/v1/collections":
            return Answer(404, {"error": "no WebSocket here"})
        if path.endswith("/bad/get"):
            return Answer(400, {"error": "a bad key"})
        if refusals[0]:
            refusals[0] -= 1
            return Answer(503, {"error": "the state store cannot answer now"}, {"Retry-After": "1"})
        return Answer(200, {"value": 7})

    with StubService(script) as stub:
        client = Collections.over(Connection(stub.url, token="t", retry_deadline=30), "job-1")
        started = time.monotonic()
        assert client.counter("steps").add(1) == 7  # not idempotent: sent again, as the 503 said
        assert time.monotonic() - started >= 1.0
        with pytest.raises(BadRequest):
            client.dict("bad").get("k")
    assert stub.asked("/v1/collections/job-1/counter/steps/add") == 2
    assert stub.asked("/v1/collections/job-1/dict/bad/get") == 1


# the rules, without a service


def test_what_is_retried() -> None:
    def refusal(status: int, retry_after: str | None = None, **body: Any) -> Any:
        return service_error(status, "why", {"error": "why", **body}, retry_after)

    reached, unreached = TransportError("reset"), ConnectError("refused")
    untrusted = TransportError("certificate verify failed")
    untrusted.retryable = False
    cases = [
        (unreached, True, True),
        (reached, True, False),
        (untrusted, False, False),
        (refusal(503), True, False),
        (refusal(503, "5"), True, True),  # refused before acting: a token not checked now
        (refusal(503, location="aws-east"), False, False),  # the write goes elsewhere
        (refusal(502), True, False),
        (refusal(504), True, False),
        (refusal(429, "1"), True, True),
        (refusal(429), False, False),  # a quota
        (refusal(400), False, False),
        (refusal(404), False, False),
        (refusal(409), False, False),
        (refusal(500), False, False),
        (refusal(507), False, False),
    ]
    for error, idempotent, other in cases:
        assert retryable(error, True) is idempotent, error
        assert retryable(error, False) is other, error


def test_the_backoff_is_full_jitter_within_the_deadline() -> None:
    now = [0.0]
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        now[0] += seconds

    retries = Retries(20.0, "GET /x", sleep=sleep, clock=lambda: now[0], draw=lambda: 1.0)
    error = ConnectError("refused")
    while retries.again(error, False):
        pass
    # the ceilings double from FIRST_WAIT up to LONGEST_WAIT; the last one is cut at the deadline
    assert slept[:4] == [0.25, 0.5, 1.0, 2.0]
    assert max(slept) <= backoff.LONGEST_WAIT
    assert sum(slept) == pytest.approx(20.0)
    assert "gave up after" in str(error) and "retry deadline of 20 s" in str(error)
    drawn = Retries(20.0, "GET /x", sleep=lambda s: None, draw=lambda: 0.5)
    assert drawn.again(ConnectError("refused"), False) and drawn.waited == 0.125


def test_retry_after_in_seconds_or_as_an_http_date() -> None:
    assert retry_after_seconds("7") == 7.0
    now = time.time()
    date = email.utils.formatdate(now + 30, usegmt=True)
    assert retry_after_seconds(date, now=now) == pytest.approx(30, abs=1)
    assert retry_after_seconds(email.utils.formatdate(now - 30, usegmt=True), now=now) == 0.0
    assert retry_after_seconds("soon") is None
    refused = service_error(503, "later", {}, "3")
    assert isinstance(refused, ServiceUnavailable) and refused.retry_after == 3.0


def test_the_deadline_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("O41_ARTIFACTS_RETRY_DEADLINE", raising=False)
    assert Connection("http://x").retry_deadline == backoff.DEFAULT_DEADLINE
    monkeypatch.setenv("O41_ARTIFACTS_RETRY_DEADLINE", "42")
    assert Connection("http://x").retry_deadline == 42.0
    assert Connection("http://x", retry_deadline=0).retry_deadline == 0.0
    monkeypatch.setenv("O41_ARTIFACTS_RETRY_DEADLINE", "soon")
    with pytest.raises(ValueError, match="O41_ARTIFACTS_RETRY_DEADLINE='soon' is not a number"):
        Connection("http://x")
