"""``kubectl o41 cluster add``: the TrustDomain of a workload cluster, written from that
cluster's kubeconfig, so that a platform engineer never copies an issuer or a CA by hand.

It asks the workload cluster (with the kubeconfig's own credentials) for its issuer and
keys, then decides how the hub will get them: by OIDC discovery when the issuer serves it
without credentials (managed clusters do, at a public URL; a self-managed API server does
once its discovery role is bound to anonymous callers), with the cluster's CA as
caBundle when the issuer is that API server; else the keys inline (a rotation in that
cluster then needs the command run again, which the output says).

``o41.cli`` builds every group's parser whatever the command, ``o41 write`` on the light
install too, so what reads and writes the clusters (the Kubernetes client, the custom
resources' models, HTTP and TLS) is imported by the function that uses it.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from typing import Any

from o41.cli.common import EXIT_CONFIG, Parser, Subcommands

DISCOVERY = "/.well-known/openid-configuration"
JWKS = "/openid/v1/jwks"
BINDING = (
    "kubectl create clusterrolebinding oidc-anonymous "
    "--clusterrole=system:service-account-issuer-discovery --group=system:unauthenticated"
)


class ClusterError(Exception):
    """The workload cluster could not be read; the message says what to do."""


@dataclass(frozen=True)
class Workload:
    """What the workload cluster says of its issuer."""

    server: str
    issuer: str
    jwks: dict[str, Any]
    ca_pem: str | None  # the kubeconfig's CA of that API server
    public: bool  # its discovery document answers without credentials


def read_workload(kubeconfig: str | None, context: str | None) -> Workload:
    from pathlib import Path

    from kubernetes import config
    from kubernetes.client.exceptions import ApiException

    from o41.kube.trust_keys import api_get_json

    try:
        api = config.new_client_from_config(config_file=kubeconfig, context=context)  # type: ignore[no-untyped-call]
    except Exception as e:
        raise ClusterError(f"cannot load the workload cluster's kubeconfig: {e}") from None
    try:
        server = str(api.configuration.host).rstrip("/")
        ca_file = api.configuration.ssl_ca_cert
        ca_pem = Path(ca_file).read_text() if ca_file else None
        discovery = api_get_json(api, DISCOVERY)
        jwks = api_get_json(api, JWKS, "application/jwk-set+json")
    except ApiException as e:
        raise ClusterError(
            f"the workload cluster answered {e.status} for its issuer discovery: its "
            "kubeconfig's user needs the ClusterRole system:service-account-issuer-discovery "
            "(bound to every authenticated user by default)"
        ) from None
    except (OSError, ValueError) as e:
        raise ClusterError(f"cannot read the workload cluster's issuer: {e}") from None
    finally:
        api.close()
    issuer = discovery.get("issuer")
    if not isinstance(issuer, str) or not issuer.startswith("https://"):
        raise ClusterError(
            f"the workload cluster's issuer is {issuer!r}, not an https URL: other clusters "
            "cannot verify its tokens (set --service-account-issuer on its API server)"
        )
    own = issuer.rstrip("/") == server
    return Workload(server, issuer, jwks, ca_pem, _public(issuer, ca_pem) if own else True)


def _public(issuer: str, ca_pem: str | None) -> bool:
    """Does the issuer's discovery document answer without credentials? Asked only of
    the workload cluster's own API server (a managed issuer's public URL is taken as
    public without a call from here)."""
    import ssl
    import urllib.error
    import urllib.request

    context = ssl.create_default_context(cadata=ca_pem) if ca_pem else None
    no_proxy = urllib.request.build_opener(
        urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=context)
    )
    try:
        with no_proxy.open(issuer.rstrip("/") + DISCOVERY, timeout=10) as r:
            return bool(r.status == 200)
    except urllib.error.HTTPError:
        return False  # 401/403: anonymous callers may not read it
    except (OSError, ValueError):
        return False


def trust_domain(name: str, workload: Workload, *, inline: bool) -> dict[str, Any]:
    """The TrustDomain object: discovery when it can work, else the keys inline."""
    import json

    from o41.kube.api import API_VERSION, TrustDomainSpec

    own_server = workload.issuer.rstrip("/") == workload.server
    spec: dict[str, Any] = {"issuer": workload.issuer}
    if inline or (own_server and not workload.public):
        spec["keys"] = {"jwks": json.dumps(workload.jwks, sort_keys=True)}
    if own_server and workload.ca_pem and "keys" not in spec:
        spec["caBundle"] = workload.ca_pem
    TrustDomainSpec.model_validate(spec)  # what admission will check first
    return {
        "apiVersion": API_VERSION,
        "kind": "TrustDomain",
        "metadata": {"name": name},
        "spec": spec,
    }


def advice(name: str, workload: Workload, obj: dict[str, Any]) -> str:
    """What the platform engineer should know about the keys' way chosen."""
    if "jwks" in obj["spec"].get("keys", {}):
        why = (
            "its issuer does not serve its keys without credentials"
            if not workload.public
            else "--inline-keys"
        )
        return (
            f"TrustDomain {name}: keys inline ({why}); after a key rotation in that cluster, "
            f"run this again. To let the hub fetch them instead, in that cluster: {BINDING}"
        )
    return f"TrustDomain {name}: keys by OIDC discovery from {workload.issuer}"


