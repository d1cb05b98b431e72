"""What the operator shows of a TrustDomain's fetch, and when it fetches again
(``o41.operator.trust``), without a cluster; the whole path is
tests/operator/test_trust_domains.py."""

from __future__ import annotations

import datetime as dt

import pytest

from o41.kube.api import TrustDomainKeys, TrustDomainSpec
from o41.kube.trust_keys import KeyFetchFailed
from o41.kube.trust_record import TrustRecord
from o41.operator import trust
from o41.operator.trust import RETRY_FIRST, TrustDomains, failed, fetched

ISSUER = "https://oidc.cluster-b.example"
SPEC = TrustDomainSpec(issuer=ISSUER, stale_after=3600)
NOW = dt.datetime(2026, 12, 5, 12, 0, tzinfo=dt.UTC)
KEY = {"kty": "RSA", "kid": "k1", "n": "sXch", "e": "AQAB"}
DOWN = KeyFetchFailed("Unreachable", "TrustDomain 'b': could not reach it: check the URL")


def record(fetched_at: str | None = "2026-12-05T11:30:00Z", keys: bool = True) -> TrustRecord:
    return TrustRecord("uid-1", "b", ISSUER, {"keys": [KEY] if keys else []}, fetched_at)


def test_a_good_fetch_is_recorded_with_its_time_and_shown_with_its_kids() -> None:
    outcome = fetched("b", "uid-1", SPEC, {"keys": [KEY]}, NOW)
    assert (outcome.ok, outcome.reason) == (True, "KeysFetched")
    assert outcome.message == f"1 key(s) fetched from OIDC discovery at {ISSUER}: k1"
    assert outcome.record == TrustRecord(
        "uid-1", "b", ISSUER, {"keys": [KEY]}, fetched_at="2026-12-05T12:00:00Z"
    )
    inline = SPEC.model_copy(update={"keys": TrustDomainKeys(jwks="{}")})
    assert "from spec.keys.jwks" in fetched("b", "u", inline, {"keys": [KEY]}, NOW).message


def test_a_failure_with_fresh_keys_says_until_when_they_serve() -> None:
    outcome = failed(SPEC, DOWN, record(), NOW)
    assert (outcome.ok, outcome.reason, outcome.record) == (False, "Unreachable", None)
    assert outcome.message == (
        "TrustDomain 'b': could not reach it: check the URL. The last good keys (fetched at "
        "2026-12-05T11:30:00Z) serve until 2026-12-05T12:30:00Z (spec.staleAfter)"
    )


@pytest.mark.parametrize("last", [None, record(None), record(keys=False)])
def test_a_failure_without_keys_ever_fetched_says_tokens_are_refused(
    last: TrustRecord | None,
) -> None:
    outcome = failed(SPEC, DOWN, last, NOW)
    assert outcome.reason == "Unreachable"
    assert outcome.message.endswith(
        "No keys were ever fetched: this domain's tokens are refused (503) until a fetch succeeds"
    )


def test_a_failure_past_stale_after_is_stale_and_keeps_the_cause() -> None:
    outcome = failed(SPEC, DOWN, record("2026-12-05T10:59:59Z"), NOW)
    assert outcome.reason == "Stale"
    assert outcome.message.startswith(
        "the last good keys, fetched at 2026-12-05T10:59:59Z, are older than spec.staleAfter "
        "(3600 s): this domain's tokens are refused (503) until a fetch succeeds. The last "
        "fetch failed (Unreachable): TrustDomain 'b'"
    )


def test_fetches_are_due_every_refresh_interval_and_sooner_after_failures(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(trust, "REFRESH_OVERRIDE", None)
    domains = TrustDomains()
    assert domains.due("u", 300, 1000.0)  # never fetched
    domains.attempted("u", True, 1000.0)
    assert not domains.due("u", 300, 1299.0) and domains.due("u", 300, 1300.0)
    waits = []
    for failures in range(1, 7):
        domains.attempted("u", False, 2000.0)
        assert domains.attempts["u"].failures == failures
        waits.append(next(s for s in range(1, 400) if domains.due("u", 300, 2000.0 + s)))
    assert waits == [RETRY_FIRST * 2**n for n in range(5)] + [300]
    domains.attempted("u", True, 3000.0)
    assert domains.attempts["u"].failures == 0
    domains.forget("u")
    assert domains.due("u", 300, 3001.0)


def test_the_environments_interval_overrides_every_spec(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(trust, "REFRESH_OVERRIDE", 2.0)
    domains = TrustDomains()
    domains.attempted("u", False, 10.0)
    assert not domains.due("u", 300, 11.9) and domains.due("u", 300, 12.0)
    assert trust._override("2") == 2.0 and trust._override(None) is None
    for bad in ("0", "fast", "-1"):
        with pytest.raises(ValueError, match="O41_TRUST_REFRESH_INTERVAL must be seconds"):
            trust._override(bad)
