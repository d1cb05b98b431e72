"""Artifact versions for training code: ``from o41 import artifacts``.

.. code-block:: python

    from o41 import artifacts

    last = artifacts.latest("ml", "checkpoint")          # None before the first write
    if last is not None:
        state = torch.load(artifacts.open("ml", "checkpoint", last.version))
        start = last.metadata["step"] + 1
    ...
    artifacts.write("ml", "checkpoint", buffer.getvalue(), metadata={"step": step})
    artifacts.tag("ml", "checkpoint", "best", written.version)

A version is written once, to the one location placement chose for this pod's place (the
same detection as the ``o41`` command, done once per process), and read from anywhere. A
reference to a version is its id, ``"latest"`` (the newest committed version) or a tag
(``"best"``); the service resolves it and every answer names the version it read.

Every function here is a method of :class:`Client` too; the module's functions use one
client made on first use from ``$O41_ARTIFACTS_ENDPOINT`` and the pod's ServiceAccount
token (:func:`configure` makes another). A client holds one connection to the service
(``o41.client.connection.Connection``: endpoint, token, CA file, place, timeout, read
once), and its ``collections`` are ``sky``'s collections over that same connection.
Errors are :class:`Error` and its subclasses, the client's one hierarchy (``sky``'s
errors are the same classes); the message of each says what to do. See docs/artifacts.md.
"""

from __future__ import annotations

import io
import os
import shutil
import tempfile
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, Final

from o41.client import directories as _directories
from o41.client.artifacts import Artifacts, CacheSetting
from o41.client.connection import Connection, connection_of
from o41.client.errors import (
    ArtifactError,
    BadRequest,
    ConfigError,
    Conflict,
    Damaged,
    Forbidden,
    LimitReached,
    NotAllowed,
    NotFound,
    ServiceError,
    TransportError,
    Unauthorized,
    Unavailable,
)
from o41.client.progress import Callback
from o41.core.places import Place

if TYPE_CHECKING:
    from o41.client import collections as _collections

__all__ = [
    "ANY",
    "LATEST",
    "ArtifactInfo",
    "BadRequest",
    "Client",
    "ConfigError",
    "Conflict",
    "Damaged",
    "Directory",
    "Error",
    "FileInfo",
    "Forbidden",
    "LimitReached",
    "NotAllowed",
    "NotFound",
    "Page",
    "Read",
    "ServiceError",
    "Tag",
    "TransportError",
    "Unauthorized",
    "Unavailable",
    "Version",
    "VersionFile",
    "Written",
    "artifacts",
    "configure",
    "delete_tag",
    "files",
    "latest",
    "open",
    "pages",
    "read",
    "read_bytes",
    "read_file",
    "read_range",
    "resolve",
    "tag",
    "tags",
    "versions",
    "write",
]

#: The base of every error of this module (and of the ``o41`` command's client, and of
#: ``sky``: the client's one hierarchy, ``o41.client.errors.O41Error``).
Error = ArtifactError
LATEST: Final = "latest"

Source = str | os.PathLike[str] | bytes | bytearray | memoryview | BinaryIO


class _Any:
    def __repr__(self) -> str:
        return "ANY"


#: :func:`tag`'s default ``expected``: move the tag whatever it points at now.
ANY: Final = _Any()


@dataclass(frozen=True)
class Version:
    """A committed version: where it lives, how big, when, from where, and its metadata."""

    version: str
    location: str
    size: int
    md5: str | None
    committed: float  # seconds since the epoch
    writer: Place  # the place of the pod that wrote it
    metadata: dict[str, Any] = field(default_factory=dict)
    tag: str | None = None  # the tag it was resolved by, if any
    files: int | None = None  # a directory version's number of files; None: one file

    @classmethod
    def of(cls, found: Mapping[str, Any]) -> Version:
        w = found.get("writer") or {}
        return cls(
            version=found["version"],
            location=found["location"],
            size=found["size"],
            md5=found.get("md5"),
            committed=found["committed"],
            writer=Place(w.get("cloud"), w.get("region"), w.get("source", "none")),
            metadata=dict(found.get("metadata") or {}),
            tag=found.get("tag"),
            files=found.get("files"),
        )


@dataclass(frozen=True)
class Written:
    version: str
    location: str
    rule: str  # region, cloud or fallback: how placement chose the location
    warning: str | None  # set when the location is far from the writer
    size: int
    tag: str | None = None
    files: int | None = None  # a directory's number of files; None: one file


@dataclass(frozen=True)
class Read:
    version: str  # the version read: what "latest" or the tag named at the time
    location: str
    locality: str  # local, cross-region or cross-cloud
    size: int
    tag: str | None = None
    files: int | None = None  # a directory's number of files; None: one file


