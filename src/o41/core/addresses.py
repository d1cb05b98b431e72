"""Where an issuer's keys may be fetched from: which hosts and addresses the operator and
the placement service connect to for a TrustDomain. Plain functions of data: no DNS, no
I/O. The fetch (``o41.kube.trust_keys``) checks every URL it is about to ask (each redirect
hop) and every address a name resolves to, before connecting; admission checks the URL a
TrustDomain gives.

A TrustDomain names a URL; a user who may write one must not be able to make the hub ask
its own cloud's metadata service (the node's credentials) or its internal services. So:

- never: link-local (169.254.0.0/16, fe80::/10: where clouds serve instance metadata),
  the cloud metadata addresses and host names, "this host" (0.0.0.0/8, ::), multicast,
  broadcast and reserved ranges;
- only where the chart allows that network (``trustDomains.allowedNetworks``): loopback,
  private ranges (RFC 1918, unique local), shared address space (100.64.0.0/10) and the
  other ranges that are not public (an on-prem cluster's issuer may live there);
- any public address.

An IPv6 address that carries an IPv4 one (IPv4-mapped, NAT64, 6to4, Teredo) is judged by
both: ``::ffff:169.254.169.254`` is link-local.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network

ALLOW_VALUE = "trustDomains.allowedNetworks"  # the chart's value
ALLOW_ENV = "O41_TRUST_ALLOWED_NETWORKS"  # what the chart sets from it, for both servers

_METADATA = "a cloud metadata address"
# Never connected to, whatever the chart allows.
NEVER: tuple[tuple[str, str], ...] = (
    ("0.0.0.0/8", "'this host' (0.0.0.0 reaches the host itself)"),
    ("169.254.0.0/16", "link-local, where clouds serve instance metadata and credentials"),
    ("100.100.100.200/32", _METADATA),
    ("168.63.129.16/32", "a cloud host address (Azure's WireServer)"),
    ("192.0.0.0/24", "reserved for protocol assignments (IANA)"),
    ("224.0.0.0/4", "multicast"),
    ("240.0.0.0/4", "reserved (and broadcast)"),
    ("::/128", "unspecified (reaches the host itself)"),
    ("100::/64", "discard-only"),
    ("fe80::/10", "link-local, where clouds serve instance metadata and credentials"),
    ("fec0::/10", "site-local (deprecated)"),
    ("ff00::/8", "multicast"),
    ("fd00:ec2::/32", _METADATA),
    ("fd20:ce::254/128", _METADATA),
)
# Connected to only when the chart allows the network: not public, but an issuer of one's
# own may live there.
UNLESS_ALLOWED: tuple[tuple[str, str], ...] = (
    ("127.0.0.0/8", "loopback"),
    ("10.0.0.0/8", "a private address"),
    ("172.16.0.0/12", "a private address"),
    ("192.168.0.0/16", "a private address"),
    ("100.64.0.0/10", "shared address space (carrier-grade NAT)"),
    ("198.18.0.0/15", "a benchmarking address"),
    ("192.0.2.0/24", "a documentation address"),
    ("198.51.100.0/24", "a documentation address"),
    ("203.0.113.0/24", "a documentation address"),
    ("192.88.99.0/24", "a 6to4 relay address"),
    ("::1/128", "loopback"),
    ("fc00::/7", "a private address (unique local)"),
    ("2001::/23", "reserved for protocol assignments (IANA)"),
    ("2001:db8::/32", "a documentation address"),
    ("3fff::/20", "a documentation address"),
    ("64:ff9b:1::/48", "a local NAT64 address"),
)
# Host names that only ever mean a cloud's metadata service.
METADATA_HOSTS = frozenset(
    {
        "metadata",
        "metadata.google.internal",
        "metadata.goog",
        "instance-data",
        "instance-data.ec2.internal",
        "metadata.tencentyun.com",
    }
)
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
_COMPATIBLE = ipaddress.IPv6Network("::/96")  # deprecated IPv4-compatible IPv6

_NEVER = tuple((ipaddress.ip_network(n), why) for n, why in NEVER)
_UNLESS = tuple((ipaddress.ip_network(n), why) for n, why in UNLESS_ALLOWED)


class AddressNotAllowed(ValueError):
    """A URL whose host or address is not fetched from; the message names the URL, the
    address and the fix."""


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why an address is not connected to; ``allowable``: the chart could allow it."""

    address: str
    kind: str
    allowable: bool
    hint: str = ""  # the network to allow, as narrow as can be (allowable ones)


