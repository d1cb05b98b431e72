"""``python -m o41.operator``: run the operator and its admission webhook.

The webhook listens on 127.0.0.1 by default; in a cluster the chart passes
``--webhook-addr 0.0.0.0`` with the certificate it mounts, and manages the
ValidatingWebhookConfiguration itself. ``--webhook-managed`` lets the operator register
the configuration (local clusters, tests).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
from typing import Any

import kopf

from o41 import logs
from o41.core.addresses import ALLOW_ENV, parse_networks

#: kopf's JSON lines with the field names of the placement service's (``o41.logs``).
JSON_FIELDS = "%(levelname)s %(name)s %(message)s"
RENAMED = {"levelname": "level", "name": "logger"}


class _About(logging.Filter):
    """A line about a Location or an Organization (kopf's ``k8s_ref``) names it as
    ``location`` or ``organization``, as the placement service's lines do."""

    def filter(self, record: logging.LogRecord) -> bool:
        ref = getattr(record, "k8s_ref", None) or {}
        kind = {"Location": "location", "Organization": "organization"}.get(str(ref.get("kind")))
        if kind is not None and not hasattr(record, kind):
            setattr(record, kind, ref.get("name"))
        return True


def configure_logs(log_format: str, verbose: bool) -> None:
    """kopf's own logging: text with each object's lines prefixed by its [name], or kopf's
    JSON formatter with the fields of ``o41.logs`` (time, level, logger, message, location,
    organization) and kopf's ``object`` reference."""
    if log_format == "text":
        kopf.configure(verbose=verbose, log_prefix=True)
        return
    kopf.configure(verbose=verbose, log_format=kopf.LogFormat.JSON, log_prefix=False)
    for handler in logging.getLogger().handlers:
        kopfs: Any = type(handler.formatter)  # kopf's ObjectJsonFormatter, configured our way
        handler.setFormatter(kopfs(JSON_FIELDS, rename_fields=RENAMED, timestamp="time"))
        handler.addFilter(_About())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m o41.operator", description=__doc__)
    parser.add_argument("--webhook-addr", default="127.0.0.1")
    parser.add_argument("--webhook-port", type=int, default=9443)
    parser.add_argument("--webhook-host", help="host name in the webhook URL (default: addr)")
    parser.add_argument("--webhook-cert", help="serving certificate (PEM)")
    parser.add_argument("--webhook-key", help="its private key (PEM)")
    parser.add_argument("--webhook-ca", help="CA bundle for the webhook configuration")
    parser.add_argument(
        "--webhook-managed",
        metavar="NAME",
        help="create and keep the ValidatingWebhookConfiguration NAME up to date",
    )
    parser.add_argument("--no-webhook", action="store_true", help="run without admission")
    parser.add_argument("--liveness", default="http://127.0.0.1:8080/healthz")
    parser.add_argument(
        "--readiness",
        metavar="URL",
        help="serve readiness at this http://HOST:PORT/PATH: 200 once the start-up ran, the "
        "webhook accepts connections and the watches delivered every object (the chart: "
        "http://0.0.0.0:8081/readyz); default: not served",
    )
    parser.add_argument(
        "--metrics-port", type=int, default=0, help="serve /metrics on this port; 0: not at all"
    )
    parser.add_argument("--metrics-addr", default="127.0.0.1")
    parser.add_argument(
        "--own-issuer",
        default=os.environ.get("O41_OWN_ISSUER") or None,
        help="this cluster's service account issuer, which no TrustDomain may name (default: "
        "$O41_OWN_ISSUER; else this pod's token's iss, else the API server's discovery)",
    )
    parser.add_argument(
        "--trust-allowed-networks",
        default=os.environ.get(ALLOW_ENV, ""),
        help="CIDRs, comma-separated: loopback or private networks TrustDomains' keys may be "
        "fetched from (the chart's trustDomains.allowedNetworks; default: "
        f"${ALLOW_ENV}); link-local and cloud metadata addresses never",
    )
    parser.add_argument("--verbose", action="store_true")
    parser.add_argument(
        "--log-format",
        choices=logs.FORMATS,
        default=os.environ.get("O41_LOG_FORMAT") or "text",
        help="text, or json: kopf's JSON lines with time, level, logger, message and the "
        "object (location, organization) they are about (default: $O41_LOG_FORMAT or text)",
    )
    args = parser.parse_args(argv)
    if args.log_format not in logs.FORMATS:  # from the environment: argparse checks no default
        parser.error(f"O41_LOG_FORMAT must be text or json, not {args.log_format!r}")
    try:
        allowed = parse_networks(args.trust_allowed_networks)
    except ValueError as e:
        parser.error(str(e))

    import o41.operator.handlers
    from o41.operator import trust

    if not args.no_webhook:
        import o41.operator.admission  # noqa: F401

    @kopf.on.startup()
    def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        prefix = "artifacts.o41.io"
        settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=prefix)
        settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
            prefix=prefix, key="last-handled-configuration"
        )
        # our own Events only, where Kubernetes puts those of cluster-scoped objects
        # (o41.operator.events); kopf's would go to the operator's namespace
        settings.posting.enabled = False
        settings.watching.server_timeout = 300
        settings.networking.request_timeout = 30
        if args.no_webhook:
            return
        settings.admission.server = kopf.WebhookServer(
            addr=args.webhook_addr,
            port=args.webhook_port,
            host=args.webhook_host,
            certfile=args.webhook_cert,
            pkeyfile=args.webhook_key,
            cafile=args.webhook_ca,
        )
        settings.admission.managed = args.webhook_managed

    started = threading.Event()  # kopf sets it once every start-up handler ran
    if args.readiness:
        from o41.operator import health
        from o41.operator.cluster import Cluster, operator_namespace

        webhook = None if args.no_webhook else (args.webhook_addr, args.webhook_port)
        readiness = health.Readiness(started, webhook, Cluster(operator_namespace()).list_objects)

        @kopf.on.startup()
        async def serve_readiness(memo: kopf.Memo, **indexes: Any) -> None:
            seen, organizations = indexes["locations_seen"], indexes["organizations_by_name"]
            readiness.indexes = {
                "locations": lambda: list(seen),
                "organizations": lambda: list(organizations),
            }
            memo["readiness"] = await health.serve(readiness, args.readiness)

        @kopf.on.cleanup()
        async def stop_readiness(memo: kopf.Memo, **_: Any) -> None:
            runner = memo.get("readiness")
            if runner is not None:
                await runner.cleanup()

    if args.metrics_port:
        from o41.operator import telemetry

        @kopf.on.startup()
        async def serve_metrics(memo: kopf.Memo, **_: Any) -> None:
            memo["metrics_runner"] = await telemetry.serve(args.metrics_addr, args.metrics_port)

        @kopf.on.cleanup()
        async def stop_metrics(memo: kopf.Memo, **_: Any) -> None:
            runner = memo.get("metrics_runner")
            if runner is not None:
                await runner.cleanup()

    configure_logs(args.log_format, args.verbose)
    kopf.run(
        clusterwide=True,
        standalone=True,  # one replica; no peering
        liveness_endpoint=args.liveness,
        ready_flag=started,
        memo=kopf.Memo({trust.SETTINGS: trust.Given(args.own_issuer, allowed)}),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
