"""Where an issuer's keys may be fetched from (``o41.core.addresses``): examples of each
range, and properties over every address (hypothesis). No DNS, no connection: the fetch
that applies it is tests/placement/test_trust_keys.py."""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given
from hypothesis import strategies as st

from o41.core.addresses import (
    ALLOW_VALUE,
    AddressNotAllowed,
    Network,
    address_refusal,
    check_url,
    host_refusal,
    parse_networks,
)

EVERYTHING = (ipaddress.ip_network("0.0.0.0/0"), ipaddress.ip_network("::/0"))
LOOPBACK = parse_networks("127.0.0.0/8, ::1/128")

NEVER = [
    "169.254.169.254",  # AWS, GCP, Azure, OCI instance metadata
    "169.254.170.2",  # ECS task metadata
    "::ffff:169.254.169.254",  # the same, IPv4-mapped
    "::ffff:a9fe:a9fe",
    "64:ff9b::a9fe:a9fe",  # through NAT64
    "2002:a9fe:a9fe::1",  # 6to4 of it
    "::169.254.169.254",  # IPv4-compatible
    "fe80::1",
    "fe80::a9fe:a9fe%eth0",
    "fd00:ec2::254",  # AWS's IPv6 metadata
    "fd20:ce::254",  # GCP's IPv6 metadata
    "100.100.100.200",  # Alibaba's metadata
    "168.63.129.16",  # Azure's WireServer
    "0.0.0.0",
    "0.1.2.3",
    "::",
    "224.0.0.1",
    "ff02::1",
    "255.255.255.255",
    "240.0.0.1",
    "192.0.0.192",
]
UNLESS_ALLOWED = [
    ("127.0.0.1", "loopback"),
    ("127.8.9.10", "loopback"),
    ("::1", "loopback"),
    ("::ffff:127.0.0.1", "loopback"),
    ("10.1.2.3", "a private address"),
    ("172.20.0.1", "a private address"),
    ("192.168.1.1", "a private address"),
    ("fd12:3456::1", "a private address (unique local)"),
    ("100.64.0.1", "shared address space (carrier-grade NAT)"),
    ("198.18.0.1", "a benchmarking address"),
    ("2001:db8::1", "a documentation address"),
]
PUBLIC = ["8.8.8.8", "1.1.1.1", "35.190.0.1", "2606:4700:4700::1111", "::ffff:8.8.8.8"]


@pytest.mark.parametrize("address", NEVER)
def test_link_local_metadata_and_this_host_are_never_fetched_from(address: str) -> None:
    for allowed in ((), LOOPBACK, EVERYTHING):
        refusal = address_refusal(ipaddress.ip_address(address), allowed)
        assert refusal is not None and not refusal.allowable, (address, allowed)
        assert refusal.address.split(" ")[0] == str(ipaddress.ip_address(address))


@pytest.mark.parametrize(("address", "kind"), UNLESS_ALLOWED)
def test_loopback_and_private_ranges_only_where_allowed(address: str, kind: str) -> None:
    ip = ipaddress.ip_address(address)
    refusal = address_refusal(ip)
    assert refusal is not None and (refusal.kind, refusal.allowable) == (kind, True)
    assert address_refusal(ip, EVERYTHING) is None
    assert address_refusal(ip, parse_networks(refusal.hint)) is None  # the hint allows it
    other = parse_networks("203.0.113.0/24, 2001:db8:ffff::/48")
    assert address_refusal(ip, other) is not None


@pytest.mark.parametrize("address", PUBLIC)
def test_public_addresses_are_fetched_from(address: str) -> None:
    assert address_refusal(ipaddress.ip_address(address)) is None


@pytest.mark.parametrize(
    ("host", "kind", "allowable"),
    [
        ("metadata.google.internal", "a cloud metadata host name", False),
        ("METADATA.Google.Internal.", "a cloud metadata host name", False),
        ("metadata", "a cloud metadata host name", False),
        ("metadata.goog", "a cloud metadata host name", False),
        ("instance-data.ec2.internal", "a cloud metadata host name", False),
        ("169.254.169.254", "link-local, where clouds serve instance metadata and credentials",
         False),
        ("[fe80::1%25eth0]", "link-local, where clouds serve instance metadata and credentials",
         False),
        ("localhost", "loopback", True),
        ("oidc.localhost", "loopback", True),
        ("0x7f.1", "loopback", True),  # the legacy forms a resolver still reads
        ("2130706433", "loopback", True),
        ("127.1", "loopback", True),
        ("0251.0376.0251.0376", "link-local, where clouds serve instance metadata and "
         "credentials", False),
    ],
)  # fmt: skip
def test_host_names_and_literals_by_their_text(host: str, kind: str, allowable: bool) -> None:
    refusal = host_refusal(host)
    assert refusal is not None and (refusal.kind, refusal.allowable) == (kind, allowable)


def test_other_names_wait_for_what_they_resolve_to() -> None:
    for host in ("oidc.eks.us-east-1.amazonaws.com", "container.googleapis.com", "cafe.de"):
        assert host_refusal(host) is None
    assert host_refusal("localhost", LOOPBACK) is None


