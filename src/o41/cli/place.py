"""``o41 place``: this machine's place (cloud, region) and how the client found it."""

from __future__ import annotations

import argparse

from o41.cli.common import EXIT_CONFIG, Subcommands, fail


def _place(args: argparse.Namespace) -> int:
    import json

    from o41.client.place import PlaceConfigError, explain_place

    try:
        detection = explain_place()
    except PlaceConfigError as e:
        fail(args, e)  # with --json, one JSON object on stderr
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


def add(sub: Subcommands) -> None:
    """``place``."""
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