def apply(obj: dict[str, Any], kubeconfig: str | None, context: str | None) -> str:
    """Create the TrustDomain in the hub, or update its spec; what the hub said."""
    from kubernetes import client, config
    from kubernetes.client.exceptions import ApiException

    from o41.kube.api import GROUP, VERSION

    try:
        api = config.new_client_from_config(config_file=kubeconfig, context=context)  # type: ignore[no-untyped-call]
    except Exception as e:
        raise ClusterError(f"cannot load the hub's kubeconfig: {e}") from None
    objects = client.CustomObjectsApi(api)
    name = obj["metadata"]["name"]
    done = "created"
    try:
        try:
            objects.create_cluster_custom_object(GROUP, VERSION, "trustdomains", obj)
        except ApiException as e:
            if e.status != 409:
                raise
            patch = {"spec": obj["spec"]}
            objects.patch_cluster_custom_object(GROUP, VERSION, "trustdomains", name, patch)
            done = "updated"
    except ApiException as e:
        raise ClusterError(f"the hub refused TrustDomain {name}: {_said(e)}") from None
    except OSError as e:
        raise ClusterError(f"cannot reach the hub's API server: {e}") from None
    finally:
        api.close()
    return done


def _said(e: Any) -> str:
    """The API server's message (admission's words), or its status."""
    import json

    try:
        return str(json.loads(e.body)["message"])
    except (TypeError, ValueError, KeyError):
        return f"{e.status} {e.reason}"


def _cluster(args: argparse.Namespace) -> int:
    """``cluster add``: a workload cluster's TrustDomain, from its kubeconfig."""
    import yaml

    try:
        workload = read_workload(args.from_kubeconfig, args.from_context)
        obj = trust_domain(args.name, workload, inline=args.inline_keys)
        if args.dry_run:
            print(yaml.safe_dump(obj, sort_keys=False), end="")
        else:
            done = apply(obj, args.kubeconfig, args.context)
            print(f"trustdomain/{args.name} {done}")
    except ClusterError as e:
        print(f"{args.prog_name}: {e}", file=sys.stderr)
        return 1
    except ValueError as e:  # the spec the models refuse (a name, an issuer)
        print(f"{args.prog_name}: {e}", file=sys.stderr)
        return EXIT_CONFIG
    print(advice(args.name, workload, obj), file=sys.stderr)
    return 0


def add(sub: Subcommands) -> None:
    """``cluster add``."""
    cluster = sub.add_parser(
        "cluster",
        help="trust a workload cluster's tokens (a TrustDomain from its kubeconfig)",
        description="Read a workload cluster's issuer and keys with its kubeconfig and "
        "write the TrustDomain to the hub (the kubeconfig of kubectl, or --kubeconfig): OIDC "
        "discovery when its issuer serves it without credentials, else its keys inline "
        "(docs/multi-cluster.md).",
    )
    cluster_actions = cluster.add_subparsers(dest="action", required=True, parser_class=Parser)
    adding = cluster_actions.add_parser("add", help="write the TrustDomain NAME")
    adding.add_argument("name", metavar="NAME", help="the TrustDomain's name (a DNS label)")
    adding.add_argument(
        "--from-kubeconfig", required=True, help="the workload cluster's kubeconfig"
    )
    adding.add_argument("--from-context", help="its context (default: its current)")
    adding.add_argument("--inline-keys", action="store_true", help="put the keys in the spec")
    adding.add_argument(
        "--dry-run", action="store_true", help="print the TrustDomain, apply nothing"
    )
    adding.add_argument("--kubeconfig", help="the hub's kubeconfig (default: kubectl's)")
    adding.add_argument("--context", help="the hub's context")
    adding.set_defaults(handler=_cluster, prog_name=adding.prog)
