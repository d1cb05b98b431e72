"""What the command groups share: the exit status of a configuration error, the parser
class (usage errors as JSON with ``--json``), an error on stderr, and the options that
reach the placement service. It imports no group and not the package's ``__init__``, so
every group imports it without a cycle."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import NoReturn, TypeAlias

#: Exit status for a configuration error (argparse uses 2 for usage errors too).
EXIT_CONFIG = 2

Handler = Callable[[argparse.Namespace], int]


def fail(args: argparse.Namespace, e: Exception) -> int:
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


def connection_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--endpoint", help="placement service URL (default: $O41_ARTIFACTS_ENDPOINT)"
    )
    parser.add_argument("--token-file", help="ServiceAccount token (default: the pod's)")
    parser.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object; an error is one JSON object on stderr",
    )


def service_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--org", required=True, help="the Organization")
    parser.add_argument("--artifact", required=True, help="the artifact's name")
    connection_options(parser)


class Parser(argparse.ArgumentParser):
    """argparse, whose usage errors are one JSON object on stderr when the command line
    has ``--json`` (exit status 2 either way)."""

    json_errors = False

    def error(self, message: str) -> NoReturn:
        if Parser.json_errors:
            import json

            self.exit(2, json.dumps({"error": f"{self.prog}: {message}", "status": None}) + "\n")
        super().error(message)


#: What ``build_parser`` hands each group's ``add``: the ``o41`` command's subcommands.
Subcommands: TypeAlias = "argparse._SubParsersAction[Parser]"
