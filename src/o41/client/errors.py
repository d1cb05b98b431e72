"""What the client raises: one hierarchy for every pod-side piece, all of it here (as httpx
keeps its own in ``_exceptions.py`` and huggingface_hub in ``errors.py``).

The artifacts calls, the collections, the place and the connection's settings raise these
classes and no others of their own; an HTTP status becomes its class in one place,
:func:`service_error`, whichever side sent the request::

    O41Error                          any failure the client raises on purpose; the message
    │                                 says what to do. .status (None: no HTTP answer), .body,
    │                                 .resume (a write in parts it ended)
    ├── ConfigError (ValueError)      a setting is wrong; nothing was sent
    │   ├── PlaceConfigError          O41_ARTIFACTS_CLOUD or _REGION set alone
    │   └── CaFileError               O41_ARTIFACTS_CA_FILE unreadable, or no certificate
    ├── Unavailable (ConnectionError) the service cannot answer now: retry shortly
    │   └── TransportError            it did not answer (refused, reset, timed out, a
    │       │                         certificate this pod does not trust); .sent
    │       └── ConnectError          it was not reached: nothing was sent (refused, no
    │                                 such host, the connection or TLS handshake failed)
    ├── ServiceError                  the service answered a refusal: .status, .body
    │   ├── BadRequest (ValueError)   400, 415, 422: the message names the field
    │   │   └── TooLarge              413: a value or body over a limit
    │   ├── NotAllowed (PermissionError)
    │   │   ├── Unauthorized          401: no token, or one the cluster does not accept
    │   │   └── Forbidden             403: the namespace may not use this
    │   ├── NotFound                  404
    │   ├── Conflict (ValueError)     409: .current (where a tag points now)
    │   ├── LimitReached              429, 507: a quota, a rate or the state store's space
    │   └── ServiceUnavailable        503 and other 5xx (an Unavailable too)
    │                                 (every ServiceError: .retry_after, when it said)
    ├── UploadFailed                  the bucket did not take the bytes
    └── Damaged                       bytes read back differ from those written: .part

The names each face has always exported are these same classes: ``ArtifactError`` and
``CollectionError`` (``artifacts.Error``, ``sky.CollectionError``) are :class:`O41Error`,
``InvalidRequest`` is :class:`BadRequest`, ``ValueTooLarge`` is :class:`TooLarge`.

Imports nothing but the standard library's typing: ``o41.client.place`` imports it at a
pod's start-up.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

_EMPTY: Mapping[str, Any] = MappingProxyType({})


class O41Error(Exception):
    """A refusal or failure the user can act on; the message says how.

    ``status``: the HTTP status the service answered (None when it did not answer, or the
    failure is the client's own); ``body``: its JSON answer (empty when none). ``resume``:
    the version id of a write in parts that this error ended while its parts stay in the
    bucket (``write(..., resume=...)``, ``o41 write --resume``), else None."""

    status: int | None = None
    body: Mapping[str, Any] = _EMPTY
    resume: str | None = None


#: The names the faces have always exported for the root: ``artifacts.Error`` (and
#: ``o41.client.errors.ArtifactError``), ``sky.CollectionError``.
ArtifactError = O41Error
CollectionError = O41Error


# ----------------------------------------------------------------------------- settings


class ConfigError(O41Error, ValueError):
    """A setting of the client is wrong (an argument or an environment variable): the
    message names it and the fix. Nothing was sent; retrying does not help."""


class PlaceConfigError(ConfigError):
    """The job's place override is half set: a start-up error, never a silent guess."""

    def __init__(self, present: str, missing: str) -> None:
        self.present = present
        self.missing = missing
        super().__init__(f"{present} is set but {missing} is not: set both or neither")

    def __reduce__(self) -> tuple[Any, ...]:  # pickled as made (a DataLoader worker's)
        return type(self), (self.present, self.missing)


class CaFileError(ConfigError):
    """The CA bundle for the placement service cannot be read or holds no certificate."""


# ------------------------------------------------------------------- no answer, for now


class Unavailable(O41Error, ConnectionError):
    """The placement service cannot answer now: it did not answer at all
    (:class:`TransportError`), or answered 503 or another 5xx (:class:`ServiceUnavailable`:
    etcd without a majority, a token that cannot be checked now, a bucket that failed,
    which ``body["location"]`` names). Retry shortly; a write that failed this way may or
    may not have been applied."""


class TransportError(Unavailable):
    """The placement service did not answer (refused, reset, timed out, or its certificate
    is not one this pod trusts): check the endpoint, then retry.

    ``sent``: whether the request may have reached the service (then a write may or may
    not have been applied); ``retryable``: False when waiting cannot help (a certificate
    this pod does not trust). The client's own retries (``o41.client.backoff``) read
    both."""

    sent: bool = True
    retryable: bool = True


class ConnectError(TransportError):
    """The placement service was not reached: the connection (or a proxy's tunnel, or the
    TLS handshake) failed before the request was sent (refused, no such host, timed out
    connecting), so nothing was applied and sending it again is safe."""

    sent = False


# ---------------------------------------------------------------------------- refusals


class ServiceError(O41Error):
    """The placement service refused or failed a request: ``status`` is its HTTP status,
    ``body`` its JSON answer (``body["error"]`` is the message)."""

    status: int
    _after: float | None = None  # the answer's Retry-After header, in seconds

    def __init__(self, status: int, message: str, body: Mapping[str, Any] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.body = _EMPTY if body is None else body

    @property
    def retry_after(self) -> float | None:
        """Seconds the service asked to wait before trying again (its ``Retry-After``
        header, or a WebSocket answer's ``retry_after``), or None when it did not say."""
        if self._after is not None:
            return self._after
        value = self.body.get("retry_after")
        if isinstance(value, int | float) and not isinstance(value, bool) and value >= 0:
            return value
        return None

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled as made (an error raised in a worker process reaches its parent)."""
        state = {k: v for k, v in self.__dict__.items() if k not in ("status", "body")}
        return type(self), (self.status, str(self), dict(self.body)), state


class BadRequest(ServiceError, ValueError):
    """400, 415, 422: the request is wrong as sent (a name, a key, an argument); the
    message names the field."""


class TooLarge(BadRequest):
    """413: a value, metadata or a body over the service's limit. The collections check a
    value's size before sending it, and raise this too."""


class NotAllowed(ServiceError, PermissionError):
    """401 or 403: the service does not let this caller do this."""


class Unauthorized(NotAllowed):
    """401: no token, or one the cluster does not accept."""


class Forbidden(NotAllowed):
    """403: the pod's namespace may not use the organization (or the write)."""


class NotFound(ServiceError):
    """404: no such organization, artifact, version or tag."""


class Conflict(ServiceError, ValueError):
    """409: the state moved under the request (a tag another writer moved: ``current``
    is the version it points at now; a barrier's parties differ), or the upload is not
    complete yet."""

    @property
    def current(self) -> str | None:
        value = self.body.get("current")
        return value if isinstance(value, str) else None


class LimitReached(ServiceError):
    """429 or 507: the namespace's quota, this token's rate (``retry_after``: seconds, when
    the service said), or the state store's space. The message says the usage, the limit
    and what to do."""


class ServiceUnavailable(ServiceError, Unavailable):
    """503 and other 5xx: the service answered that it cannot do it now (a location whose
    bucket failed is named in ``body["location"]``): retry shortly."""


#: The one map from an HTTP status to its class (any other 5xx: ServiceUnavailable, any
#: other status: ServiceError), for the artifacts calls and the collections alike.
BY_STATUS: Mapping[int, type[ServiceError]] = MappingProxyType(
    {
        400: BadRequest,
        401: Unauthorized,
        403: Forbidden,
        404: NotFound,
        409: Conflict,
        413: TooLarge,
        415: BadRequest,
        422: BadRequest,
        429: LimitReached,
        507: LimitReached,
    }
)


def service_error(
    status: int,
    message: str,
    body: Mapping[str, Any] | None = None,
    retry_after: str | None = None,
) -> ServiceError:
    """The error of the service's answer ``status`` (``message``: its ``error``; ``body``:
    the whole JSON answer; ``retry_after``: its ``Retry-After`` header, if any)."""
    cls = BY_STATUS.get(status)
    if cls is None:
        cls = ServiceUnavailable if status >= 500 else ServiceError
    error = cls(status, message, body)
    if retry_after is not None:
        error._after = retry_after_seconds(retry_after)
    return error


def retry_after_seconds(value: str, now: float | None = None) -> float | None:
    """A ``Retry-After`` header in seconds: delay-seconds, or an HTTP date (RFC 9110
    10.2.3) less ``now`` (epoch seconds; default: the clock), never below 0; None when it
    is neither."""
    value = value.strip()
    if value.isdigit():
        return float(value)
    import email.utils  # an HTTP date: rare, and not worth the import at start-up

    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        return None
    import time

    return max(0.0, when.timestamp() - (time.time() if now is None else now))


InvalidRequest = BadRequest  # the collections' name (sky.InvalidRequest)
ValueTooLarge = TooLarge  # the collections' name (sky.ValueTooLarge)


# ------------------------------------------------------------------------ the bucket side


class UploadFailed(O41Error):
    """The bucket did not take the bytes: the write begins again elsewhere."""


class Damaged(O41Error):
    """The bytes read are not those written: a part's CRC32 (or the object's MD5 or size)
    differs from what the writer recorded. ``part`` is the part's number (1-based), when
    one part is to blame."""

    def __init__(self, message: str, part: int | None = None) -> None:
        super().__init__(message)
        self.part = part


__all__ = [
    "BY_STATUS",
    "ArtifactError",
    "BadRequest",
    "CaFileError",
    "CollectionError",
    "ConfigError",
    "Conflict",
    "ConnectError",
    "Damaged",
    "Forbidden",
    "InvalidRequest",
    "LimitReached",
    "NotAllowed",
    "NotFound",
    "O41Error",
    "PlaceConfigError",
    "ServiceError",
    "ServiceUnavailable",
    "TooLarge",
    "TransportError",
    "Unauthorized",
    "Unavailable",
    "UploadFailed",
    "ValueTooLarge",
    "retry_after_seconds",
    "service_error",
]
