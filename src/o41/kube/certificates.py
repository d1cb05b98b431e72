"""The chart's own certificates, made in the cluster and kept (``certificates.generator:
job``): the admission webhook's CA and serving certificate, and etcd's two CAs with the
members' serving and peer certificates and the placement service's client certificate,
each in a ``kubernetes.io/tls`` Secret (``ca.crt``, ``tls.crt``, ``tls.key``: cert-manager's
layout, what the pods mount), and the webhook's CA put in the ValidatingWebhookConfiguration's
``caBundle``.

The chart renders the plan (:class:`Plan`, JSON in the Job's arguments) and never a
certificate, so ``helm template`` gives the same output on every run and a GitOps tool
(Argo CD, Flux) applying it again changes nothing: what exists is kept, only what is
missing is made. A set of etcd Secrets partly there is refused, never completed with a
second CA (the members would not trust each other). The CAs' keys are kept nowhere, as
with the chart's Helm-made certificates (docs/chart.md, "TLS options").

Run by the chart's Job with its own ServiceAccount (create Secrets in its namespace, patch
the one webhook configuration): ``python -m o41.kube.certificates --plan '<json>'``.
"""

from __future__ import annotations

import argparse
import base64
import datetime
import ipaddress
import json
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

FIELDS = ("ca.crt", "tls.crt", "tls.key")
MADE_BY = "artifacts.o41.io/made-by"
MADE_BY_VALUE = "o41.kube.certificates"


@dataclass(frozen=True)
class Plan:
    """What the chart asks for (its Job's ``--plan``)."""

    namespace: str
    days: int
    labels: Mapping[str, str] = field(default_factory=dict)
    # the webhook's Secret, the names of its serving certificate, its configuration
    webhook_secret: str = ""
    webhook_names: Sequence[str] = ()
    webhook_configuration: str = ""
    # etcd's Secrets by role (server, peer, client) and what each certificate names
    etcd_secrets: Mapping[str, str] = field(default_factory=dict)
    etcd_name: str = ""
    etcd_server_names: Sequence[str] = ()
    etcd_peer_names: Sequence[str] = ()
    etcd_peer_cn: str = ""
    etcd_client_cn: str = ""

    @classmethod
    def parse(cls, text: str) -> Plan:
        raw: dict[str, Any] = json.loads(text)
        webhook, etcd = raw.get("webhook") or {}, raw.get("etcd") or {}
        return cls(
            namespace=raw["namespace"],
            days=int(raw["days"]),
            labels=raw.get("labels") or {},
            webhook_secret=webhook.get("secret", ""),
            webhook_names=tuple(webhook.get("names", ())),
            webhook_configuration=webhook.get("configuration", ""),
            etcd_secrets=etcd.get("secrets", {}),
            etcd_name=etcd.get("name", ""),
            etcd_server_names=tuple(etcd.get("serverNames", ())),
            etcd_peer_names=tuple(etcd.get("peerNames", ())),
            etcd_peer_cn=etcd.get("peerCN", ""),
            etcd_client_cn=etcd.get("clientCN", ""),
        )


# --- certificates ------------------------------------------------------------------------


@dataclass(frozen=True)
class Issued:
    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey

    def pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)

    def key_pem(self) -> bytes:
        return self.key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )


def usage(ca: bool) -> x509.KeyUsage:
    """A CA signs certificates and CRLs; a leaf (an ECDSA key) only signs."""
    return x509.KeyUsage(
        digital_signature=True,
        key_cert_sign=ca,
        crl_sign=ca,
        key_encipherment=False,
        content_commitment=False,
        data_encipherment=False,
        key_agreement=False,
        encipher_only=False,
        decipher_only=False,
    )


def _builder(cn: str, days: int) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)]))
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
    )


