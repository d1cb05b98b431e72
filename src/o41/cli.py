"""The ``o41`` command. Scripts rely on its output, so each subcommand's format is fixed.

Subcommands are argparse sub-parsers whose handlers import their implementation lazily:
``o41 place`` must not pay for the cloud SDKs a later ``o41 write`` needs.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

if TYPE_CHECKING:
    from o41.client.artifacts import Artifacts

#: Exit status for a configuration error (argparse uses 2 for usage errors too).
EXIT_CONFIG = 2

Handler = Callable[[argparse.Namespace], int]


def _place(args: argparse.Namespace) -> int:
    import json

    from o41.client.place import PlaceConfigError, explain_place

    try:
        detection = explain_place()
    except PlaceConfigError as e:
        _fail(args, e)  # with --json, one JSON object on stderr
        return EXIT_CONFIG
    place = detection.place
    if args.json:
        print(json.dumps(place.as_json()))
        return 0
    if place.cloud is None:
        print("place: unknown (source none)")
    else:
        print(f"place: {place.cloud} / {place.region or 'unknown region'} (source {place.source})")
    print("how it was found:")
    for step in detection.steps:
        verdict = "answered" if step.answered else "skipped "
        print(f"  {step.source:<9} {verdict}  {step.why}")
    return 0


def _artifacts(args: argparse.Namespace) -> Artifacts:
    from o41.client.artifacts import Artifacts

    return Artifacts(endpoint=args.endpoint, token_file=args.token_file)


def _fail(args: argparse.Namespace, e: Exception) -> int:
    """An error on stderr: ``o41 COMMAND: message``, or with ``--json`` one JSON object
    ``{"error": message, "status": HTTP status or null, ...}`` (a tag's ``current``)."""
    import json

    from o41.client.errors import ServiceError

    if getattr(args, "json", False):
        found: dict[str, object] = {"error": str(e), "status": None}
        if isinstance(e, ServiceError):
            found["status"] = e.status
            found.update({k: v for k, v in e.body.items() if k not in found})
        print(json.dumps(found), file=sys.stderr)
    else:
        print(f"o41 {args.command}: {e}", file=sys.stderr)
    return 1


def _errors() -> tuple[type[Exception], ...]:
    from o41.client.errors import ArtifactError
    from o41.client.place import PlaceConfigError

    return (ArtifactError, PlaceConfigError, OSError)


def _metadata(given: list[str] | None) -> dict[str, object] | None:
    """``--metadata`` as a dict: each ``KEY=VALUE`` (the value as JSON when it is JSON,
    ``step=3`` is the number 3, else the text) or a JSON object, later ones over earlier."""
    import json

    if not given:
        return None
    found: dict[str, object] = {}
    for item in given:
        if item.lstrip().startswith("{"):
            try:
                obj = json.loads(item)
            except ValueError as e:
                raise argparse.ArgumentTypeError(
                    f"--metadata {item[:40]!r}: not JSON: {e}"
                ) from None
            if not isinstance(obj, dict):
                raise argparse.ArgumentTypeError("--metadata JSON must be an object")
            found.update(obj)
            continue
        key, eq, value = item.partition("=")
        if not eq or not key:
            raise argparse.ArgumentTypeError(
                f"--metadata {item[:40]!r}: give KEY=VALUE or a JSON object"
            )
        try:
            found[key] = json.loads(value)
        except ValueError:
            found[key] = value
    return found


def _write(args: argparse.Namespace) -> int:
    import json

    try:
        metadata = _metadata(args.metadata)
    except argparse.ArgumentTypeError as e:
        return _fail(args, e)
    import os

    files: int | None = None
    try:
        if os.path.isdir(args.file):
            if args.resume is not None:
                return _fail(args, ValueError("a directory's write does not resume"))
            from o41.client.directories import write_dir

            written: object = write_dir(
                _artifacts(args),
                args.org,
                args.artifact,
                args.file,
                metadata=metadata,
                tag=args.tag,
            )
            files = getattr(written, "files", None)
        else:
            written = _artifacts(args).write(
                args.org,
                args.artifact,
                args.file,
                metadata=metadata,
                tag=args.tag,
                resume=args.resume,
            )
    except _errors() as e:
        return _fail(args, e)
    w: Any = written
    if args.json:
        found = {
            "version": w.version,
            "location": w.location,
            "rule": w.rule,
            "warning": w.warning,
        }
        if w.tag is not None:  # the format without --tag stays as it was
            found["tag"] = w.tag
        if files is not None:  # a directory: how many files
            found["files"] = files
        print(json.dumps(found))
    else:
        tagged = f", tagged {w.tag}" if w.tag else ""
        count = f"{files} files, " if files is not None else ""
        print(
            f"wrote {args.artifact} version {w.version} ({count}{w.size} bytes) to "
            f"location {w.location} (rule: {w.rule}){tagged}"
        )
    return 0


def _read(args: argparse.Namespace) -> int:
    import json

    from o41.client import directories

    files: int | None = None
    try:
        api = _artifacts(args)
        if args.path is not None:
            got = directories.read_file(
                api, args.org, args.artifact, args.version, args.path, args.output
            )
        else:
            got, files = directories.read_any(
                api, args.org, args.artifact, args.version, args.output
            )
    except _errors() as e:
        return _fail(args, e)
    if args.json:
        answer: dict[str, str | None] = {"location": got.location, "locality": got.locality}
        if args.version != got.version:  # read by latest or a tag: which version it was
            answer.update(version=got.version, tag=got.tag)
        print(json.dumps(answer))
    else:
        count = f"{files} files, " if files is not None else ""
        print(
            f"read {args.artifact} version {got.version} ({count}{got.size} bytes) from "
            f"location {got.location} ({got.locality})"
        )
    return 0


def _files(args: argparse.Namespace) -> int:
    import json

    from o41.client.directories import listing

    try:
        found = listing(_artifacts(args), args.org, args.artifact, args.version)
    except _errors() as e:
        return _fail(args, e)
    if args.json:
        print(json.dumps(found))
        return 0
    for f in found["files"]:
        print(f"{f['size']:>12}  {f['md5']}  {f['path']}")
    print(
        f"version {found['version']}: {len(found['files'])} files, {found['size']} bytes",
        file=sys.stderr,
    )
    return 0


def _when(t: float) -> str:
    import datetime as dt

    return dt.datetime.fromtimestamp(t, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _versions(args: argparse.Namespace) -> int:
    import json

    api = _artifacts(args)
    try:
        if args.artifact is None:
            page = api.artifacts_page(args.org, args.cursor, args.limit)
        else:
            page = api.versions_page(args.org, args.artifact, args.cursor, args.limit)
    except _errors() as e:
        return _fail(args, e)
    if args.json:
        print(json.dumps(page))
        return 0
    if args.artifact is None:
        for a in page["artifacts"]:
            print(f"{a['artifact']}  last {a['lastVersion']}  {_when(a['lastCommitted'])}")
    else:
        for v in page["versions"]:
            w = v["writer"]
            where = f"{w['cloud'] or '?'}/{w['region'] or '?'}"
            meta = json.dumps(v["metadata"], separators=(",", ":")) if v["metadata"] else ""
            print(
                f"{v['version']}  {_when(v['committed'])}  {v['size']:>12}  "
                f"{v['location']}  from {where}  {meta}".rstrip()
            )
    if page.get("keepVersions") is not None:
        keep = page["keepVersions"]
        print(f"retention keeps the newest {keep} and the tagged ones", file=sys.stderr)
    if page.get("next"):
        print(f"more: --cursor {page['next']}", file=sys.stderr)
    return 0


def _tag(args: argparse.Namespace) -> int:
    import json

    api = _artifacts(args)
    try:
        if args.name is None:
            found: object = {"tags": api.tags(args.org, args.artifact)}
        elif args.delete:
            found = api.delete_tag(args.org, args.artifact, args.name, args.expect)
        elif args.target is None:
            found = api.resolve(args.org, args.artifact, args.name)
        else:
            check = args.expect is not None or args.expect_absent
            found = api.move_tag(
                args.org, args.artifact, args.name, args.target, args.expect, check=check
            )
    except _errors() as e:
        return _fail(args, e)
    if args.json:
        print(json.dumps(found))
        return 0
    assert isinstance(found, dict)
    if args.name is None:
        for t in found["tags"]:
            print(f"{t['tag']}  {t['version']}  set {_when(t['set'])}")
    elif args.delete:
        print(f"deleted tag {args.name} (it pointed at {found['deleted']})")
    elif args.target is None:
        print(f"{args.name} is version {found['version']} (committed {_when(found['committed'])})")
    else:
        was = f" (was {found['previous']})" if found.get("previous") else " (new)"
        print(f"tag {args.name} now points at {found['version']}{was}")
    return 0


def _status(args: argparse.Namespace) -> int:
    import datetime as dt

    from o41.status import StatusError, read, render

    try:
        snapshot = read(args.organization, args.kubeconfig, args.context)
    except StatusError as e:
        return _fail(args, e)
    print("\n".join(render(snapshot, dt.datetime.now(dt.UTC))))
    return 0


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


def _cluster(args: argparse.Namespace) -> int:
    """``cluster add``: a workload cluster's TrustDomain, from its kubeconfig."""
    import yaml

    from o41.clusters import ClusterError, advice, apply, read_workload, trust_domain

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


def _admin(args: argparse.Namespace) -> int:
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


def _connection_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--endpoint", help="placement service URL (default: $O41_ARTIFACTS_ENDPOINT)"
    )
    parser.add_argument("--token-file", help="ServiceAccount token (default: the pod's)")
    parser.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object; an error is one JSON object on stderr",
    )


