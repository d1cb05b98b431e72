"""``python -m o41.operator``: run the operator and its admission webhook.

The webhook listens on 127.0.0.1 by default; in a cluster the chart passes
``--webhook-addr 0.0.0.0`` with the certificate it mounts, and manages the
ValidatingWebhookConfiguration itself. ``--webhook-managed`` lets the operator register
the configuration (local clusters, tests).
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any

import kopf


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
        "--metrics-port", type=int, default=0, help="serve /metrics on this port; 0: not at all"
    )
    parser.add_argument("--metrics-addr", default="127.0.0.1")
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args(argv)

    import o41.operator.handlers

    if not args.no_webhook:
        import o41.operator.admission  # noqa: F401

    @kopf.on.startup()
    def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        prefix = "artifacts.o41.io"
        settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=prefix)
        settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
            prefix=prefix, key="last-handled-configuration"
        )
        settings.posting.level = logging.WARNING  # our own Events, not kopf's chatter
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

    # kopf's own formatter: each object's lines start with [name], so logs can be grepped
    kopf.configure(verbose=args.verbose, log_prefix=True)
    kopf.run(
        clusterwide=True,
        standalone=True,  # one replica; no peering
        liveness_endpoint=args.liveness,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