def test_a_refused_url_names_itself_the_address_and_the_fix() -> None:
    with pytest.raises(AddressNotAllowed) as never:
        check_url("TrustDomain 'b'", "https://169.254.169.254/latest/meta-data/")
    assert str(never.value) == (
        "TrustDomain 'b': https://169.254.169.254/latest/meta-data/ is at 169.254.169.254, "
        "link-local, where clouds serve instance metadata and credentials: keys are never "
        "fetched from there (it could hand out this cluster's own credentials). Give the "
        "issuer's own URL (spec.issuer, spec.keys.jwksURL), or its keys inline in "
        "spec.keys.jwks"
    )
    with pytest.raises(AddressNotAllowed) as private:
        check_url("TrustDomain 'b'", "https://10.1.2.3:6443")
    assert str(private.value) == (
        "TrustDomain 'b': https://10.1.2.3:6443 is at 10.1.2.3, a private address: keys are "
        "fetched only from public addresses unless the chart allows that network: add "
        f"10.1.2.3/32 (or its network) to the chart's value {ALLOW_VALUE} "
        "(O41_TRUST_ALLOWED_NETWORKS), or give the keys inline in spec.keys.jwks"
    )
    check_url("TrustDomain 'b'", "https://10.1.2.3:6443", parse_networks("10.0.0.0/8"))
    check_url("TrustDomain 'b'", "https://oidc.example.com/x")


def test_the_allowed_networks_are_cidrs() -> None:
    assert parse_networks("") == ()
    assert parse_networks("10.0.0.0/8,127.0.0.1/32  fd00::/8") == (
        ipaddress.ip_network("10.0.0.0/8"),
        ipaddress.ip_network("127.0.0.1/32"),
        ipaddress.ip_network("fd00::/8"),
    )
    with pytest.raises(ValueError, match="holds 'ten', which is not a network"):
        parse_networks("10.0.0.0/8,ten")


# --- properties ---------------------------------------------------------------------------

ipv4 = st.integers(0, 2**32 - 1).map(ipaddress.IPv4Address)
ipv6 = st.integers(0, 2**128 - 1).map(ipaddress.IPv6Address)
link_local_v4 = st.integers(0, 2**16 - 1).map(lambda n: ipaddress.IPv4Address(0xA9FE0000 + n))
networks: st.SearchStrategy[tuple[Network, ...]] = st.lists(
    st.one_of(
        st.tuples(ipv4, st.integers(0, 32)).map(
            lambda t: ipaddress.ip_network(f"{t[0]}/{t[1]}", strict=False)
        ),
        st.tuples(ipv6, st.integers(0, 128)).map(
            lambda t: ipaddress.ip_network(f"{t[0]}/{t[1]}", strict=False)
        ),
    ),
    max_size=4,
).map(tuple)


def wrapped(a: ipaddress.IPv4Address) -> list[ipaddress.IPv6Address]:
    """IPv6 addresses that reach ``a``: mapped, NAT64, 6to4."""
    n = int(a)
    return [
        ipaddress.IPv6Address((0xFFFF << 32) | n),
        ipaddress.IPv6Address((0x64FF9B << 96) | n),
        ipaddress.IPv6Address((0x2002 << 112) | (n << 80) | 1),
    ]


@given(link_local_v4, networks)
def test_no_allowance_ever_lets_link_local_through_in_any_form(
    address: ipaddress.IPv4Address, allowed: tuple[Network, ...]
) -> None:
    forms: list[ipaddress.IPv4Address | ipaddress.IPv6Address] = [address, *wrapped(address)]
    for form in forms:
        refusal = address_refusal(form, (*allowed, *EVERYTHING))
        assert refusal is not None and not refusal.allowable, form


@given(ipv4, networks)
def test_an_ipv4_mapped_address_is_judged_as_its_ipv4(
    address: ipaddress.IPv4Address, allowed: tuple[Network, ...]
) -> None:
    v4 = address_refusal(address, allowed)
    mapped = address_refusal(wrapped(address)[0], allowed)
    assert (v4 is None) == (mapped is None)
    if v4 is not None and mapped is not None:
        assert (v4.kind, v4.allowable) == (mapped.kind, mapped.allowable)


@given(st.one_of(ipv4, ipv6), networks, networks)
def test_allowing_more_never_refuses_more_and_never_lets_the_never_ranges_through(
    address: ipaddress.IPv4Address | ipaddress.IPv6Address,
    some: tuple[Network, ...],
    more: tuple[Network, ...],
) -> None:
    before = address_refusal(address, some)
    after = address_refusal(address, some + more)
    if before is None:
        assert after is None
    elif not before.allowable:
        assert after == before


@given(ipv4)
def test_every_ipv4_address_python_calls_non_public_is_refused_without_an_allowance(
    address: ipaddress.IPv4Address,
) -> None:
    non_public = (
        address.is_private
        or address.is_loopback
        or address.is_link_local
        or address.is_multicast
        or address.is_reserved
        or address.is_unspecified
        or address in ipaddress.ip_network("100.64.0.0/10")
    )
    if non_public:
        assert address_refusal(address) is not None


@given(ipv6)
def test_every_ipv6_address_python_calls_non_public_is_refused_without_an_allowance(
    address: ipaddress.IPv6Address,
) -> None:
    if address.ipv4_mapped is not None:
        return  # judged as its IPv4 (above)
    non_public = (
        address.is_private
        or address.is_loopback
        or address.is_link_local
        or address.is_site_local
        or address.is_multicast
        or address.is_unspecified
    )
    if non_public:
        assert address_refusal(address) is not None
