"""``kubectl o41 token create|list|revoke``: the placement service's own tokens, for
callers no cluster vouches for (SkyPilot VMs), with a platform admin's kubeconfig."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from o41.cli.common import EXIT_CONFIG, Parser, Subcommands


def _token(args: argparse.Namespace) -> int:
    """``token create|list|revoke``: service tokens for VMs, with an admin's kubeconfig."""
    import urllib3
    from kubernetes import config
    from kubernetes.client.exceptions import ApiException

    from o41.core.service_tokens import parse_ttl
    from o41.kube.service_tokens import TokenAdmin

    try:
        ttl = parse_ttl(args.ttl) if args.action == "create" else 0
        api = config.new_client_from_config(config_file=args.kubeconfig, context=args.context)  # type: ignore[no-untyped-call]
    except Exception as e:  # a bad ttl, no kubeconfig or a broken one
        print(f"{args.prog_name}: {e}", file=sys.stderr)
        return EXIT_CONFIG
    try:
        return _token_action(args, TokenAdmin(api, args.namespace), ttl)
    except ValueError as e:  # a subject that is not a DNS label
        print(f"{args.prog_name}: {e}", file=sys.stderr)
        return EXIT_CONFIG
    except ApiException as e:
        why = TOKEN_API_ERRORS.get(e.status, e.reason)
        print(f"{args.prog_name}: the API server answered {e.status}: {why}", file=sys.stderr)
        return 1
    except (OSError, urllib3.exceptions.HTTPError) as e:
        print(f"{args.prog_name}: cannot reach the API server: {e}", file=sys.stderr)
        return 1
    finally:
        api.close()


TOKEN_API_ERRORS = {
    404: "not found: check the organization's name and --namespace (the chart's)",
    403: "forbidden: service tokens need a platform admin's access to the chart's namespace",
}


def _token_action(args: argparse.Namespace, admin: Any, ttl: int) -> int:
    import datetime as dt
    import json

    def when(seconds: int) -> str:
        return dt.datetime.fromtimestamp(seconds, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

    if args.action == "create":
        token, issued = admin.create(args.org, args.subject, ttl)
        print(token)  # alone on stdout: O41_ARTIFACTS_TOKEN=$(kubectl o41 token create ...)
        print(
            f"token {issued.id} for {issued.subject} in organization {issued.organization}, "
            f"expires {when(issued.expires)}",
            file=sys.stderr,
        )
        return 0
    if args.action == "list":
        rows = admin.list()
        if args.json:
            fields = ("id", "organization", "subject")
            listed = [
                {f: getattr(i, f) for f in fields} | {"expires": when(i.expires)} for i in rows
            ]
            print(json.dumps(listed))
            return 0
        now = dt.datetime.now(dt.UTC).timestamp()
        print(f"{'ID':<18} {'ORGANIZATION':<20} {'SUBJECT':<24} EXPIRES")
        for i in rows:
            gone = " (expired)" if i.expires < now else ""
            print(f"{i.id:<18} {i.organization:<20} {i.subject:<24} {when(i.expires)}{gone}")
        return 0
    if not admin.revoke(args.id):
        print(
            f"{args.prog_name}: no token {args.id!r} in namespace {args.namespace}: "
            "`kubectl o41 token list` lists them",
            file=sys.stderr,
        )
        return 1
    print(f"token {args.id} revoked: the service refuses it within seconds")
    return 0


def add(sub: Subcommands) -> None:
    """``token create``, ``token list``, ``token revoke``."""
    token = sub.add_parser(
        "token",
        help="service tokens for callers no cluster vouches for (SkyPilot VMs)",
        description="Create, list and revoke the placement service's own tokens, with a "
        "platform admin's kubeconfig (docs/multi-cluster.md). A token names one "
        "organization and a subject, lasts at most 30 days, and works until revoked.",
    )
    actions = token.add_subparsers(dest="action", required=True, parser_class=Parser)
    create = actions.add_parser("create", help="print a new token on stdout")
    create.add_argument("--org", required=True, help="the Organization it may use")
    create.add_argument("--subject", required=True, help="who holds it (a DNS label)")
    create.add_argument("--ttl", default="24h", help="lifetime: 90m, 24h, 7d (at most 30d)")
    listing = actions.add_parser("list", help="the tokens not revoked, and when they expire")
    listing.add_argument("--json", action="store_true", help="one JSON array")
    revoke = actions.add_parser("revoke", help="refuse a token from now on")
    revoke.add_argument("id", metavar="ID", help="the token's id (token list)")
    for action in (create, listing, revoke):
        action.add_argument("--namespace", default="o41-system", help="the chart's namespace")
        action.add_argument("--kubeconfig", help="the kubeconfig (default: kubectl's)")
        action.add_argument("--context", help="the kubeconfig's context")
        action.set_defaults(handler=_token, prog_name=action.prog)