@dataclass(frozen=True)
class FileInfo:
    """One file of a directory version."""

    path: str  # relative, '/' between names
    size: int
    md5: str


@dataclass(frozen=True)
class Directory:
    """A directory version's files, sorted by path."""

    version: str  # the version listed (what "latest" or the tag named)
    location: str
    size: int  # of all its files
    files: list[FileInfo]
    metadata: dict[str, Any] = field(default_factory=dict)
    tag: str | None = None


@dataclass(frozen=True)
class Page:
    """One page of a listing, newest first; ``next`` continues it (None: the last)."""

    versions: list[Version]
    next: str | None


@dataclass(frozen=True)
class Tag:
    artifact: str
    tag: str
    version: str
    set: float  # when it was last moved
    previous: str | None = None  # what it pointed at before this move, if it existed


@dataclass(frozen=True)
class ArtifactInfo:
    artifact: str
    last_version: str
    last_committed: float


class VersionFile(io.BufferedReader):
    """A version open for reading: from this node's cache (fetched into it first), or
    without one from the bucket as they are read (seekable, with a ranged GET after a
    seek). ``version`` is the one that was opened; ``locality`` is ``cached`` when the
    bytes were here already."""

    def __init__(self, raw: io.RawIOBase, found: Mapping[str, Any]) -> None:
        super().__init__(raw, buffer_size=1024 * 1024)
        self.version: str = found["version"]
        self.tag: str | None = found.get("tag")
        self.location: str = found["location"]
        self.locality: str = found["locality"]
        self.size: int = found["size"]
        self.metadata: dict[str, Any] = dict(found.get("metadata") or {})


