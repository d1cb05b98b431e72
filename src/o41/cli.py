"""The ``o41`` command. Scripts rely on its output, so each subcommand's format is fixed.

Subcommands are argparse sub-parsers whose handlers import their implementation lazily:
``o41 place`` must not pay for the cloud SDKs a later ``o41 write`` needs.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

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
        print(f"o41 place: {e}", file=sys.stderr)
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


def _write(args: argparse.Namespace) -> int:
    import json

    from o41.client.artifacts import ArtifactError
    from o41.client.place import PlaceConfigError

    try:
        written = _artifacts(args).write(args.org, args.artifact, args.file)
    except (ArtifactError, PlaceConfigError, OSError) as e:
        print(f"o41 write: {e}", file=sys.stderr)
        return 1
    if args.json:
        print(
            json.dumps(
                {
                    "version": written.version,
                    "location": written.location,
                    "rule": written.rule,
                    "warning": written.warning,
                }
            )
        )
    else:
        print(
            f"wrote {args.artifact} version {written.version} ({written.size} bytes) to "
            f"location {written.location} (rule: {written.rule})"
        )
    return 0


def _read(args: argparse.Namespace) -> int:
    import json

    from o41.client.artifacts import ArtifactError
    from o41.client.place import PlaceConfigError

    try:
        got = _artifacts(args).read(args.org, args.artifact, args.version, args.output)
    except (ArtifactError, PlaceConfigError, OSError) as e:
        print(f"o41 read: {e}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps({"location": got.location, "locality": got.locality}))
    else:
        print(
            f"read {args.artifact} version {got.version} ({got.size} bytes) from location "
            f"{got.location} ({got.locality})"
        )
    return 0


def _service_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--org", required=True, help="the Organization")
    parser.add_argument("--artifact", required=True, help="the artifact's name")
    parser.add_argument(
        "--endpoint", help="placement service URL (default: $O41_ARTIFACTS_ENDPOINT)"
    )
    parser.add_argument("--token-file", help="ServiceAccount token (default: the pod's)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def build_parser() -> argparse.ArgumentParser:
    """The parser; a new subcommand is one ``add_parser`` with a lazy handler."""
    parser = argparse.ArgumentParser(
        prog="o41", description="O41 Artifacts: artifact placement across clouds."
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
    write.add_argument("file", help="the file to upload")
    write.set_defaults(handler=_write)

    read = sub.add_parser("read", help="read a version of an artifact into a file")
    _service_options(read)
    read.add_argument("--version", required=True, help="the version to read")
    read.add_argument("--output", required=True, help="where to write it")
    read.set_defaults(handler=_read)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``o41`` console script; returns the exit status."""
    import logging

    logging.basicConfig(level=logging.WARNING, format="o41: %(levelname)s: %(message)s")
    parser = build_parser()
    args = parser.parse_args(argv)
    handler: Handler | None = getattr(args, "handler", None)
    if handler is None:
        parser.print_help(sys.stderr)
        return EXIT_CONFIG
    return handler(args)


if __name__ == "__main__":
    sys.exit(main())
