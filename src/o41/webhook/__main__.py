"""``python -m o41.webhook``: serve the placement service.

``--serve all`` (the default): the whole service, the hub. ``--serve collections``: the
collections tier of a workload cluster (``o41.webhook.tier``): the collections alone, on
``--etcd``, for this cluster's pods by TokenReview; it needs RBAC to create tokenreviews
and nothing else. Listens on 127.0.0.1 unless told otherwise; the chart passes ``--host
0.0.0.0``. HTTPS on ``--port`` when O41_TLS_CERT_FILE and O41_TLS_KEY_FILE are set
(renewed files are taken without a restart); ``--metrics-port`` stays plain HTTP.
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import sys

from aiohttp import web

from o41 import logs
from o41.core.addresses import ALLOW_ENV, parse_networks


async def freeze_heap(app: web.Application) -> None:
    """What the service holds from its start on (modules, the Kubernetes and SDK clients,
    the view of the cluster) is kept out of the garbage collector's full passes: in the
    begin load one such pass over about 200,000 objects took about 190 ms, with the
    requests waiting; young objects are collected as before (issue 41)."""
    gc.collect()
    gc.freeze()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m o41.webhook", description=__doc__)
    parser.add_argument(
        "--serve",
        choices=["all", "collections"],
        default="all",
        help="all: the placement service (the hub); collections: this cluster's collections "
        "tier, the collections alone on --etcd, for this cluster's pods (no artifacts)",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=0,
        help="serve /metrics on this port (same host) and not on --port; 0: on --port, "
        "unless --port is TLS (exposed): then nowhere",
    )
    parser.add_argument(
        "--etcd",
        default=os.environ.get("O41_ETCD_ENDPOINTS", ""),
        help="comma-separated etcd client URLs; empty: the embedded single-replica store. "
        "https:// URLs: TLS, with O41_ETCD_CA_FILE, O41_ETCD_CERT_FILE and O41_ETCD_KEY_FILE",
    )
    parser.add_argument(
        "--collections-etcd",
        default=os.environ.get("O41_COLLECTIONS_ETCD_ENDPOINTS", ""),
        help="--serve all: comma-separated etcd client URLs the collections use apart from "
        "the index's --etcd (same O41_ETCD_* TLS files), so a job flooding its collections "
        "does not load the index's etcd; empty: the collections share --etcd",
    )
    parser.add_argument("--kubeconfig", default=None)
    parser.add_argument(
        "--secrets-namespace", default=os.environ.get("O41_OPERATOR_NAMESPACE", "o41-system")
    )
    parser.add_argument("--authentication", choices=["tokenreview", "none"], default="tokenreview")
    parser.add_argument(
        "--audience",
        action="append",
        default=[],
        help="an audience this cluster's tokens must name (repeat for several; the "
        "TokenReview is asked for them); none: any the API server accepts",
    )
    parser.add_argument(
        "--usage-hourly-days",
        type=int,
        default=14,
        help="days the hourly usage counters are kept (at least 2: the page's 24 h window)",
    )
    parser.add_argument(
        "--usage-daily-days",
        type=int,
        default=400,
        help="days the daily usage counters are kept (at least 31: the page's 30-day window)",
    )
    parser.add_argument(
        "--retention-interval",
        type=float,
        default=600.0,
        help="seconds between passes over every artifact a retention rule covers (at "
        "least 10; a commit of a covered artifact starts a pass of its own)",
    )
    parser.add_argument(
        "--usage-page",
        choices=["on", "off"],
        default="on",
        help="serve the /usage page (a token form) on --port; off where the port is exposed "
        "outside the cluster (/v1/usage answers either way)",
    )
    parser.add_argument(
        "--backup-organization",
        default="",
        help="take etcd snapshots into this organization's fallback location (the platform "
        "team's own: a snapshot holds every tenant's records); empty: no snapshots",
    )
    parser.add_argument(
        "--backup-interval", type=float, default=3600.0, help="seconds between etcd snapshots"
    )
    parser.add_argument(
        "--backup-keep", type=int, default=14, help="etcd snapshots kept (the newest)"
    )
    parser.add_argument(
        "--backup-dir", default=None, help="where a snapshot is written before its upload"
    )
    parser.add_argument(
        "--own-issuer",
        default=os.environ.get("O41_OWN_ISSUER") or None,
        help="this cluster's service account issuer, whose tokens go to the TokenReview and "
        "which no TrustDomain may name (default: $O41_OWN_ISSUER; else this pod's token's "
        "iss, else the API server's discovery document)",
    )
    parser.add_argument(
        "--trust-allowed-networks",
        default=os.environ.get(ALLOW_ENV, ""),
        help="CIDRs, comma-separated: loopback or private networks TrustDomains' keys may be "
        f"fetched from (the chart's trustDomains.allowedNetworks; default: ${ALLOW_ENV}); "
        "link-local and cloud metadata addresses never",
    )
    parser.add_argument(
        "--log-format",
        choices=logs.FORMATS,
        default=os.environ.get("O41_LOG_FORMAT") or "text",
        help="text, or json: one JSON object per line with time, level, logger, message, "
        "request_id, organization, location (default: $O41_LOG_FORMAT or text)",
    )
    args = parser.parse_args(argv)
    if args.log_format not in logs.FORMATS:  # from the environment: argparse checks no default
        parser.error(f"O41_LOG_FORMAT must be text or json, not {args.log_format!r}")
    logs.configure(args.log_format, logging.INFO)

    from o41.state import store_settings
    from o41.webhook.app import Settings, make_app
    from o41.webhook.http.tls import Reloading, ServingTls
    from o41.webhook.tier import make_collections_app

    if args.usage_hourly_days < 2:
        parser.error("--usage-hourly-days must be at least 2 (the usage page's 24 h window)")
    if args.usage_daily_days < 31:
        parser.error("--usage-daily-days must be at least 31 (the usage page's 30-day window)")
    if not args.retention_interval >= 10:
        parser.error("--retention-interval must be at least 10 seconds")
    if not args.backup_interval >= 1 or args.backup_keep < 1:
        parser.error("--backup-interval must be at least 1 second and --backup-keep at least 1")
    if args.serve == "collections" and args.collections_etcd:
        parser.error(
            "--collections-etcd is for --serve all: a collections tier keeps its collections "
            "in --etcd"
        )
    if args.serve == "collections" and args.backup_organization:
        parser.error(
            "--backup-organization is for --serve all: a collections tier takes no "
            "snapshots (it has no location to keep them in)"
        )
    try:
        endpoints, tls = store_settings(args.etcd, os.environ)
        collections_endpoints = (
            store_settings(args.collections_etcd, os.environ)[0] if args.collections_etcd else []
        )
        serving = ServingTls.from_environment(os.environ)
        allowed = parse_networks(args.trust_allowed_networks)
    except ValueError as e:
        parser.error(str(e))
    settings = Settings(
        etcd_endpoints=endpoints,
        etcd_tls=tls,
        collections_etcd_endpoints=collections_endpoints,
        kubeconfig=args.kubeconfig,
        secrets_namespace=args.secrets_namespace,
        authentication=args.authentication,
        audiences=args.audience,
        metrics_address=(args.host, args.metrics_port) if args.metrics_port else None,
        usage_hourly_days=args.usage_hourly_days,
        usage_daily_days=args.usage_daily_days,
        retention_interval=args.retention_interval,
        tls=serving,
        usage_page=args.usage_page == "on",
        backup_organization=args.backup_organization,
        backup_interval=args.backup_interval,
        backup_keep=args.backup_keep,
        backup_dir=args.backup_dir,
        own_issuer=args.own_issuer,
        trust_allowed=allowed,
    )
    app = make_collections_app(settings) if args.serve == "collections" else make_app(settings)
    app.on_startup.append(freeze_heap)  # after the app's own startup: its clients made
    web.run_app(
        app,
        host=args.host,
        port=args.port,
        ssl_context=Reloading(serving).base if serving else None,
        access_log=None,  # o41.webhook.http.request_ids writes one line per request
        print=logging.getLogger("o41.webhook").info,  # "Running on ...", as a log line
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
