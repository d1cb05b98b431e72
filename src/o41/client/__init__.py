"""The client used inside pods: its place, and writes and reads through the service.

A module a capability, layered (pyproject.toml's import-linter contract): ``directories``
on ``artifacts`` (the client: ``Artifacts``, its results), on ``retries``, ``reads``
(downloads, the range readers), ``transfers`` (pre-signed URLs, the part pool,
checksums), and at the bottom ``errors`` (the one hierarchy) and ``place``.

Kept tiny on purpose: pods import it at start-up, so names are loaded on first use only.
"""

from __future__ import annotations

TYPE_CHECKING = False  # not ``typing.TYPE_CHECKING``: this module imports nothing
if TYPE_CHECKING:
    from o41.client.place import detect_place as detect_place

__all__ = ["detect_place"]


def __getattr__(name: str) -> object:
    if name == "detect_place":
        from o41.client.place import detect_place

        return detect_place
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
