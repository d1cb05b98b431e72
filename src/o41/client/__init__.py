"""The client used inside pods: its place, and writes, reads and collections through the
service.

A module a capability, layered (pyproject.toml's import-linter contract): ``directories``
on ``artifacts`` (the client: ``Artifacts``, its results) and ``collections`` (the objects
``sky`` hands out), on ``retries``, ``reads`` (downloads, the range readers) and
``transport`` (the collections' HTTP, WebSocket or in-process engine), on ``connection``
(the one :class:`Connection` to the placement service both sides use: endpoint, token, CA
file, place, timeout), on ``transfers`` (pre-signed URLs, the part pool, checksums) and
``place``, on ``tls``, and at the bottom ``errors`` (the one hierarchy, for every piece).

Kept tiny on purpose: pods import it at start-up, so names are loaded on first use only.
"""

from __future__ import annotations

TYPE_CHECKING = False  # not ``typing.TYPE_CHECKING``: this module imports nothing
if TYPE_CHECKING:
    from o41.client.connection import Connection as Connection
    from o41.client.errors import O41Error as O41Error
    from o41.client.place import detect_place as detect_place

__all__ = ["Connection", "O41Error", "detect_place"]


def __getattr__(name: str) -> object:
    if name == "detect_place":
        from o41.client.place import detect_place

        return detect_place
    if name == "Connection":
        from o41.client.connection import Connection

        return Connection
    if name == "O41Error":
        from o41.client.errors import O41Error

        return O41Error
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
