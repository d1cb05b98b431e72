"""What the admission webhook checks of a change, without any cluster: examples, and
hypothesis properties (``o41.core.admission``)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from o41.core.admission import (
    check_pick_change,
    check_retire_change,
    check_trust_domain,
    picks_made,
    retiring,
)
from o41.core.jwks import PRIVATE_MEMBERS
from o41.core.organization import Effective, LocationFacts, Picks, Refused, effective
from o41.core.trust import API_SERVER_AUDIENCES


def loc(name: str, cloud: str = "aws", region: str = "us-east-1", **kw: bool) -> LocationFacts:
    kw.setdefault("ready", True)
    return LocationFacts(name, cloud, region, **kw)


# --- only the picks a change makes ---------------------------------------------------------


def test_a_creation_makes_all_its_picks() -> None:
    new = Picks("a", {"aws": "a", "gcp": "g"})
    assert picks_made(new, None) == new


def test_an_edit_that_picks_nothing_new_makes_no_pick() -> None:
    old = Picks("a", {"aws": "a"})
    assert picks_made(Picks("a", {"aws": "a"}), old) == Picks(None, {})


def test_only_the_changed_fallback_and_defaults_are_picks() -> None:
    old = Picks("a", {"aws": "a", "gcp": "g"})
    made = picks_made(Picks("b", {"aws": "a", "gcp": "h", "azure": "z"}), old)
    assert made == Picks("b", {"gcp": "h", "azure": "z"})


def test_editing_an_organization_whose_default_broke_still_works() -> None:
    """Its cloud default later became not Ready: a change of something else (its
    namespaces) leaves the picks alone, so it is not refused."""
    picks = Picks("a", {"gcp": "g"})
    known = {"a": ("ml", loc("a")), "g": ("ml", loc("g", "gcp", "us-central1", ready=False))}
    check_pick_change("ml", picks, picks, known)
    with pytest.raises(Refused, match="is not Ready"):
        check_pick_change("ml", picks, Picks("a", {}), known)  # picking it again is checked


def test_a_new_pick_of_a_missing_location_is_refused_naming_it() -> None:
    with pytest.raises(Refused, match="'nowhere' does not exist"):
        check_pick_change("ml", Picks("nowhere"), Picks("a"), {"a": ("ml", loc("a"))})


# --- the fallback in force and the one shown are protected --------------------------------


def test_retiring_the_fallback_in_force_is_refused() -> None:
    with pytest.raises(Refused, match="make another location the fallback first"):
        check_retire_change(
            "a",
            "ml",
            was_retired=False,
            retired=True,
            locations=[loc("a"), loc("b")],
            picks=Picks(),
            shown=Effective(),
        )


def test_retiring_the_fallback_status_shows_is_refused_while_the_operator_catches_up() -> None:
    """The user picked b; status still shows a (the operator has not caught up): a stays
    protected until status shows the change."""
    with pytest.raises(Refused, match="'a' is the fallback"):
        check_retire_change(
            "a",
            "ml",
            was_retired=False,
            retired=True,
            locations=[loc("a"), loc("b")],
            picks=Picks("b"),
            shown=Effective("a", {"aws": "a"}, True),
        )


def test_retiring_another_location_or_a_retired_one_again_passes() -> None:
    kw = {"locations": [loc("a"), loc("b")], "picks": Picks(), "shown": Effective("a")}
    check_retire_change("b", "ml", was_retired=False, retired=True, **kw)  # type: ignore[arg-type]
    check_retire_change("a", "ml", was_retired=True, retired=True, **kw)  # type: ignore[arg-type]
    check_retire_change("a", "ml", was_retired=False, retired=False, **kw)  # type: ignore[arg-type]


# --- properties ---------------------------------------------------------------------------

NAMES = [f"l{i}" for i in range(6)]
CLOUDS = ["aws", "gcp", "r2"]
names = st.none() | st.sampled_from(NAMES)
picks = st.builds(
    Picks,
    fallback=names,
    cloud_defaults=st.dictionaries(st.sampled_from(CLOUDS), st.sampled_from(NAMES)),
)
facts = st.builds(
    LocationFacts,
    name=st.sampled_from(NAMES),
    cloud=st.sampled_from(CLOUDS),
    region=st.just("r1"),
    retired=st.booleans(),
    ready=st.booleans(),
    unfinished=st.booleans(),
)


@given(new=picks, old=st.none() | picks)
def test_picks_made_are_exactly_what_changed(new: Picks, old: Picks | None) -> None:
    made = picks_made(new, old)
    before = old or Picks()
    assert made.fallback == (new.fallback if new.fallback != before.fallback else None)
    for cloud, name in new.cloud_defaults.items():
        assert (cloud in made.cloud_defaults) == (before.cloud_defaults.get(cloud) != name)
    assert set(made.cloud_defaults) <= set(new.cloud_defaults)
    assert picks_made(new, new) == Picks(None, {})  # no change, nothing to check


@given(
    new=picks,
    old=picks,
    locations=st.lists(facts, max_size=6, unique_by=lambda f: f.name),
    organizations=st.dictionaries(st.sampled_from(NAMES), st.sampled_from(["ml", "other"])),
)
def test_a_change_is_refused_only_for_a_pick_it_makes(
    new: Picks, old: Picks, locations: list[LocationFacts], organizations: dict[str, str]
) -> None:
    known = {f.name: (organizations.get(f.name, "ml"), f) for f in locations}
    made = picks_made(new, old)
    named = [n for n in (made.fallback, *made.cloud_defaults.values()) if n is not None]

    def usable(name: str, cloud: str | None) -> bool:
        found = known.get(name)
        return (
            found is not None
            and found[0] == "ml"
            and not found[1].retired
            and found[1].ready
            and (cloud is None or found[1].cloud == cloud)
        )

    fine = (made.fallback is None or usable(made.fallback, None)) and all(
        usable(n, c) for c, n in made.cloud_defaults.items()
    )
    if fine:
        check_pick_change("ml", new, old, known)
        return
    with pytest.raises(Refused) as refused:
        check_pick_change("ml", new, old, known)
    assert any(repr(n) in str(refused.value) for n in named)  # it names the pick refused


@given(
    locations=st.lists(facts, max_size=6, unique_by=lambda f: f.name),
    chosen=picks,
    shown_fallback=names,
    name=st.sampled_from(NAMES),
    was_retired=st.booleans(),
    retired=st.booleans(),
)
def test_retiring_is_refused_exactly_for_the_fallback_in_force_or_shown(
    locations: list[LocationFacts],
    chosen: Picks,
    shown_fallback: str | None,
    name: str,
    was_retired: bool,
    retired: bool,
) -> None:
    shown = Effective(shown_fallback)
    in_force = effective(locations, chosen, shown)
    protected = name in {in_force.fallback, shown.fallback}

    def check() -> None:
        check_retire_change(
            name,
            "ml",
            was_retired=was_retired,
            retired=retired,
            locations=locations,
            picks=chosen,
            shown=shown,
        )

    if not (retiring(was_retired, retired) and protected):
        check()
        return
    with pytest.raises(Refused, match="make another location the fallback first"):
        check()


# --- TrustDomain: one issuer, one domain; no API server audience; public keys only --------

ISSUER = "https://oidc.cluster-b.example"
RSA_PUBLIC = {"kty": "RSA", "kid": "k1", "n": "sXch", "e": "AQAB", "alg": "RS256", "use": "sig"}
EC_PUBLIC = {"kty": "EC", "kid": "k2", "crv": "P-256", "x": "f83O", "y": "x_FE"}


def td(issuer: str = ISSUER, **spec: Any) -> dict[str, Any]:
    return {"issuer": issuer, **spec}


def inline(*keys: dict[str, Any]) -> dict[str, Any]:
    return {"jwks": json.dumps({"keys": list(keys)})}


def test_a_new_trust_domain_with_its_own_issuer_is_accepted() -> None:
    check_trust_domain("cluster-b", td(), None, {"cluster-c": "https://oidc.cluster-c.example"})
    check_trust_domain("cluster-b", td(keys=inline(RSA_PUBLIC, EC_PUBLIC)), None, {})


def test_an_issuer_of_another_trust_domain_is_refused_naming_it() -> None:
    with pytest.raises(Refused) as caught:
        check_trust_domain("b2", td(), None, {"cluster-b": ISSUER})
    message = str(caught.value)
    assert f"issuer {ISSUER!r} already belongs to TrustDomain 'cluster-b'" in message
    assert "Use TrustDomain 'cluster-b'" in message and "or delete it" in message


def test_an_update_does_not_collide_with_itself() -> None:
    check_trust_domain("cluster-b", td(audiences=["o41", "x"]), td(), {"cluster-b": ISSUER})


def test_another_issuer_than_at_creation_is_refused() -> None:
    with pytest.raises(
        Refused, match=r"spec\.issuer cannot change after creation.*new TrustDomain"
    ):
        check_trust_domain("cluster-b", td("https://other.example"), td(), {"cluster-b": ISSUER})


@pytest.mark.parametrize(
    "audience",
    [*sorted(API_SERVER_AUDIENCES), ISSUER],
)
def test_an_api_server_audience_is_refused(audience: str) -> None:
    with pytest.raises(Refused) as caught:
        check_trust_domain("cluster-b", td(audiences=["o41", audience]), None, {})
    message = str(caught.value)
    assert f"spec.audiences [{audience!r}] are the API server's" in message
    assert "e.g. 'o41'" in message


@given(
    st.lists(st.text(min_size=1, max_size=20), max_size=4),
    st.sampled_from(sorted(API_SERVER_AUDIENCES)),
)
def test_any_audiences_holding_an_api_server_one_are_refused(
    others: list[str], refused: str
) -> None:
    with pytest.raises(Refused, match="are the API server's"):
        check_trust_domain("cluster-b", td(audiences=[*others, refused]), None, {})


@given(st.lists(st.text(min_size=1, max_size=20), min_size=1, max_size=4))
def test_audiences_of_this_service_alone_are_accepted(audiences: list[str]) -> None:
    mine = [a for a in audiences if a not in API_SERVER_AUDIENCES | {ISSUER}] or ["o41"]
    check_trust_domain("cluster-b", td(audiences=mine), None, {})


@pytest.mark.parametrize(
    ("keys", "said"),
    [
        ({"jwks": "{not json"}, "spec.keys.jwks is not JSON"),
        ({"jwks": "[1, 2]"}, 'is not a JWKS: a JSON object with a "keys" list'),
        ({"jwks": "[" * 100_000}, "is not"),
        (inline({**RSA_PUBLIC, "d": "secret"}), "holds private key material (key 'k1'"),
        (inline(RSA_PUBLIC, {"kty": "oct", "k": "c2VjcmV0"}), "(key '#1' has a private"),
        (inline(), "no usable key among its 0"),
        (inline({**RSA_PUBLIC, "alg": "HS256"}), "no usable key among its 1"),
        (inline({**EC_PUBLIC, "crv": "P-384"}), "no usable key"),
        (inline({**RSA_PUBLIC, "use": "enc"}), "no usable key"),
        (inline({k: v for k, v in RSA_PUBLIC.items() if k != "kid"}), "no usable key"),
    ],
    ids=[
        "not-json",
        "not-a-jwks",
        "deep",
        "private-rsa",
        "symmetric",
        "empty",
        "hs256",
        "p384",
        "encryption",
        "no-kid",
    ],
)
def test_an_inline_jwks_needs_a_usable_public_key_and_no_private_one(
    keys: dict[str, Any], said: str
) -> None:
    with pytest.raises(Refused) as caught:
        check_trust_domain("cluster-b", td(keys=keys), None, {})
    assert said in str(caught.value)
    assert "TrustDomain 'cluster-b'" in str(caught.value)


@given(st.dictionaries(st.sampled_from(sorted(PRIVATE_MEMBERS)), st.text(max_size=8), min_size=1))
def test_any_private_member_refuses_the_jwks(private: dict[str, str]) -> None:
    keys = inline(RSA_PUBLIC, {**EC_PUBLIC, **private})
    with pytest.raises(Refused, match="private key material"):
        check_trust_domain("cluster-b", td(keys=keys), None, {})


# --- issue 37: this cluster's own issuer; where keys are fetched from; the CA bundle --------


def test_this_clusters_own_issuer_is_refused() -> None:
    own = "https://kubernetes.default.svc.cluster.local"
    with pytest.raises(Refused) as caught:
        check_trust_domain("hub", td(own), None, {}, own_issuer=own)
    assert str(caught.value).startswith(
        f"TrustDomain 'hub': issuer {own!r} is this cluster's own (the iss of its service "
        "account tokens): this cluster's pods are checked by its TokenReview"
    )
    check_trust_domain("b", td(), None, {}, own_issuer=own)
    check_trust_domain("hub", td(own), None, {}, own_issuer=None)  # unknown: not refused


@pytest.mark.parametrize(
    "spec",
    [
        td("https://169.254.169.254"),
        td("https://metadata.google.internal/computeMetadata/v1"),
        td(ISSUER, keys={"jwksURL": "https://[fe80::1]/keys"}),
        td("https://127.0.0.1:6443"),
        td(ISSUER, keys={"jwksURL": "https://10.0.0.1/openid/v1/jwks"}),
    ],
)
def test_a_url_keys_would_be_fetched_from_at_a_refused_address_is_refused(
    spec: dict[str, Any],
) -> None:
    with pytest.raises(Refused) as caught:
        check_trust_domain("cluster-b", spec, None, {})
    assert str(caught.value).startswith("TrustDomain 'cluster-b': https://")


def test_loopback_and_private_issuers_pass_where_the_chart_allows_them() -> None:
    from o41.core.addresses import parse_networks

    allowed = parse_networks("127.0.0.0/8,10.0.0.0/8")
    check_trust_domain("b", td("https://127.0.0.1:6443"), None, {}, allowed=allowed)
    jwks_url = {"jwksURL": "https://10.0.0.1/openid/v1/jwks"}
    check_trust_domain("b", td(keys=jwks_url), None, {}, allowed=allowed)
    with pytest.raises(Refused, match="never fetched from there"):
        check_trust_domain("b", td("https://169.254.169.254"), None, {}, allowed=allowed)
    # inline keys: the issuer is a name in the tokens, never fetched
    check_trust_domain("b", td("https://10.9.9.9", keys=inline(RSA_PUBLIC)), None, {})


def test_a_ca_bundle_without_a_pem_certificate_is_refused() -> None:
    for bundle in (
        "not a certificate",
        "-----BEGIN CERTIFICATE-----\n!!\n-----END CERTIFICATE-----",
    ):
        with pytest.raises(Refused, match=r"spec\.caBundle holds no usable PEM certificate"):
            check_trust_domain("b", td(caBundle=bundle), None, {})
    der = "MIIBszCC"  # a DER SEQUENCE's first bytes, base64
    check_trust_domain(
        "b", td(caBundle=f"-----BEGIN CERTIFICATE-----\n{der}\n-----END CERTIFICATE-----"), None, {}
    )


def test_a_change_keeps_what_creation_decided_so_it_can_be_edited_and_deleted() -> None:
    """Two TrustDomains made at the same instant share an issuer; one made before the own
    issuer or address rules names what they now refuse: kopf still patches their
    annotations and finalizers, and their admins edit them (the service ignores the ones
    that are not the issuer's owner)."""
    own = "https://kubernetes.default.svc.cluster.local"
    check_trust_domain("b2", td(), td(), {"cluster-b": ISSUER, "b2": ISSUER})
    check_trust_domain("hub", td(own), td(own), {}, own_issuer=own)
    private = td("https://10.0.0.1")
    check_trust_domain("b", private, private, {})
    with pytest.raises(Refused, match=r"is at 10\.0\.0\.2, a private address"):
        check_trust_domain(
            "b", td("https://10.0.0.1", keys={"jwksURL": "https://10.0.0.2/k"}), private, {}
        )