class Client:
    """The SDK on one connection to the placement service; the module's functions use a
    default one.

    ``endpoint`` (default ``$O41_ARTIFACTS_ENDPOINT``), ``token_file`` (default
    ``$O41_ARTIFACTS_TOKEN_FILE``, else ``$O41_ARTIFACTS_TOKEN``, else the pod's
    ServiceAccount token), ``place`` (default: detected once), ``timeout`` (seconds, default
    60), ``ca_file`` (the CA bundle of an ``https://`` service of a private CA, default
    ``$O41_ARTIFACTS_CA_FILE``; neither: the system's roots), ``token`` (the token itself,
    default ``$O41_ARTIFACTS_TOKEN`` unless a token file is given) and ``retry_deadline``
    (seconds a call is tried for while the service blinks, default
    ``$O41_ARTIFACTS_RETRY_DEADLINE``, else 300; 0: no retries) make its
    ``o41.client.connection.Connection``; or give ``connection``, one made already (then
    none of the others). :attr:`collections` are ``sky``'s over the same connection.

    ``cache``: this node's cache of the versions it read (``o41.client.cache``): None
    (default) for ``$O41_ARTIFACTS_CACHE``'s (by default ``~/.cache/o41/artifacts``, or
    under ``$XDG_CACHE_HOME``; ``off`` for none), a folder, or False for none.
    """

    def __init__(
        self,
        endpoint: str | None = None,
        token_file: str | None = None,
        place: Place | None = None,
        timeout: float | None = None,
        ca_file: str | None = None,
        *,
        token: str | None = None,
        retry_deadline: float | None = None,
        connection: Connection | None = None,
        cache: CacheSetting = None,
    ) -> None:
        connection = connection_of(
            connection,
            endpoint=endpoint,
            token=token,
            token_file=token_file,
            place=place,
            timeout=timeout,
            ca_file=ca_file,
            retry_deadline=retry_deadline,
        )
        self._api = Artifacts(connection=connection, cache=cache)
        self._collections: _collections.Client | None = None
        self._collections_lock = threading.Lock()

    @property
    def connection(self) -> Connection:
        """The connection to the service: endpoint, token, CA file, place, timeout."""
        return self._api.connection

    @property
    def place(self) -> Place:
        """This pod's place, detected once (env, SkyPilot, cloud metadata, none)."""
        return self._api.place

    @property
    def collections(self) -> _collections.Client:
        """The distributed collections of this pod's compute (what ``sky`` hands out:
        ``client.collections.dict("d")``), over this client's connection: the same
        endpoint, token and CA. Made on first use; ``sky.configure(client.collections)``
        makes ``sky.*`` use it."""
        with self._collections_lock:
            if self._collections is None:
                from o41.client.collections import Client as Collections

                self._collections = Collections.over(self.connection)
            return self._collections

    # --- write -------------------------------------------------------------------------

    def write(
        self,
        organization: str,
        artifact: str,
        source: Source,
        *,
        metadata: Mapping[str, Any] | None = None,
        tag: str | None = None,
        resume: str | None = None,
        callback: Callback | None = None,
    ) -> Written:
        """Write ``source`` as a new version: a path (uploaded without a copy, in parallel
        parts when large; a directory is one version of all its files, uploaded in
        parallel and committed at once), bytes, or a binary file object (a ``BytesIO`` is sent from
        memory; another is read to a temporary file first, since a write declares its
        size). ``metadata``: small JSON key/values kept with the version (at most 64 keys,
        8 KiB). ``tag``: moved to this version when it commits. ``resume``: the version id
        of a write of the same source in parts that did not finish (the log of the pod
        that began it names it): only the parts the bucket lacks are sent. ``callback``
        (an ``fsspec.callbacks.Callback``, or anything with ``set_size`` and
        ``relative_update``): told the size, then the bytes as they go; no bar then."""
        api = self._api

        def write_bytes(data: bytes | bytearray | memoryview) -> Any:
            return api.write_bytes(
                organization,
                artifact,
                data,
                metadata=metadata,
                tag=tag,
                resume=resume,
                callback=callback,
            )

        def write_path(path: str | Path) -> Any:
            return api.write(
                organization,
                artifact,
                path,
                metadata=metadata,
                tag=tag,
                resume=resume,
                callback=callback,
            )

        if isinstance(source, bytes | bytearray | memoryview):
            w = write_bytes(source)
        elif isinstance(source, str | os.PathLike):
            path = Path(source)
            if path.is_dir():
                if resume is not None:
                    raise Error(f"{path} is a directory: a directory's write does not resume")
                d = _directories.write_dir(
                    api, organization, artifact, path, metadata=metadata, tag=tag, callback=callback
                )
                return Written(d.version, d.location, d.rule, d.warning, d.size, d.tag, d.files)
            w = write_path(path)
        elif isinstance(source, io.BytesIO):
            view = source.getbuffer()[source.tell() :]
            w = write_bytes(view)
        elif hasattr(source, "read"):
            with tempfile.NamedTemporaryFile(prefix="o41-", suffix=".spool") as spool:
                shutil.copyfileobj(source, spool, 1024 * 1024)
                spool.flush()
                w = write_path(spool.name)
        else:
            raise TypeError(
                f"write takes a path, bytes or a binary file object, not {type(source).__name__}"
            )
        return Written(w.version, w.location, w.rule, w.warning, w.size, w.tag)

    # --- read --------------------------------------------------------------------------

    def read(
        self,
        organization: str,
        artifact: str,
        version: str,
        path: str | os.PathLike[str],
        *,
        callback: Callback | None = None,
    ) -> Read:
        """Download ``version`` (an id, ``"latest"`` or a tag) to ``path``, written whole
        or not at all; large versions come as parallel ranges. A directory version is
        read to the directory ``path`` (new or empty), its files in parallel. Through this
        node's cache (``cache``): a version read here before costs no fetch
        (``Read.locality`` is ``cached``). A download that stops goes on from the bytes it
        has; one that fails keeps them (``path.o41-partial``) for the next read.
        ``callback``: as :meth:`write`'s."""
        r, count = _directories.read_any(
            self._api, organization, artifact, version, Path(path), callback=callback
        )
        return Read(r.version, r.location, r.locality, r.size, r.tag, count)

    def read_bytes(
        self,
        organization: str,
        artifact: str,
        version: str = LATEST,
        *,
        path: str | None = None,
        callback: Callback | None = None,
    ) -> bytes:
        """A version's bytes (checked against its size, and MD5 when known); ``path``:
        one file of a directory version. To know which version ``"latest"`` was, use
        :meth:`open` (its ``version``) or :meth:`resolve` first and read by id.
        ``callback``: as :meth:`write`'s."""
        if path is not None:
            with self.open(organization, artifact, version, path=path) as f:
                data: bytes = f.read()
            if callback is not None:
                callback.set_size(len(data))
                callback.relative_update(len(data))
            return data
        data, _ = self._api.read_bytes(organization, artifact, version, callback=callback)
        return data

    def read_range(
        self, organization: str, artifact: str, version: str, start: int, length: int
    ) -> bytes:
        """``length`` bytes of a version from offset ``start`` (fewer at its end), in one
        ranged GET; every recorded part the range covers whole is checked (:class:`Damaged`
        if it differs). Many ranges of one version: :meth:`open` and seek."""
        data, _ = self._api.read_range(organization, artifact, version, start, length)
        return data

    def open(
        self, organization: str, artifact: str, version: str = LATEST, *, path: str | None = None
    ) -> VersionFile:
        """A version as a seekable binary file object (``torch.load(f)``,
        ``tarfile.open(fileobj=f)``). Through this node's cache: a version not there yet is
        fetched into it whole first (in parallel ranges), then read from there; without a
        cache, reading starts at once, before the whole version is down (ranged GETs as it
        is read). ``path``: one file of a directory version."""
        if path is not None:
            raw, found = _directories.open_file(self._api, organization, artifact, version, path)
            return VersionFile(raw, found)
        raw, found = self._api.open(organization, artifact, version)
        return VersionFile(raw, found)

    def read_file(
        self,
        organization: str,
        artifact: str,
        version: str,
        path: str,
        output: str | os.PathLike[str],
        *,
        callback: Callback | None = None,
    ) -> Read:
        """One file (``path``) of a directory version to ``output``, whole or not at all
        (through the cache, and going on from its bytes, as :meth:`read`)."""
        r = _directories.read_file(
            self._api, organization, artifact, version, path, output, callback=callback
        )
        return Read(r.version, r.location, r.locality, r.size, r.tag)

    def files(self, organization: str, artifact: str, version: str = LATEST) -> Directory:
        """A directory version's files with their sizes and MD5s, sorted by path."""
        found = _directories.listing(self._api, organization, artifact, version)
        return Directory(
            found["version"],
            found["location"],
            found["size"],
            [FileInfo(f["path"], f["size"], f["md5"]) for f in found["files"]],
            dict(found.get("metadata") or {}),
            found.get("tag"),
        )

    # --- versions ----------------------------------------------------------------------

    def pages(
        self,
        organization: str,
        artifact: str,
        *,
        page_size: int = 100,
        cursor: str | None = None,
    ) -> Iterator[Page]:
        """An artifact's versions, newest first, a page at a time (each page is one call;
        a page's ``next`` passed as ``cursor`` continues there)."""
        while True:
            got = self._api.versions_page(organization, artifact, cursor, page_size)
            page = Page([Version.of(v) for v in got["versions"]], got.get("next"))
            yield page
            if page.next is None:
                return
            cursor = page.next

    def versions(
        self, organization: str, artifact: str, *, page_size: int = 100
    ) -> Iterator[Version]:
        """Every version of an artifact, newest first, fetched a page at a time."""
        for page in self.pages(organization, artifact, page_size=page_size):
            yield from page.versions

    def latest(self, organization: str, artifact: str) -> Version | None:
        """The newest committed version, or None when the artifact has none yet."""
        page = next(self.pages(organization, artifact, page_size=1))
        return page.versions[0] if page.versions else None

    def resolve(self, organization: str, artifact: str, ref: str) -> Version:
        """The version ``ref`` (an id, ``"latest"`` or a tag) names now, with its metadata."""
        return Version.of(self._api.resolve(organization, artifact, ref))

    def artifacts(self, organization: str, *, page_size: int = 100) -> Iterator[ArtifactInfo]:
        """The organization's artifacts, by name."""
        cursor: str | None = None
        while True:
            got = self._api.artifacts_page(organization, cursor, page_size)
            for a in got["artifacts"]:
                yield ArtifactInfo(a["artifact"], a["lastVersion"], a["lastCommitted"])
            cursor = got.get("next")
            if cursor is None:
                return

    # --- tags --------------------------------------------------------------------------

    def tag(
        self,
        organization: str,
        artifact: str,
        name: str,
        version: str = LATEST,
        *,
        expected: str | _Any | None = ANY,
    ) -> Tag:
        """Point tag ``name`` at ``version`` (an id or ``"latest"``, resolved on the
        service). With ``expected`` a version id, only if the tag points there now; with
        ``expected=None``, only if it does not exist yet: a writer that loses the race gets
        :class:`Conflict`, whose ``current`` is where the tag points."""
        check = not isinstance(expected, _Any)
        moved = self._api.move_tag(
            organization,
            artifact,
            name,
            version,
            None if isinstance(expected, _Any) else expected,
            check=check,
        )
        return Tag(artifact, name, moved["version"], moved["set"], moved.get("previous"))

    def delete_tag(
        self, organization: str, artifact: str, name: str, *, expected: str | None = None
    ) -> str:
        """Delete tag ``name`` (only if it points at ``expected``, when given); returns
        the version it pointed at."""
        deleted: str = self._api.delete_tag(organization, artifact, name, expected)["deleted"]
        return deleted

    def tags(self, organization: str, artifact: str) -> list[Tag]:
        """An artifact's tags and what they point at."""
        return [
            Tag(t["artifact"], t["tag"], t["version"], t["set"])
            for t in self._api.tags(organization, artifact)
        ]