def new_ca(cn: str, days: int) -> Issued:
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        _builder(cn, days)
        .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)]))
        .public_key(key.public_key())
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(usage(ca=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
        .sign(key, hashes.SHA256())
    )
    return Issued(cert, key)


def new_leaf(ca: Issued, cn: str, names: Sequence[str], days: int) -> Issued:
    """A certificate for ``names`` (DNS names and IP addresses), for server and client
    authentication both, as Helm's ``genSignedCert`` makes them (etcd's peers are both)."""
    key = ec.generate_private_key(ec.SECP256R1())
    alt: list[x509.GeneralName] = []
    for name in names:
        try:
            alt.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            alt.append(x509.DNSName(name))
    builder = (
        _builder(cn, days)
        .issuer_name(ca.cert.subject)
        .public_key(key.public_key())
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(usage(ca=False), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.key.public_key()), False
        )
    )
    if alt:
        builder = builder.add_extension(x509.SubjectAlternativeName(alt), critical=False)
    return Issued(builder.sign(ca.key, hashes.SHA256()), key)


def tls_data(ca: Issued, leaf: Issued) -> dict[str, str]:
    def b64(b: bytes) -> str:
        return base64.b64encode(b).decode()

    return {"ca.crt": b64(ca.pem()), "tls.crt": b64(leaf.pem()), "tls.key": b64(leaf.key_pem())}


def webhook_set(plan: Plan) -> dict[str, dict[str, str]]:
    service = plan.webhook_names[0] if plan.webhook_names else "webhook"
    ca = new_ca(f"{service}-webhook-ca", plan.days)
    cn = next((n for n in plan.webhook_names if n.endswith(".svc")), service)
    return {plan.webhook_secret: tls_data(ca, new_leaf(ca, cn, plan.webhook_names, plan.days))}


def etcd_set(plan: Plan) -> dict[str, dict[str, str]]:
    """Two CAs, as the chart's template makes them: the clients' CA signs the members'
    serving certificate and the service's client certificate; the peers' CA only the
    members' peer certificate."""
    clients = new_ca(f"{plan.etcd_name}-client-ca", plan.days)
    peers = new_ca(f"{plan.etcd_name}-peer-ca", plan.days)
    server = new_leaf(
        clients, f"{plan.etcd_name}-server", [*plan.etcd_server_names, "127.0.0.1"], plan.days
    )
    peer = new_leaf(peers, plan.etcd_peer_cn, [*plan.etcd_peer_names, "127.0.0.1"], plan.days)
    client = new_leaf(clients, plan.etcd_client_cn, [plan.etcd_client_cn], plan.days)
    s = plan.etcd_secrets
    return {
        s["server"]: tls_data(clients, server),
        s["peer"]: tls_data(peers, peer),
        s["client"]: tls_data(clients, client),
    }


# --- the cluster ---------------------------------------------------------------------------


class Refused(Exception):
    """What exists cannot be kept nor completed: a person must decide."""


def complete(secret: Any) -> bool:
    data = (secret.data if secret is not None else None) or {}
    return all(data.get(k) for k in FIELDS)


def read_secret(core: Any, namespace: str, name: str) -> Any:
    from kubernetes.client.exceptions import ApiException

    try:
        return core.read_namespaced_secret(name, namespace)
    except ApiException as e:
        if e.status == 404:
            return None
        raise


