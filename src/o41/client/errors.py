"""What the artifacts client raises: one hierarchy, all of it here (as httpx keeps its own).

``ArtifactError`` is the root: a refusal or failure the user can act on. ``ServiceError``
and its subclasses are the placement service's answers by HTTP status; ``UploadFailed``
and ``Damaged`` are the bucket's side (bytes not taken, or bytes read back that are not
those written). ``o41.artifacts`` (the SDK) exports the public ones under its own names.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class ArtifactError(Exception):
    """A refusal or failure the user can act on; the message says how. ``resume``: the
    version id of a write in parts that this error ended while its parts stay in the
    bucket (``write(..., resume=...)``, ``o41 write --resume``), else None."""

    resume: str | None = None


class TransportError(ArtifactError):
    """The placement service did not answer (refused, timed out, reset): retry."""


class ServiceError(ArtifactError):
    """The placement service refused or failed a request: ``status`` is its HTTP status,
    ``body`` its JSON answer (``body["error"]`` is the message)."""

    def __init__(self, status: int, message: str, body: Mapping[str, Any]) -> None:
        super().__init__(message)
        self.status, self.body = status, body


class BadRequest(ServiceError):
    """400, 413, 415, 422: the request is wrong as sent; the message names the field."""


class Unauthorized(ServiceError):
    """401: no token, or one the cluster does not accept."""


class Forbidden(ServiceError):
    """403: the pod's namespace may not use the organization (or the write)."""


class NotFound(ServiceError):
    """404: no such organization, artifact, version or tag."""


class Conflict(ServiceError):
    """409: the state moved under the request (a tag another writer moved: ``current``
    is the version it points at now), or the upload is not complete yet."""

    @property
    def current(self) -> str | None:
        value = self.body.get("current")
        return value if isinstance(value, str) else None


class Unavailable(ServiceError):
    """429, 503 and other 5xx: retry shortly (a location that failed is named)."""


def service_error(status: int, message: str, body: Mapping[str, Any]) -> ServiceError:
    """The :class:`ServiceError` subclass of ``status``."""
    cls: type[ServiceError]
    if status in (400, 413, 415, 422):
        cls = BadRequest
    elif status == 401:
        cls = Unauthorized
    elif status == 403:
        cls = Forbidden
    elif status == 404:
        cls = NotFound
    elif status == 409:
        cls = Conflict
    elif status == 429 or status >= 500:
        cls = Unavailable
    else:
        cls = ServiceError
    return cls(status, message, body)


class UploadFailed(ArtifactError):
    """The bucket did not take the bytes: the write begins again elsewhere."""


class Damaged(ArtifactError):
    """The bytes read are not those written: a part's CRC32 (or the object's MD5 or size)
    differs from what the writer recorded. ``part`` is the part's number (1-based), when
    one part is to blame."""

    def __init__(self, message: str, part: int | None = None) -> None:
        super().__init__(message)
        self.part = part
