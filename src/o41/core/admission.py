"""What the admission webhook decides about a change, as pure functions of the facts.

The organization rules say what may be picked, retired or deleted
(``o41.core.organization``); these say which of them a change brings into play:

- Only the picks a change makes are checked. Editing the namespaces of an organization
  whose cloud default later broke must still work; picking that default again must not.
- Retiring protects the fallback in force and the fallback shown in status: what the
  user reads in ``kubectl get organization`` is never retired from under them, even while
  the operator has not caught up with a change yet.

A TrustDomain's rules (``check_trust_domain``) need the other TrustDomains' issuers, which
CEL cannot see (one issuer is one trust domain), this cluster's own issuer and the networks
the chart allows keys to be fetched from.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from o41.core.addresses import AddressNotAllowed, Network, check_url
from o41.core.jwks import NotAJwks, parse_jwks, private_key_ids, signing_keys
from o41.core.organization import (
    Effective,
    LocationFacts,
    Picks,
    Refused,
    check_picks,
    check_retire,
    effective,
)
from o41.core.trust import API_SERVER_AUDIENCES, TrustPolicy


def picks_made(new: Picks, old: Picks | None = None) -> Picks:
    """The picks a change makes: the fallback if it changed, the cloud defaults that
    changed or were added. A creation (no ``old``) makes all of its picks."""
    before = old or Picks()
    return Picks(
        new.fallback if new.fallback != before.fallback else None,
        {
            cloud: name
            for cloud, name in new.cloud_defaults.items()
            if before.cloud_defaults.get(cloud) != name
        },
    )


def check_pick_change(
    organization: str,
    new: Picks,
    old: Picks | None,
    locations: Mapping[str, tuple[str, LocationFacts]],
) -> None:
    """Refuse a change whose new picks cannot serve writes (``check_picks``).

    ``locations`` maps each Location name the new picks name to (its organization,
    facts); a name missing from it does not exist."""
    check_picks(organization, picks_made(new, old), locations)


def retiring(was_retired: bool, retired: bool) -> bool:
    """The change retires the location (rather than leaving it or taking it back)."""
    return retired and not was_retired


def check_retire_change(
    location: str,
    organization: str,
    *,
    was_retired: bool,
    retired: bool,
    locations: Sequence[LocationFacts],
    picks: Picks,
    shown: Effective,
) -> None:
    """Refuse retiring the fallback: the one in force (what the rules give for
    ``locations`` in the order they were added, the ``picks`` and what status ``shown``)
    and the one status shows."""
    if not retiring(was_retired, retired):
        return
    in_force = effective(locations, picks, shown)
    check_retire(location, organization, in_force)
    if shown.fallback not in (None, in_force.fallback):
        check_retire(location, organization, shown)


# --- TrustDomain: one issuer, one domain; never the API server's audience -----------------

DEFAULT_AUDIENCES = ("o41",)  # the CRD's default (the model's), absent from the schema
_PEM = re.compile(r"-----BEGIN CERTIFICATE-----(.*?)-----END CERTIFICATE-----", re.S)


def check_trust_domain(
    name: str,
    spec: Mapping[str, Any],
    old_spec: Mapping[str, Any] | None,
    others: Mapping[str, str],
    *,
    own_issuer: str | None = None,
    allowed: Iterable[Network] = (),
) -> None:
    """Refuse a TrustDomain (created, or changed from ``old_spec``) that would be unsafe or
    ambiguous: another issuer than at creation; at creation, this cluster's ``own_issuer``
    or the issuer of another TrustDomain (``others``: name -> issuer); an audience of the
    API server; a new URL to fetch keys from at an address never fetched from, or not in a
    network the chart ``allowed`` (``o41.core.addresses``); a CA bundle with no PEM
    certificate; an inline JWKS that holds a private key or no usable public key.

    A change keeps what creation decided (an issuer that two TrustDomains made at the same
    instant share, ``o41.core.trust.issuer_owners``, or one admitted before a rule), so
    that the TrustDomain can still be edited, and its finalizers and annotations patched."""
    issuer = str(spec.get("issuer") or "")
    if old_spec is not None and old_spec.get("issuer") not in (None, issuer):
        raise Refused(
            f"TrustDomain {name!r}: spec.issuer cannot change after creation (it was "
            f"{old_spec.get('issuer')!r}): the tenants {name}:<namespace> are that issuer's. "
            "Make a new TrustDomain for the new issuer, name it in the Organizations' "
            "members, then delete this one"
        )
    if old_spec is None:
        check_issuer_unclaimed(name, issuer, others, own_issuer)
    check_audiences(name, issuer, spec.get("audiences") or DEFAULT_AUDIENCES)
    keys = spec.get("keys") or {}
    if keys.get("jwks") is not None:
        check_inline_jwks(name, str(keys["jwks"]))
    elif fetched_from(spec) != (fetched_from(old_spec) if old_spec is not None else None):
        try:  # the first URL the keys are fetched from; every later one at the fetch
            check_url(f"TrustDomain {name!r}", fetched_from(spec) or "", allowed)
        except AddressNotAllowed as e:
            raise Refused(str(e)) from None
    if spec.get("caBundle"):
        check_ca_bundle(name, str(spec["caBundle"]))


def fetched_from(spec: Mapping[str, Any]) -> str | None:
    """The first URL a TrustDomain's keys are fetched from (None: inline keys)."""
    keys = spec.get("keys") or {}
    if keys.get("jwks") is not None:
        return None
    return str(keys.get("jwksURL") or spec.get("issuer") or "")


