"""One issuer, one trust domain (``o41.core.trust.issuer_owners``): of the TrustDomains
naming an issuer, the oldest owns it, by what no user can write. Every replica of the
service and the operator apply it to what they know; the real processes are
tests/attack/test_attack_trust.py."""

from __future__ import annotations

from random import Random

from hypothesis import given
from hypothesis import strategies as st

from o41.core.trust import IssuerClaim, issuer_conflict, issuer_owners

ISSUER = "https://oidc.cluster-b.example"


def claim(name: str, created: str, uid: str | None = None, issuer: str = ISSUER) -> IssuerClaim:
    return IssuerClaim(issuer, name, uid or f"uid-{name}", created)


def test_the_oldest_owns_the_issuer_then_the_first_name_then_the_first_uid() -> None:
    z0 = claim("z0", "2026-12-05T12:00:00Z")
    a0 = claim("a0", "2026-12-05T12:00:01Z")
    assert issuer_owners([a0, z0])[ISSUER] == z0
    same_second = claim("a0", "2026-12-05T12:00:00Z")
    assert issuer_owners([z0, same_second])[ISSUER] == same_second
    twin = claim("a0", "2026-12-05T12:00:00Z", uid="uid-0")
    assert issuer_owners([same_second, twin])[ISSUER] == twin
    other = claim("c", "2020-01-01T00:00:00Z", issuer="https://other.example")
    assert issuer_owners([z0, other]) == {ISSUER: z0, other.issuer: other}


def test_a_claim_that_is_not_the_owner_says_which_is_and_what_to_do() -> None:
    z0 = claim("z0", "2026-12-05T12:00:00Z")
    a0 = claim("a0", "2026-12-05T12:00:01Z")
    assert issuer_conflict(z0, [a0]) is None
    assert issuer_conflict(z0, [z0, a0]) is None
    assert issuer_conflict(a0, [z0, a0]) == (
        f"TrustDomain 'a0': issuer {ISSUER!r} belongs to TrustDomain 'z0', the oldest of the "
        "TrustDomains naming it (made 2026-12-05T12:00:00Z): one issuer is one trust domain, "
        "so this one is ignored and that issuer's tokens are z0:<namespace>. Delete "
        "TrustDomain 'a0'; or, to keep this one, delete 'z0' (its tenants' data stays under "
        "its name)"
    )


def test_a_time_that_does_not_parse_never_beats_one_that_does() -> None:
    made = claim("z", "2026-12-05T12:00:00Z")
    assert issuer_owners([claim("a", ""), made])[ISSUER] == made
    assert issuer_owners([claim("a", "yesterday"), made])[ISSUER] == made


seconds = st.integers(0, 5)  # few instants: many claims made at the same one
claims = st.lists(
    st.builds(
        lambda issuer, name, uid, second: IssuerClaim(
            f"https://issuer-{issuer}.example", name, uid, f"2026-12-05T12:00:0{second}Z"
        ),
        st.integers(0, 2),
        st.sampled_from(["a", "b", "c", "z0", "a0"]),
        st.sampled_from(["u1", "u2", "u3", "u4"]),
        seconds,
    ),
    max_size=8,
    unique_by=lambda c: c.uid,
)


@given(claims, st.randoms(use_true_random=False))
def test_every_order_of_the_same_claims_decides_the_same(
    found: list[IssuerClaim], random: Random
) -> None:
    """Replicas see TrustDomains in different orders (watch, list, restart)."""
    shuffled = list(found)
    random.shuffle(shuffled)
    assert issuer_owners(shuffled) == issuer_owners(found)


@given(claims)
def test_the_owner_is_the_oldest_claim_of_its_issuer_and_the_only_one(
    found: list[IssuerClaim],
) -> None:
    owners = issuer_owners(found)
    assert set(owners) == {c.issuer for c in found}
    for issuer, owner in owners.items():
        mine = [c for c in found if c.issuer == issuer]
        assert owner in mine
        assert owner.order == min(c.order for c in mine)
        assert [c for c in mine if issuer_conflict(c, found) is None] == [owner]


@given(claims, st.sampled_from(["a", "zz"]))
def test_a_later_trust_domain_never_takes_an_issuer(found: list[IssuerClaim], name: str) -> None:
    """Admission refuses a second TrustDomain once the first is listed: only ones made at
    the same instant are both admitted, and then the rule is fixed by what both say."""
    owners = issuer_owners(found)
    later = [
        IssuerClaim(issuer, name, "u-new", "2026-12-05T12:00:06Z")  # after every other
        for issuer in owners
    ]
    assert issuer_owners([*found, *later]) == owners


@given(claims)
def test_removing_a_claim_that_owns_nothing_changes_no_owner(found: list[IssuerClaim]) -> None:
    owners = issuer_owners(found)
    for c in found:
        if owners[c.issuer] != c:
            assert issuer_owners([x for x in found if x != c]) == owners
