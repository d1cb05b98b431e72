"""What a collections request may ask, checked before anything reaches the store: names,
keys, values and arguments; refusals carry the HTTP status the service answers with.

Layout: every collection lives under
``/o41/collections/<namespace>/<compute>/<kind>/<name>/``; the namespace always comes from
the authenticated caller, never from the request.
"""

from __future__ import annotations

from typing import Any

from o41.collections import keys
from o41.collections.keys import check_encoded
from o41.collections.values import MAX_VALUE
from o41.core.operations import OPERATION_FIELD, check_operation
from o41.state.base import Consistency, KeyValue

ROOT = b"/o41/collections/"
KINDS = ("dict", "set", "counter", "queue", "registry", "barrier", "lock")


class CollectionError(Exception):
    """A refusal with an HTTP status; the message says what to do."""

    status = 400


class BadRequest(CollectionError):
    status = 400


class TooLarge(CollectionError):
    status = 413


class Conflict(CollectionError):
    status = 409


class Busy(CollectionError):
    status = 503


class Full(CollectionError):
    """The state store's space quota is reached: writes are refused until an administrator
    frees space (507, as WebDAV's Insufficient Storage: retrying does not help)."""

    status = 507


class Unavailable(CollectionError):
    """The state store cannot answer now (etcd without a majority)."""

    status = 503


def check_name(what: str, name: object) -> str:
    try:
        return keys.check_name(what, name)
    except ValueError as e:
        raise BadRequest(str(e)) from None


def collection_prefix(namespace: str, compute: str, kind: str, name: str) -> bytes:
    """Where one collection's keys live; ``namespace`` is the caller's, authenticated."""
    if not namespace or "/" in namespace:
        raise BadRequest(f"bad namespace {namespace!r}")
    check_name("compute", compute)
    check_name("collection", name)
    if kind not in KINDS:
        raise BadRequest(f"unknown collection kind {kind!r}: one of {', '.join(KINDS)}")
    return ROOT + f"{namespace}/{compute}/{kind}/{name}/".encode()


def key_arg(args: dict[str, Any]) -> bytes:
    try:
        return check_encoded(args.get("key")).encode()
    except ValueError as e:
        raise BadRequest(str(e)) from None


def value_arg(args: dict[str, Any]) -> bytes:
    value = args.get("value")
    if not isinstance(value, bytes):
        raise BadRequest("a value is required (bytes, base64 in JSON)")
    if len(value) > MAX_VALUE:
        raise TooLarge(
            f"value too large: {len(value)} bytes serialized, the limit is {MAX_VALUE}; store "
            "large objects as artifacts and keep their names here"
        )
    return value


def int_arg(
    args: dict[str, Any],
    name: str,
    default: int | None = None,
    lo: int = -(2**63),
    hi: int = 2**63 - 1,
) -> int:
    value = args.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise BadRequest(f"{name} must be an integer in [{lo}, {hi}]")
    return value


def float_arg(args: dict[str, Any], name: str, default: float) -> float:
    value = args.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
        raise BadRequest(f"{name} must be a number of seconds >= 0")
    return float(value)


def id_arg(args: dict[str, Any], name: str) -> str:
    value = args.get(name)
    if not isinstance(value, str) or not 0 < len(value) <= 200:
        raise BadRequest(f"{name} must be a string of 1-200 characters")
    return value


def consistency_arg(args: dict[str, Any]) -> Consistency:
    value = args.get("consistency", "strong")
    if value not in ("strong", "eventual"):
        raise BadRequest(f"consistency must be 'strong' or 'eventual', not {value!r}")
    return "eventual" if value == "eventual" else "strong"


def counter_value(kv: KeyValue | None) -> int:
    return int(kv.value) if kv is not None and kv.value else 0


def operation_arg(args: dict[str, Any]) -> str | None:
    """The operation's id (``operation``), checked; None when the caller sent none."""
    value = args.get(OPERATION_FIELD)
    if value is None:
        return None
    try:
        return check_operation(value)
    except ValueError as e:
        raise BadRequest(str(e)) from None
