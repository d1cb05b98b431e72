"""What the begin path looks up, shared and remembered (issue 41): one TokenReview of a
token at a time, one read of a Secret at a time, a token's claimed issuer decoded once;
and the JSON answers and records as orjson writes them, meaning what they meant."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import threading
from typing import Any

import pytest

from o41.core import jsontext
from o41.core.trust import Malformed
from o41.webhook.cluster.view import Secrets
from o41.webhook.http.answers import json_answer
from o41.webhook.identity import tokens
from o41.webhook.identity.auth import Caller, KubernetesTokenReviewer
from o41.webhook.identity.service_tokens import ServiceTokens
from o41.webhook.records import Pending
from test_records import PENDING


def jwt(claims: dict[str, Any]) -> str:
    def part(value: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(value).encode()).rstrip(b"=").decode()

    return f"{part({'alg': 'RS256', 'kid': 'k'})}.{part(claims)}.c2lnbmF0dXJl"


TOKEN = jwt({"iss": "https://kubernetes.default.svc", "sub": "system:serviceaccount:ml:job"})


class CountingReviewer(KubernetesTokenReviewer):
    """The API's answers, counted; each held until ``release`` is set (so that the
    requests of a test are all waiting on one review at once)."""

    def __init__(self, answer: Caller | None = None, fail: Exception | None = None) -> None:
        super().__init__(api=None)
        self.calls = 0
        self.release = threading.Event()
        self.answer, self.fail = answer, fail

    def _review(self, token: str) -> Caller | None:
        self.calls += 1
        self.release.wait(10)
        if self.fail is not None:
            raise self.fail
        return self.answer


async def until(condition: Any) -> None:
    for _ in range(1000):
        if condition():
            return
        await asyncio.sleep(0.005)
    raise AssertionError("never happened")


async def test_concurrent_requests_with_one_token_share_one_tokenreview() -> None:
    reviewer = CountingReviewer(Caller("ml", "job"))
    waiting = [asyncio.ensure_future(reviewer.review(TOKEN)) for _ in range(32)]
    await until(lambda: reviewer.calls == 1)
    await asyncio.sleep(0.05)  # the others are waiting on it, not asking
    reviewer.release.set()
    assert {await w for w in waiting} == {Caller("ml", "job")}
    assert reviewer.calls == 1
    assert await reviewer.review(TOKEN) == Caller("ml", "job")  # cached
    assert reviewer.calls == 1


async def test_a_refusal_is_shared_and_cached_like_an_answer() -> None:
    reviewer = CountingReviewer(None)
    reviewer.release.set()
    assert await asyncio.gather(*(reviewer.review(TOKEN) for _ in range(5))) == [None] * 5
    assert reviewer.calls == 1


async def test_a_failed_tokenreview_fails_every_waiter_and_is_not_cached() -> None:
    reviewer = CountingReviewer(fail=ConnectionError("the API is away"))
    waiting = [asyncio.ensure_future(reviewer.review(TOKEN)) for _ in range(4)]
    await until(lambda: reviewer.calls == 1)
    reviewer.release.set()
    for w in waiting:
        with pytest.raises(ConnectionError):
            await w
    reviewer.fail = None
    reviewer.answer = Caller("ml", "job")
    assert await reviewer.review(TOKEN) == Caller("ml", "job")  # asked again
    assert reviewer.calls == 2


async def test_a_request_that_goes_away_leaves_the_review_to_the_others() -> None:
    reviewer = CountingReviewer(Caller("ml", "job"))
    first = asyncio.ensure_future(reviewer.review(TOKEN))
    await until(lambda: reviewer.calls == 1)
    second = asyncio.ensure_future(reviewer.review(TOKEN))
    await asyncio.sleep(0.01)
    first.cancel()
    reviewer.release.set()
    assert await second == Caller("ml", "job")
    assert first.cancelled() and reviewer.calls == 1


async def test_two_tokens_are_two_reviews() -> None:
    reviewer = CountingReviewer(Caller("ml", "job"))
    reviewer.release.set()
    other = jwt({"iss": "https://kubernetes.default.svc", "sub": "other"})
    await asyncio.gather(reviewer.review(TOKEN), reviewer.review(other))
    assert reviewer.calls == 2


async def test_a_malformed_token_is_refused_before_the_api_even_when_concurrent() -> None:
    reviewer = CountingReviewer(Caller("ml", "job"))
    bad = TOKEN.split(".")[0] + ".bm90IGpzb24." + "c2ln"
    for done in await asyncio.gather(
        *(reviewer.review(bad) for _ in range(3)), return_exceptions=True
    ):
        assert isinstance(done, Malformed)
    assert reviewer.calls == 0


class CountingSecrets(Secrets):
    def __init__(self) -> None:
        super().__init__(api=None, namespace="o41-system")
        self.reads = 0
        self.release = threading.Event()

    def _read(self, name: str) -> dict[str, str]:
        self.reads += 1
        self.release.wait(10)
        return {"accessKeyId": "AKIA", "secretAccessKey": "s"}


async def test_concurrent_begins_share_one_read_of_a_secret_and_one_data_object() -> None:
    secrets = CountingSecrets()
    waiting = [asyncio.ensure_future(secrets.read("creds")) for _ in range(32)]
    await until(lambda: secrets.reads == 1)
    await asyncio.sleep(0.05)
    secrets.release.set()
    got = [await w for w in waiting]
    assert secrets.reads == 1
    assert all(g is got[0] for g in got)  # one object: the bucket opened for it serves all
    assert await secrets.read("creds") is got[0]


def test_the_claimed_issuer_is_the_tokens_iss_and_none_for_what_is_no_jwt() -> None:
    assert tokens.claimed_issuer(TOKEN) == "https://kubernetes.default.svc"
    assert tokens.claimed_issuer(TOKEN) == "https://kubernetes.default.svc"  # remembered
    assert tokens.claimed_issuer(jwt({"iss": 7})) is None
    assert tokens.claimed_issuer(jwt({"sub": "x"})) is None
    assert tokens.claimed_issuer("not-a-jwt") is None
    assert tokens.claimed_issuer("a.bm90IGpzb24.c") is None
    assert tokens.claimed_issuer(jwt({"iss": "x", "pad": "y" * tokens.MAX_TOKEN})) is None


def test_which_verifier_a_token_goes_to_follows_the_issuer_it_claims() -> None:
    own = ServiceTokens(issuer="https://o41.example/tokens")
    assert own.issues(jwt({"iss": "https://o41.example/tokens"}))
    assert not own.issues(TOKEN)
    assert not ServiceTokens().issues(jwt({"iss": "https://o41.example/tokens"}))
    own.issuer = "https://moved.example"  # the memo is of the token's claim, not the answer
    assert not own.issues(jwt({"iss": "https://o41.example/tokens"}))


def test_the_memo_of_claimed_issuers_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tokens, "MAX_CLAIMED", 3)
    monkeypatch.setattr(tokens, "_claimed", {})
    for n in range(10):
        assert tokens.claimed_issuer(jwt({"iss": f"i{n}"})) == f"i{n}"
        assert len(tokens._claimed) <= 3


def test_a_json_answer_means_what_json_response_meant() -> None:
    answer = {"version": "v", "warning": None, "size": 2**70, "name": "caf\u00e9", "n": [1.5]}
    response = json_answer(answer, status=201, headers={"Retry-After": "3"})
    assert response.status == 201 and response.headers["Retry-After"] == "3"
    assert response.content_type == "application/json" and response.charset == "utf-8"
    assert isinstance(response.body, bytes) and json.loads(response.body) == answer


@pytest.mark.parametrize(
    "value",
    [
        {"a": 1, "b": [True, None, 2.5], "c": "caf\u00e9 \u2603"},
        {"big": 2**64},  # past orjson's integers: the standard library writes it
        {"lone": "\ud800"},  # not UTF-8: the standard library escapes it
        {1: "an int key"},  # orjson refuses it; the standard library makes it "1"
    ],
)
def test_jsontext_round_trips_what_the_standard_library_did(value: Any) -> None:
    assert json.loads(jsontext.dumps(value)) == json.loads(json.dumps(value))
    assert jsontext.loads(jsontext.dumps(value)) == json.loads(json.dumps(value))


def test_a_pending_record_reads_back_as_it_was_written() -> None:
    # the standard library's cases for orjson: text past ASCII, an integer past 64 bits
    pending = dataclasses.replace(
        PENDING, began=1765000000.123456, metadata={"step": 7, "note": "caf\u00e9", "huge": 2**70}
    )
    raw = pending.dump()
    assert b", " not in raw and b": " not in raw  # compact
    assert Pending.load(raw) == pending


async def test_the_service_keeps_what_it_started_with_out_of_full_collections() -> None:
    import gc

    from aiohttp import web

    from o41.webhook.__main__ import freeze_heap

    kept = [object() for _ in range(10)]  # a start's clients and view, as far as gc sees
    try:
        await freeze_heap(web.Application())
        assert gc.get_freeze_count() >= len(kept)
    finally:
        gc.unfreeze()  # the rest of the test run collects as before