_default: Client | None = None
_lock = threading.Lock()


def configure(
    endpoint: str | None = None,
    token_file: str | None = None,
    place: Place | None = None,
    timeout: float | None = None,
    ca_file: str | None = None,
    *,
    token: str | None = None,
    retry_deadline: float | None = None,
    connection: Connection | None = None,
    cache: CacheSetting = None,
) -> Client:
    """Make the client the module's functions use (by default: on first use, from the
    environment), as :class:`Client` takes its settings (every one of them: a test keeps
    the two signatures the same)."""
    global _default
    with _lock:
        _default = Client(
            endpoint,
            token_file,
            place,
            timeout,
            ca_file,
            token=token,
            retry_deadline=retry_deadline,
            connection=connection,
            cache=cache,
        )
        return _default


def _client() -> Client:
    global _default
    with _lock:
        if _default is None:
            _default = Client()
        return _default


def write(
    organization: str,
    artifact: str,
    source: Source,
    *,
    metadata: Mapping[str, Any] | None = None,
    tag: str | None = None,
    resume: str | None = None,
    callback: Callback | None = None,
) -> Written:
    """:meth:`Client.write` on the default client."""
    return _client().write(
        organization, artifact, source, metadata=metadata, tag=tag, resume=resume, callback=callback
    )