def parse_networks(text: str) -> tuple[Network, ...]:
    """``O41_TRUST_ALLOWED_NETWORKS``: CIDRs, comma- or space-separated (empty: none)."""
    found = []
    for part in text.replace(",", " ").split():
        try:
            found.append(ipaddress.ip_network(part, strict=False))
        except ValueError:
            raise ValueError(
                f"{ALLOW_ENV} ({ALLOW_VALUE}) holds {part!r}, which is not a network: give "
                "CIDRs such as 10.20.0.0/16 or 127.0.0.1/32, comma-separated"
            ) from None
    return tuple(found)


def embedded(address: Address) -> list[ipaddress.IPv4Address]:
    """The IPv4 addresses an IPv6 address carries (and reaches through a translator or a
    tunnel): IPv4-mapped, IPv4-compatible, NAT64 (64:ff9b::/96), 6to4, Teredo."""
    if not isinstance(address, ipaddress.IPv6Address):
        return []
    found = []
    if address.ipv4_mapped is not None:
        found.append(address.ipv4_mapped)
    if address in _NAT64 or (address in _COMPATIBLE and int(address) > 1):
        found.append(ipaddress.IPv4Address(int(address) & 0xFFFFFFFF))
    if address.sixtofour is not None:
        found.append(address.sixtofour)
    if address.teredo is not None:
        found.extend(address.teredo)
    return found


def _own_refusal(address: Address, allowed: Iterable[Network]) -> Refusal | None:
    for network, why in _NEVER:
        if address.version == network.version and address in network:
            return Refusal(str(address), why, allowable=False)
    for network, why in _UNLESS:
        if address.version == network.version and address in network:
            if any(address.version == a.version and address in a for a in allowed):
                return None
            return Refusal(str(address), why, True, f"{address}/{address.max_prefixlen}")
    return None


def address_refusal(address: Address, allowed: Iterable[Network] = ()) -> Refusal | None:
    """Why ``address`` is not connected to, or None: it is public, or in a network the
    chart allows. An IPv6 address is judged with the IPv4 addresses it carries."""
    networks = tuple(allowed)
    plain = address
    if isinstance(address, ipaddress.IPv6Address) and address.scope_id:
        plain = ipaddress.IPv6Address(str(address).split("%", 1)[0])
    for each in (plain, *embedded(plain)):
        refusal = _own_refusal(each, networks)
        if refusal is not None:
            shown = str(address) if each is plain else f"{address} (carrying {each})"
            return Refusal(shown, refusal.kind, refusal.allowable, refusal.hint)
    return None


def ip_literal(host: str) -> Address | None:
    """The address a URL's host spells, also in the legacy IPv4 forms a resolver still
    reads (``127.1``, ``0x7f000001``, ``2130706433``); None for a name."""
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        pass
    if host and all(c in "0123456789abcdefx." for c in host) and host[0].isdigit():
        try:
            return ipaddress.IPv4Address(socket.inet_aton(host))
        except OSError:
            return None
    return None


def host_refusal(host: str, allowed: Iterable[Network] = ()) -> Refusal | None:
    """Why a URL's host (a name or an address literal) is not connected to, judged by its
    text alone: an address literal, a cloud metadata name, localhost. Any other name is
    judged by the addresses it resolves to (``address_refusal``), when it is fetched."""
    name = host.strip().strip("[]").lower().rstrip(".")
    literal = ip_literal(name.split("%", 1)[0])  # an IPv6 zone (%eth0, %25eth0) aside
    if literal is not None:
        return address_refusal(literal, allowed)
    if name in METADATA_HOSTS:
        return Refusal(name, "a cloud metadata host name", allowable=False)
    if name == "localhost" or name.endswith(".localhost"):
        refusal = address_refusal(ipaddress.IPv4Address("127.0.0.1"), allowed)
        return Refusal(name, "loopback", True, refusal.hint) if refusal is not None else None
    return None


def refused_message(who: str, url: str, refusal: Refusal) -> str:
    """What a refused fetch (or TrustDomain) says: the URL, the address, the fix."""
    where = f"{who}: {url} is at {refusal.address}, {refusal.kind}"
    if not refusal.allowable:
        return (
            f"{where}: keys are never fetched from there (it could hand out this cluster's "
            "own credentials). Give the issuer's own URL (spec.issuer, spec.keys.jwksURL), "
            "or its keys inline in spec.keys.jwks"
        )
    return (
        f"{where}: keys are fetched only from public addresses unless the chart allows that "
        f"network: add {refusal.hint} (or its network) to the chart's value {ALLOW_VALUE} "
        f"({ALLOW_ENV}), or give the keys inline in spec.keys.jwks"
    )


def check_url(who: str, url: str, allowed: Iterable[Network] = ()) -> None:
    """Refuse a URL whose host, by its text, is not fetched from (``host_refusal``)."""
    try:
        host = urlsplit(url).hostname or ""
    except ValueError:
        host = ""
    refusal = host_refusal(host, allowed)
    if refusal is not None:
        raise AddressNotAllowed(refused_message(who, url, refusal))
