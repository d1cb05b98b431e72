"""The ``o41`` command. Scripts rely on its output, so each subcommand's format is fixed.

Subcommands are argparse sub-parsers whose handlers import their implementation lazily:
``o41 place`` must not pay for the cloud SDKs a later ``o41 write`` needs.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

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