def read(
    organization: str,
    artifact: str,
    version: str,
    path: str | os.PathLike[str],
    *,
    callback: Callback | None = None,
) -> Read:
    """:meth:`Client.read` on the default client."""
    return _client().read(organization, artifact, version, path, callback=callback)


def read_bytes(
    organization: str,
    artifact: str,
    version: str = LATEST,
    *,
    path: str | None = None,
    callback: Callback | None = None,
) -> bytes:
    """:meth:`Client.read_bytes` on the default client."""
    return _client().read_bytes(organization, artifact, version, path=path, callback=callback)


def read_range(organization: str, artifact: str, version: str, start: int, length: int) -> bytes:
    """:meth:`Client.read_range` on the default client."""
    return _client().read_range(organization, artifact, version, start, length)


def open(
    organization: str, artifact: str, version: str = LATEST, *, path: str | None = None
) -> VersionFile:
    """:meth:`Client.open` on the default client."""
    return _client().open(organization, artifact, version, path=path)


def read_file(
    organization: str,
    artifact: str,
    version: str,
    path: str,
    output: str | os.PathLike[str],
    *,
    callback: Callback | None = None,
) -> Read:
    """:meth:`Client.read_file` on the default client."""
    return _client().read_file(organization, artifact, version, path, output, callback=callback)


def files(organization: str, artifact: str, version: str = LATEST) -> Directory:
    """:meth:`Client.files` on the default client."""
    return _client().files(organization, artifact, version)


def pages(
    organization: str, artifact: str, *, page_size: int = 100, cursor: str | None = None
) -> Iterator[Page]:
    """:meth:`Client.pages` on the default client."""
    return _client().pages(organization, artifact, page_size=page_size, cursor=cursor)


def versions(organization: str, artifact: str, *, page_size: int = 100) -> Iterator[Version]:
    """:meth:`Client.versions` on the default client."""
    return _client().versions(organization, artifact, page_size=page_size)


def latest(organization: str, artifact: str) -> Version | None:
    """:meth:`Client.latest` on the default client."""
    return _client().latest(organization, artifact)


def resolve(organization: str, artifact: str, ref: str) -> Version:
    """:meth:`Client.resolve` on the default client."""
    return _client().resolve(organization, artifact, ref)


def artifacts(organization: str, *, page_size: int = 100) -> Iterator[ArtifactInfo]:
    """:meth:`Client.artifacts` on the default client."""
    return _client().artifacts(organization, page_size=page_size)


def tag(
    organization: str,
    artifact: str,
    name: str,
    version: str = LATEST,
    *,
    expected: str | _Any | None = ANY,
) -> Tag:
    """:meth:`Client.tag` on the default client."""
    return _client().tag(organization, artifact, name, version, expected=expected)


def delete_tag(organization: str, artifact: str, name: str, *, expected: str | None = None) -> str:
    """:meth:`Client.delete_tag` on the default client."""
    return _client().delete_tag(organization, artifact, name, expected=expected)


def tags(organization: str, artifact: str) -> list[Tag]:
    """:meth:`Client.tags` on the default client."""
    return _client().tags(organization, artifact)
