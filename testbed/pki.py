"""Throwaway certificates for the local control plane: a CA, serving and client certs.

Generated fresh for each test bed, kept in its directory, never reused elsewhere.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_VALID_FOR = dt.timedelta(days=30)


def _key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def _pem_key(key: rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.TraditionalOpenSSL,
        serialization.NoEncryption(),
    )


def _name(cn: str, org: str | None = None) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, cn)]
    if org:
        attrs.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, org))
    return x509.Name(attrs)


@dataclass(frozen=True)
class CertPair:
    cert: Path
    key: Path


@dataclass(frozen=True)
class Authority:
    """A CA that signs serving and client certificates into a directory."""

    directory: Path
    cert: x509.Certificate
    key: rsa.RSAPrivateKey

    @property
    def cert_path(self) -> Path:
        return self.directory / "ca.crt"

    @classmethod
    def create(cls, directory: Path, name: str = "o41-testbed-ca") -> Authority:
        directory.mkdir(parents=True, exist_ok=True)
        key = _key()
        now = dt.datetime.now(dt.UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(_name(name))
            .issuer_name(_name(name))
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + _VALID_FOR)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    key_cert_sign=True,
                    crl_sign=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(key, hashes.SHA256())
        )
        (directory / "ca.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        (directory / "ca.key").write_bytes(_pem_key(key))
        return cls(directory, cert, key)

    def issue(
        self,
        stem: str,
        common_name: str,
        *,
        organization: str | None = None,
        dns: tuple[str, ...] = (),
        ips: tuple[str, ...] = (),
        client: bool = False,
        server: bool | None = None,
    ) -> CertPair:
        """A certificate for serving (the default), for a client (``client``), or for both
        (``client`` and ``server``: etcd's own gateway dials etcd with its serving
        certificate, which must then be good for a client too)."""
        key = _key()
        now = dt.datetime.now(dt.UTC)
        serving = not client if server is None else server
        usages = [ExtendedKeyUsageOID.CLIENT_AUTH] if client else []
        if serving:
            usages.append(ExtendedKeyUsageOID.SERVER_AUTH)
        builder = (
            x509.CertificateBuilder()
            .subject_name(_name(common_name, organization))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + _VALID_FOR)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        )
        sans: list[x509.GeneralName] = [x509.DNSName(d) for d in dns]
        sans += [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        cert = builder.sign(self.key, hashes.SHA256())
        pair = CertPair(self.directory / f"{stem}.crt", self.directory / f"{stem}.key")
        pair.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        pair.key.write_bytes(_pem_key(key))
        return pair


def service_account_key(path: Path) -> Path:
    """One RSA key serves as both the signing key and the verification key."""
    path.write_bytes(_pem_key(_key()))
    return path
