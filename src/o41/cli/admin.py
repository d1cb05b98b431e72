"""``kubectl o41 admin restore`` and ``admin rebuild``: a platform admin's operations on
the state store (docs/operations.md, 'Backups and restore'). What they do is the
``o41.restore`` package's (also the etcd members' init container); here are the commands."""

from __future__ import annotations

import argparse
import sys

from o41.cli.common import Parser, Subcommands


def _restore(args: argparse.Namespace) -> int:
    """``admin restore``: the chart's etcd restored from a snapshot (docs/operations.md)."""
    import time

    from o41.restore.admin import RestoreError, restore

    try:
        done = restore(
            kubeconfig=args.kubeconfig,
            context=args.context,
            namespace=args.namespace,
            release=args.release,
            snapshot=args.snapshot,
            organization=args.organization,
            yes=args.yes,
            say=print,
            timeout=args.timeout,
        )
    except RestoreError as e:
        print(f"{args.prog_name}: {e}", file=sys.stderr)
        return 1
    if done is not None:
        when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(done.taken))
        print(f"restored etcd from {done.key}: revision {done.revision}, taken {when}")
    return 0


def _rebuild(args: argparse.Namespace) -> int:
    """``admin rebuild``: etcd's index rebuilt from the buckets' record (docs/operations.md)."""
    from o41.restore.admin import RestoreError
    from o41.restore.rebuild import rebuild

    try:
        return rebuild(
            kubeconfig=args.kubeconfig,
            context=args.context,
            namespace=args.namespace,
            release=args.release,
            organizations=args.organization,
            dry_run=args.dry_run,
            say=print,
            timeout=args.timeout,
        )
    except RestoreError as e:
        print(f"{args.prog_name}: {e}", file=sys.stderr)
        return 1


def add(sub: Subcommands) -> None:
    """``admin restore``, ``admin rebuild``."""
    admin = sub.add_parser(
        "admin",
        help="platform admin's operations on the state store (restore, rebuild)",
        description="With a platform admin's kubeconfig (docs/operations.md, 'Backups and "
        "restore').",
    )
    admin_actions = admin.add_subparsers(dest="action", required=True, parser_class=Parser)
    rebuilding = admin_actions.add_parser(
        "rebuild",
        help="rebuild etcd's index of versions from the buckets' records",
        description="Run a Job made from the placement Deployment that lists every "
        "location's records and journal and writes into etcd what it lacks (versions, "
        "latest, sequence numbers, tags); with --dry-run, print what differs and write "
        "nothing. Idempotent: run it again after a stop or an unreachable location.",
    )
    rebuilding.add_argument(
        "--organization", action="append", default=[], help="only this one (repeat; all)"
    )
    rebuilding.add_argument("--dry-run", action="store_true", help="print what differs")
    restore = admin_actions.add_parser(
        "restore",
        help="restore the chart's etcd StatefulSet from a snapshot",
        description="Find an etcd snapshot in the backup organization's locations, then "
        "scale the etcd StatefulSet to 0, delete its claims and bring every member back "
        "restored from it. Without --yes: print the plan, change nothing. Whatever etcd "
        "took after the snapshot is lost.",
    )
    restore.add_argument(
        "--snapshot", default="latest", metavar="KEY|latest", help="which one (latest)"
    )
    restore.add_argument(
        "--organization", help="where the snapshots are (default: the chart's backup.organization)"
    )
    restore.add_argument("--yes", action="store_true", help="do it (else: print the plan)")
    for action in (restore, rebuilding):
        action.add_argument("--namespace", "-n", default="o41-system", help="the chart's namespace")
        action.add_argument("--release", default="o41", help="the chart's release name (o41)")
        action.add_argument(
            "--timeout", type=float, default=600.0, help="seconds each step may take (600)"
        )
        action.add_argument("--kubeconfig", help="the kubeconfig (default: kubectl's)")
        action.add_argument("--context", help="the kubeconfig's context")
    restore.set_defaults(handler=_restore, prog_name=restore.prog)
    rebuilding.set_defaults(handler=_rebuild, prog_name=rebuilding.prog)