def ensure_set(core: Any, plan: Plan, names: Sequence[str], make: Any, what: str) -> str:
    """Keep the set of Secrets ``names`` when every one is there and complete; make it
    when none is; refuse a set partly there. Returns what was done, for the log."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    found = {n: read_secret(core, plan.namespace, n) for n in names}
    whole = [n for n, s in found.items() if complete(s)]
    if len(whole) == len(names):
        return f"{what}: kept {', '.join(names)}"
    if whole or any(s is not None for s in found.values()):
        missing = sorted(set(names) - set(whole))
        raise Refused(
            f"{what}: {', '.join(missing)} missing or incomplete (ca.crt, tls.crt, tls.key) "
            f"while {', '.join(sorted(whole)) or 'others'} exist: restore them, or delete all "
            f"of {', '.join(names)} to make a new set, then restart the pods that mount them"
        )
    made: list[str] = []
    try:
        for name, data in make(plan).items():
            body = client.V1Secret(
                metadata=client.V1ObjectMeta(
                    name=name,
                    namespace=plan.namespace,
                    labels=dict(plan.labels),
                    annotations={MADE_BY: MADE_BY_VALUE},
                ),
                type="kubernetes.io/tls",
                data=data,
            )
            core.create_namespaced_secret(plan.namespace, body)
            made.append(name)
    except ApiException as e:
        # another run made them meanwhile (409), or this one failed half-way: never leave
        # a partial set of this run's own behind
        for name in made:
            core.delete_namespaced_secret(name, plan.namespace)
        if e.status == 409:
            return ensure_set(core, plan, names, make, what)
        raise
    return f"{what}: made {', '.join(made)}"


def patch_ca_bundle(admission: Any, name: str, bundle: str, wait_seconds: float) -> str:
    """Put ``bundle`` (base64 PEM) in every webhook of the configuration ``name``, waiting
    for it to exist (applied beside this Job: which comes first is not known)."""
    from kubernetes.client.exceptions import ApiException

    deadline = time.monotonic() + wait_seconds
    while True:
        try:
            config = admission.read_validating_webhook_configuration(name)
            break
        except ApiException as e:
            if e.status != 404 or time.monotonic() > deadline:
                raise
            time.sleep(2)
    ops = [
        {"op": "add", "path": f"/webhooks/{i}/clientConfig/caBundle", "value": bundle}
        for i, hook in enumerate(config.webhooks or [])
        if (hook.client_config.ca_bundle or "") != bundle
    ]
    if not ops:
        return f"webhook configuration {name}: caBundle already the CA's"
    # each index checked first: a configuration applied anew meanwhile is read again
    names = [{"op": "test", "path": f"/webhooks/{i}/name", "value": h.name}
             for i, h in enumerate(config.webhooks or [])]  # fmt: skip
    admission.patch_validating_webhook_configuration(name, [*names, *ops])
    return f"webhook configuration {name}: caBundle set on {len(ops)} webhooks"


def ensure(api: Any, plan: Plan, wait_seconds: float = 300) -> list[str]:
    from kubernetes import client

    core = client.CoreV1Api(api)
    done: list[str] = []
    if plan.etcd_secrets:
        names = [plan.etcd_secrets[r] for r in ("server", "peer", "client")]
        done.append(ensure_set(core, plan, names, etcd_set, "etcd TLS"))
    if plan.webhook_secret:
        done.append(ensure_set(core, plan, [plan.webhook_secret], webhook_set, "webhook TLS"))
        bundle = read_secret(core, plan.namespace, plan.webhook_secret).data["ca.crt"]
        admission = client.AdmissionregistrationV1Api(api)
        done.append(patch_ca_bundle(admission, plan.webhook_configuration, bundle, wait_seconds))
    return done


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m o41.kube.certificates",
        description="Make the chart's certificates that are missing, keep those that exist.",
    )
    parser.add_argument("--plan", required=True, help="the chart's plan (JSON)")
    parser.add_argument("--kubeconfig", help="default: in-cluster, else ~/.kube/config")
    parser.add_argument("--wait-seconds", type=float, default=300,
                        help="how long to wait for the webhook configuration to exist")  # fmt: skip
    args = parser.parse_args(argv)
    from kubernetes import client, config

    if args.kubeconfig:
        api = config.new_client_from_config(config_file=args.kubeconfig)  # type: ignore[no-untyped-call]
    else:
        try:
            config.load_incluster_config()  # type: ignore[no-untyped-call]
        except config.ConfigException:
            config.load_kube_config()  # type: ignore[no-untyped-call]
        api = client.ApiClient()
    try:
        for line in ensure(api, Plan.parse(args.plan), args.wait_seconds):
            print(line, flush=True)
    except Refused as e:
        print(f"refused: {e}", file=sys.stderr, flush=True)
        return 2
    finally:
        api.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
