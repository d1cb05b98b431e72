"""``o41 write``, ``read``, ``files``, ``versions`` and ``tag``: an artifact's versions
and tags, through the placement service (what pods and Jobs run, on the light install).
Scripts rely on the output, so each format is fixed."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from o41.cli.common import Subcommands, connection_options, fail, service_options

if TYPE_CHECKING:
    from o41.client.artifacts import Artifacts


def _artifacts(args: argparse.Namespace) -> Artifacts:
    from o41.client.artifacts import Artifacts

    return Artifacts(endpoint=args.endpoint, token_file=args.token_file)


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
        return fail(args, e)
    import os

    files: int | None = None
    try:
        if os.path.isdir(args.file):
            if args.resume is not None:
                return fail(args, ValueError("a directory's write does not resume"))
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
        return fail(args, e)
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
        return fail(args, e)
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
        return fail(args, e)
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

    try:
        api = _artifacts(args)  # no endpoint: said as an error, never a traceback
        if args.artifact is None:
            page = api.artifacts_page(args.org, args.cursor, args.limit)
        else:
            page = api.versions_page(args.org, args.artifact, args.cursor, args.limit)
    except _errors() as e:
        return fail(args, e)
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

    try:
        api = _artifacts(args)
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
        return fail(args, e)
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


def add(sub: Subcommands) -> None:
    """``write``, ``read``, ``files``, ``versions``, ``tag``."""
    write = sub.add_parser("write", help="write FILE as a new version of an artifact")
    service_options(write)
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
    service_options(read)
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
    service_options(files)
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
    connection_options(versions)
    versions.set_defaults(handler=_versions)

    tag = sub.add_parser(
        "tag",
        help="list, show, move or delete an artifact's tags",
        description="o41 tag --org O --artifact A: list the tags. ... NAME: the version it "
        "points at. ... NAME VERSION: point it at VERSION (an id or 'latest'); with --expect "
        "V only if it points at V now, with --expect-absent only if it does not exist (a "
        "writer that loses gets an error naming where it points). ... NAME --delete.",
    )
    service_options(tag)
    tag.add_argument("name", nargs="?", help="the tag")
    tag.add_argument("target", nargs="?", metavar="VERSION", help="an id or 'latest'")
    expect = tag.add_mutually_exclusive_group()
    expect.add_argument("--expect", metavar="VERSION", help="move only if it points here now")
    expect.add_argument(
        "--expect-absent", action="store_true", help="create only: fail if it exists"
    )
    tag.add_argument("--delete", action="store_true", help="delete the tag")
    tag.set_defaults(handler=_tag)