def _service_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--org", required=True, help="the Organization")
    parser.add_argument("--artifact", required=True, help="the artifact's name")
    _connection_options(parser)


class _Parser(argparse.ArgumentParser):
    """argparse, whose usage errors are one JSON object on stderr when the command line
    has ``--json`` (exit status 2 either way)."""

    json_errors = False

    def error(self, message: str) -> NoReturn:
        if _Parser.json_errors:
            import json

            self.exit(2, json.dumps({"error": f"{self.prog}: {message}", "status": None}) + "\n")
        super().error(message)


def build_parser() -> argparse.ArgumentParser:
    """The parser; a new subcommand is one ``add_parser`` with a lazy handler."""
    from o41 import __version__

    parser = _Parser(
        prog="o41",
        description="O41 Artifacts: artifact placement across clouds. The program's own "
        "version is -V/--version before any command; `o41 read --version` names the "
        "artifact's version to read.",
    )
    parser.add_argument(
        "-V",
        "--version",
        action="version",
        version=f"o41 {__version__}",
        help="print the program's version and exit",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    place = sub.add_parser(
        "place",
        help="show this machine's place (cloud, region) and how it was found",
        description="Work out the place as the client does: env, skypilot, metadata, none.",
    )
    place.add_argument(
        "--json",
        action="store_true",
        help='print one JSON object {"cloud", "region", "source"} (null where unknown)',
    )
    place.set_defaults(handler=_place)

    write = sub.add_parser("write", help="write FILE as a new version of an artifact")
    _service_options(write)
    write.add_argument(
        "file", help="the file to upload, or a directory (one version of all its files)"
    )
    write.add_argument(
        "--metadata",
        action="append",
        metavar="KEY=VALUE|JSON",
        help="kept with the version (repeat it; VALUE is read as JSON when it is JSON: "
        "step=3 is a number); at most 64 keys, 8 KiB",
    )
    write.add_argument("--tag", help="move this tag to the new version when it commits")
    write.add_argument(
        "--resume",
        metavar="VERSION",
        help="finish the write of VERSION (begun earlier, still within its pending lease: "
        "~70 min) from the same FILE: only the parts its bucket lacks are sent",
    )
    write.set_defaults(handler=_write)

    read = sub.add_parser("read", help="read a version of an artifact into a file")
    _service_options(read)
    read.add_argument(
        "--version",
        required=True,
        metavar="ID|latest|TAG",
        help="the version to read: its id, 'latest' (the newest committed) or a tag",
    )
    read.add_argument(
        "--output",
        required=True,
        help="where to write it (a directory version: a new or empty directory)",
    )
    read.add_argument("--path", help="one file of a directory version (its relative path)")
    read.set_defaults(handler=_read)

    files = sub.add_parser("files", help="list the files of a directory version: size, MD5, path")
    _service_options(files)
    files.add_argument(
        "--version", default="latest", metavar="ID|latest|TAG", help="the version (latest)"
    )
    files.set_defaults(handler=_files)

    versions = sub.add_parser(
        "versions",
        help="list an artifact's versions, newest first (without --artifact: the artifacts)",
    )
    versions.add_argument("--org", required=True, help="the Organization")
    versions.add_argument("--artifact", help="the artifact (leave out: list the artifacts)")
    versions.add_argument("--limit", type=int, default=100, help="a page's size (1-1000)")
    versions.add_argument("--cursor", help="continue after a page ('more: --cursor ...')")
    _connection_options(versions)
    versions.set_defaults(handler=_versions)

    tag = sub.add_parser(
        "tag",
        help="list, show, move or delete an artifact's tags",
        description="o41 tag --org O --artifact A: list the tags. ... NAME: the version it "
        "points at. ... NAME VERSION: point it at VERSION (an id or 'latest'); with --expect "
        "V only if it points at V now, with --expect-absent only if it does not exist (a "
        "writer that loses gets an error naming where it points). ... NAME --delete.",
    )
    _service_options(tag)
    tag.add_argument("name", nargs="?", help="the tag")
    tag.add_argument("target", nargs="?", metavar="VERSION", help="an id or 'latest'")
    expect = tag.add_mutually_exclusive_group()
    expect.add_argument("--expect", metavar="VERSION", help="move only if it points here now")
    expect.add_argument(
        "--expect-absent", action="store_true", help="create only: fail if it exists"
    )
    tag.add_argument("--delete", action="store_true", help="delete the tag")
    tag.set_defaults(handler=_tag)

    status = sub.add_parser(
        "status",
        help="an organization at a glance: fallback, defaults, its Locations, warnings",
        description="Read an Organization, its Locations and their last warning Events "
        "from the Kubernetes API (the kubeconfig of kubectl: $KUBECONFIG or ~/.kube/config) "
        "and print them. Also a kubectl plugin: kubectl o41 status ORGANIZATION.",
    )
    status.add_argument("organization", metavar="ORGANIZATION", help="the Organization")
    status.add_argument("--kubeconfig", help="the kubeconfig (default: kubectl's)")
    status.add_argument("--context", help="the kubeconfig's context (default: its current)")
    status.set_defaults(handler=_status)

    token = sub.add_parser(
        "token",
        help="service tokens for callers no cluster vouches for (SkyPilot VMs)",
        description="Create, list and revoke the placement service's own tokens, with a "
        "platform admin's kubeconfig (docs/multi-cluster.md). A token names one "
        "organization and a subject, lasts at most 30 days, and works until revoked.",
    )
    actions = token.add_subparsers(dest="action", required=True, parser_class=_Parser)
    create = actions.add_parser("create", help="print a new token on stdout")
    create.add_argument("--org", required=True, help="the Organization it may use")
    create.add_argument("--subject", required=True, help="who holds it (a DNS label)")
    create.add_argument("--ttl", default="24h", help="lifetime: 90m, 24h, 7d (at most 30d)")
    listing = actions.add_parser("list", help="the tokens not revoked, and when they expire")
    listing.add_argument("--json", action="store_true", help="one JSON array")
    revoke = actions.add_parser("revoke", help="refuse a token from now on")
    revoke.add_argument("id", metavar="ID", help="the token's id (token list)")
    cluster = sub.add_parser(
        "cluster",
        help="trust a workload cluster's tokens (a TrustDomain from its kubeconfig)",
        description="Read a workload cluster's issuer and keys with its kubeconfig and "
        "write the TrustDomain to the hub (the kubeconfig of kubectl, or --kubeconfig): OIDC "
        "discovery when its issuer serves it without credentials, else its keys inline "
        "(docs/multi-cluster.md).",
    )
    cluster_actions = cluster.add_subparsers(dest="action", required=True, parser_class=_Parser)
    add = cluster_actions.add_parser("add", help="write the TrustDomain NAME")
    add.add_argument("name", metavar="NAME", help="the TrustDomain's name (a DNS label)")
    add.add_argument("--from-kubeconfig", required=True, help="the workload cluster's kubeconfig")
    add.add_argument("--from-context", help="its context (default: its current)")
    add.add_argument("--inline-keys", action="store_true", help="put the keys in the spec")
    add.add_argument("--dry-run", action="store_true", help="print the TrustDomain, apply nothing")
    add.add_argument("--kubeconfig", help="the hub's kubeconfig (default: kubectl's)")
    add.add_argument("--context", help="the hub's context")
    add.set_defaults(handler=_cluster, prog_name=add.prog)
    admin = sub.add_parser(
        "admin",
        help="platform admin's operations on the state store (restore, rebuild)",
        description="With a platform admin's kubeconfig (docs/operations.md, 'Backups and "
        "restore').",
    )
    admin_actions = admin.add_subparsers(dest="action", required=True, parser_class=_Parser)
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
    restore.set_defaults(handler=_admin, prog_name=restore.prog)
    rebuilding.set_defaults(handler=_rebuild, prog_name=rebuilding.prog)
    for action in (create, listing, revoke):
        action.add_argument("--namespace", default="o41-system", help="the chart's namespace")
        action.add_argument("--kubeconfig", help="the kubeconfig (default: kubectl's)")
        action.add_argument("--context", help="the kubeconfig's context")
        action.set_defaults(handler=_token, prog_name=action.prog)
    return parser


def main(argv: Sequence[str] | None = None, prog: str = "o41") -> int:
    """Entry point of the ``o41`` console script; returns the exit status."""
    import logging

    logging.basicConfig(level=logging.WARNING, format="o41: %(levelname)s: %(message)s")
    # a write in parts says its version id on stderr: what `--resume` takes after a kill
    logging.getLogger("o41").setLevel(logging.INFO)
    parser = build_parser()
    parser.prog = prog
    given = sys.argv[1:] if argv is None else list(argv)
    _Parser.json_errors = "--json" in given
    args = parser.parse_args(given)
    handler: Handler | None = getattr(args, "handler", None)
    if handler is None:
        parser.print_help(sys.stderr)
        return EXIT_CONFIG
    try:
        return handler(args)
    except ModuleNotFoundError as e:  # a platform admin's command on the light install
        if not e.name or e.name.split(".")[0] == "o41":
            raise
        print(
            f"{prog}: this command needs the server's packages ({e.name} is not installed): "
            "pip install 'o41-artifacts[server]'",
            file=sys.stderr,
        )
        return EXIT_CONFIG


def kubectl_main() -> int:
    """Entry point of the ``kubectl-o41`` console script: ``kubectl o41 status ORG`` (kubectl
    runs a ``kubectl-NAME`` program found on PATH as its plugin ``NAME``)."""
    return main(prog="kubectl o41")


if __name__ == "__main__":
    sys.exit(main())
