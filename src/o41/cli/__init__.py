"""The ``o41`` command (and ``kubectl o41``). Scripts rely on its output, so each
subcommand's format is fixed.

A module per command group adds its subcommands and their handlers (``add``):
``artifacts`` (write, read, files, versions, tag), ``place``, ``status``, ``cluster``,
``token``, ``admin`` (restore, rebuild); ``common`` holds what they share. Handlers import
their implementation lazily: ``o41 place`` must not pay for the cloud SDKs a later
``o41 write`` needs, and the pod's commands run on the light install (no kubernetes).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from o41.cli.common import EXIT_CONFIG, Handler, Parser


def build_parser() -> argparse.ArgumentParser:
    """The parser; a new subcommand is one ``add_parser`` with a lazy handler, in its group."""
    from o41 import __version__

    # here, not at the top: ``import o41.cli`` stays as light as a pod's start wants
    from o41.cli import admin, artifacts, cluster, place, status, token

    parser = Parser(
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
    for group in (place, artifacts, status, token, cluster, admin):  # the order of --help
        group.add(sub)
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
    Parser.json_errors = "--json" in given
    args = parser.parse_args(given)
    handler: Handler | None = getattr(args, "handler", None)
    if handler is None:
        parser.print_help(sys.stderr)
        return EXIT_CONFIG
    from o41.cli.common import fail
    from o41.client.errors import O41Error

    try:
        return handler(args)
    except O41Error as e:  # a client error a handler did not say itself: said, no traceback
        return fail(args, e)
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