def check_issuer_unclaimed(
    name: str, issuer: str, others: Mapping[str, str], own_issuer: str | None
) -> None:
    """A new TrustDomain's issuer is neither this cluster's nor another TrustDomain's."""
    if own_issuer is not None and issuer == own_issuer:
        raise Refused(own_issuer_named(name, issuer))
    for other, theirs in sorted(others.items()):
        if other != name and theirs == issuer:
            raise Refused(
                f"TrustDomain {name!r}: issuer {issuer!r} already belongs to TrustDomain "
                f"{other!r}, and one issuer is one trust domain (its tenants would be two). Use "
                f"TrustDomain {other!r} (name it in the Organizations' members, edit its "
                f"audiences), or delete it before making {name!r}"
            )


def own_issuer_named(name: str, issuer: str) -> str:
    """What a TrustDomain naming this cluster's own issuer is told (refused, or ignored)."""
    return (
        f"TrustDomain {name!r}: issuer {issuer!r} is this cluster's own (the iss of its "
        "service account tokens): this cluster's pods are checked by its TokenReview, which "
        "sees a deleted pod's token revoked, and need no TrustDomain. List their namespaces "
        "in the Organizations' spec.namespaces; a TrustDomain is for another cluster's issuer"
    )


def check_ca_bundle(name: str, text: str) -> None:
    """spec.caBundle: PEM certificates, each a DER sequence (the fetch parses them fully)."""
    blocks = _PEM.findall(text)
    if not blocks or not all(_der_sequence(block) for block in blocks):
        raise Refused(
            f"TrustDomain {name!r}: spec.caBundle holds no usable PEM certificate: give the "
            "PEM text (-----BEGIN CERTIFICATE-----...) of the CA that signed the issuer's "
            "certificate"
        )


def _der_sequence(block: str) -> bool:
    try:
        return base64.b64decode("".join(block.split()), validate=True)[:1] == b"\x30"
    except binascii.Error:
        return False


def check_audiences(name: str, issuer: str, audiences: Sequence[str]) -> None:
    """The policy's own rule (``TrustPolicy``): never an API server's audience."""
    try:
        TrustPolicy(name, issuer, frozenset(audiences))
    except ValueError:
        refused = sorted(set(audiences) & (API_SERVER_AUDIENCES | {issuer}))
        raise Refused(
            f"TrustDomain {name!r}: spec.audiences {refused} are the API server's (its "
            "default audiences, or the issuer itself): a token with such an audience is a "
            "credential to that cluster, and whoever holds one must not be able to use it "
            "here. Use an audience of this service instead, e.g. 'o41' (the pods ask for it "
            "in their serviceAccountToken projection)"
        ) from None


def check_inline_jwks(name: str, text: str) -> None:
    """spec.keys.jwks: a JWKS, public keys only, at least one usable (RS256 or ES256)."""
    try:
        jwks = parse_jwks(text)
    except NotAJwks as e:
        raise Refused(
            f"TrustDomain {name!r}: spec.keys.jwks {e}. Paste the output of "
            "`kubectl get --raw /openid/v1/jwks` in the issuer's cluster"
        ) from None
    private = private_key_ids(jwks)
    if private:
        raise Refused(
            f"TrustDomain {name!r}: spec.keys.jwks holds private key material (key "
            f"{private[0]!r} has a private member such as 'd'): give only the public keys "
            "(`kubectl get --raw /openid/v1/jwks` in the issuer's cluster), and replace the "
            "leaked key at the issuer"
        )
    if not signing_keys(jwks):
        raise Refused(
            f"TrustDomain {name!r}: spec.keys.jwks has no usable key among its "
            f"{len(jwks['keys'])}: tokens are verified with RS256 (kty RSA) or ES256 (kty EC, "
            "crv P-256) public keys that have a kid and are for signatures (use sig). Paste "
            "the output of `kubectl get --raw /openid/v1/jwks` in the issuer's cluster"
        )
