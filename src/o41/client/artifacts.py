"""Write and read artifact versions: the service places them, the bytes go straight to
the bucket through pre-signed requests, and a broken bucket costs money, not the run.

The client itself: :class:`Artifacts` (the placement service as a pod sees it), what its
calls return (:class:`Written`, :class:`Read`) and, from ``o41.client.errors``, what they
raise. The rest of the client is beside it, each module a capability: ``transfers``
(bytes to and from pre-signed URLs, the part pool, checksums), ``reads`` (downloads and
the range readers), ``retries`` (what a write does again, and where), ``place`` (where
this pod runs) and ``directories`` (a directory as one version).

Standard library only (``http.client``): pods import this, and the upload path must not
depend on a cloud SDK. Large files stream with bounded memory; multipart parts upload in
parallel, large downloads come as parallel ranges of whole parts, each part checked
against the CRC32 its writer recorded.
"""

from __future__ import annotations

import functools
import io
import logging
import os
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from o41.client.cache import Bypass, Cache, Got, copy
from o41.client.connection import Connection, connection_of
from o41.client.errors import (
    ArtifactError,
    BadRequest,
    Conflict,
    Damaged,
    Forbidden,
    NotFound,
    ServiceError,
    TransportError,
    Unauthorized,
    Unavailable,
    UploadFailed,
)
from o41.client.progress import Callback, Progress
from o41.client.reads import (
    NoRanges,
    RangeReader,
    Relocate,
    download,
    into_memory,
    range_size,
    read_range,
)
from o41.client.retries import begin_elsewhere, kept_parts, other_file
from o41.client.transfers import (
    PartURLs,
    Source,
    part_checksums,
    recorded_parts,
    upload,
    upload_parts,
)
from o41.core.parts import PART_SIZE, part_size_for
from o41.core.places import Place

__all__ = [
    "ArtifactError",
    "Artifacts",
    "BadRequest",
    "Conflict",
    "Connection",
    "Damaged",
    "Forbidden",
    "NotFound",
    "Read",
    "ServiceError",
    "TransportError",
    "Unauthorized",
    "Unavailable",
    "UploadFailed",
    "Written",
]

log = logging.getLogger("o41")


@dataclass(frozen=True)
class Written:
    version: str
    location: str
    rule: str
    warning: str | None
    size: int
    tag: str | None = None


@dataclass(frozen=True)
class Read:
    version: str  # the version read (what ``latest`` or the tag named)
    location: str
    locality: str
    size: int
    tag: str | None = None  # the tag it was read by, if any


def _q(name: str) -> str:
    return urllib.parse.quote(name, safe="")


def _not_a_directory(found: Mapping[str, Any], artifact: str) -> None:
    if found.get("download") is None and found.get("files") is not None:
        raise ArtifactError(
            f"version {found['version']} of {artifact!r} is a directory of "
            f"{found['files']} files: open one with path=..., or read it to a directory"
        )


def resumable(e: BaseException, version: str, artifact: str) -> None:
    """Say how to resume the write in parts ``version`` that ``e`` ended (its parts stay in
    the bucket): a warning, which default logging shows, and on the exception itself
    (``resume`` and its message; a note on one that is not the SDK's)."""
    hint = (
        f"the parts of version {version} of {artifact} sent so far stay in the bucket: write "
        f"the same file again with resume={version!r} (o41 write --resume {version}) to send "
        "only the missing parts"
    )
    log.warning("write of %s in parts stopped (%s); %s", artifact, e or type(e).__name__, hint)
    if isinstance(e, ArtifactError):
        if e.resume is None:
            e.resume = version
            e.args = (f"{e}; {hint}", *e.args[1:])
    else:
        e.add_note(hint)


#: What a client's ``cache`` argument takes: a cache, its folder, False (none), True or
#: None (``O41_ARTIFACTS_CACHE``'s, by default ``~/.cache/o41/artifacts``).
CacheSetting = Cache | str | os.PathLike[str] | bool | None


class Artifacts:
    """The placement service as a pod sees it, through one
    :class:`~o41.client.connection.Connection` (``connection``, or one made of the
    settings given: see there for each, and the environment it reads), and this node's
    cache of the versions it read (``cache``: :data:`CacheSetting`; ``o41.client.cache``)."""

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
        self.cache: Cache | None = Cache.of(cache)
        self.connection = connection_of(
            connection,
            endpoint=endpoint,
            token=token,
            token_file=token_file,
            place=place,
            timeout=timeout,
            ca_file=ca_file,
            retry_deadline=retry_deadline,
        )
        self.connection.url  # noqa: B018 - no endpoint: said now, not at the first call

    @property
    def endpoint(self) -> str:
        return self.connection.url

    @property
    def timeout(self) -> float:
        return self.connection.timeout

    @property
    def ca_file(self) -> str | None:
        return self.connection.ca_file

    @property
    def place(self) -> Place:
        return self.connection.place

    def call(
        self,
        method: str,
        path: str,
        body: Mapping[str, Any] | None = None,
        *,
        idempotent: bool | None = None,
    ) -> Any:
        """One JSON call to the service (:meth:`Connection.request`: retried within the
        connection's deadline; ``idempotent``, default a GET, says whether sending it
        twice does what sending it once does)."""
        return self.connection.request(method, path, body, idempotent=idempotent)

    # ----------------------------------------------------------------------------- write

    def write(
        self,
        organization: str,
        artifact: str,
        path: str | Path,
        *,
        metadata: Mapping[str, Any] | None = None,
        tag: str | None = None,
        resume: str | None = None,
        callback: Callback | None = None,
    ) -> Written:
        """Begin, upload straight to the bucket, commit. When the bucket fails, begin
        again with that location excluded. ``metadata`` (small JSON key/values) is kept
        with the version; ``tag`` is moved to it at commit. ``resume``: the version of a
        multipart write of this same file that did not finish (its pod died): only the
        parts its bucket does not hold yet are sent, then it commits."""
        source = Source(path=Path(path))
        if resume is not None:
            return self._resume(organization, artifact, source, resume, metadata, tag, callback)
        return self._write(organization, artifact, source, metadata, tag, callback)

    def write_bytes(
        self,
        organization: str,
        artifact: str,
        data: bytes | bytearray | memoryview,
        *,
        metadata: Mapping[str, Any] | None = None,
        tag: str | None = None,
        resume: str | None = None,
        callback: Callback | None = None,
    ) -> Written:
        """:meth:`write` of bytes in memory (no copy to a file)."""
        source = Source(data=memoryview(data).cast("B"))
        if resume is not None:
            return self._resume(organization, artifact, source, resume, metadata, tag, callback)
        return self._write(organization, artifact, source, metadata, tag, callback)

    def _write(
        self,
        organization: str,
        artifact: str,
        source: Source,
        metadata: Mapping[str, Any] | None,
        tag: str | None,
        callback: Callback | None = None,
    ) -> Written:
        size = source.size
        request: dict[str, Any] = {
            "organization": organization,
            "artifact": artifact,
            "place": self.place.as_json(),
            "size": size,
        }
        if metadata is not None:
            request["metadata"] = dict(metadata)
        if tag is not None:
            request["tag"] = tag
        if size > PART_SIZE:
            request["partSize"] = part_size = part_size_for(size)
            request["crc32"] = part_checksums(source, size, part_size)

        def begin(exclude: list[str]) -> Mapping[str, Any]:
            # idempotent: a begin sent twice leaves a second pending write that nobody
            # commits; its lease expires and the sweeper aborts its upload
            began: Mapping[str, Any] = self.call(
                "POST", "/v1/writes", {**request, "exclude": exclude}, idempotent=True
            )
            return began

        in_parts: list[str] = []  # the write in parts under way, whose parts would stay

        def send(began: Mapping[str, Any]) -> tuple[list[str], str | None]:
            in_parts.clear()
            if "multipart" in began["upload"]:
                in_parts.append(began["version"])
                log.info(
                    "writing version %s of %s in parts; should this stop, write again with "
                    "resume=%r (o41 write --resume %s) to send only the missing parts",
                    began["version"],
                    artifact,
                    began["version"],
                    began["version"],
                )
            sign = self._signer(began["version"])
            return upload(source, size, began, began["location"], sign, self.timeout, callback)

        try:
            began, (etags, md5) = begin_elsewhere(begin, send)
            commit: dict[str, Any] = {"etags": etags}
            if md5:
                commit["md5"] = md5
            # a repeat of a commit that landed answers the version (the service keeps it)
            done = self.call(
                "POST", f"/v1/writes/{began['version']}/commit", commit, idempotent=True
            )
        except BaseException as e:
            if in_parts:
                resumable(e, in_parts[0], artifact)
            raise
        return Written(
            began["version"],
            began["location"],
            began["rule"],
            began.get("warning"),
            size,
            done.get("tag"),
        )

    def _resume(
        self,
        organization: str,
        artifact: str,
        source: Source,
        version: str,
        metadata: Mapping[str, Any] | None,
        tag: str | None,
        callback: Callback | None = None,
    ) -> Written:
        """Finish the pending multipart write ``version``: ask which parts its bucket
        holds, keep those that match the file, send the others, commit."""
        size = source.size
        found = self.call("GET", f"/v1/writes/{_q(version)}")
        if (found["organization"], found["artifact"]) != (organization, artifact):
            raise ArtifactError(
                f"write {version} is of {found['organization']}/{found['artifact']}, not "
                f"{organization}/{artifact}: resume it with those names"
            )
        if found["size"] != size:
            raise ArtifactError(
                f"write {version} began with {found['size']} bytes, but the file has {size}: "
                "resume with the same file, or write it again without resume"
            )
        if not found["multipart"] or not found["partSize"]:
            raise ArtifactError(
                f"write {version} is one PUT, not parts: write it again without resume"
            )
        part_size: int = found["partSize"]
        parts: int = found["parts"]
        recorded = found.get("crc32")
        mine = None
        if isinstance(recorded, list) and recorded:  # the write recorded its file's parts
            mine = part_checksums(source, size, part_size)
            if why := other_file(version, size, part_size, mine, recorded):
                raise ArtifactError(why)
        kept = kept_parts(source, size, part_size, found["present"], mine)
        missing = [n for n in range(1, parts + 1) if n not in kept]
        log.info("resuming write %s: %d of %d parts are in the bucket", version, len(kept), parts)
        urls = PartURLs(self._signer(version), missing)
        location = found["location"]
        commit: dict[str, Any] = {}
        if metadata is not None:
            commit["metadata"] = dict(metadata)
        if tag is not None:
            commit["tag"] = tag
        try:
            commit["etags"] = upload_parts(
                source, size, part_size, parts, urls, location, kept, self.timeout, callback
            )
            done = self.call("POST", f"/v1/writes/{_q(version)}/commit", commit, idempotent=True)
        except BaseException as e:
            resumable(e, version, artifact)
            raise
        return Written(version, done["location"], found["rule"], None, size, done.get("tag"))

    def _signer(self, version: str) -> Callable[[list[int]], Mapping[str, Any]]:
        """What signs the parts of the write ``version`` again (:class:`PartURLs`)."""

        def sign(parts: list[int]) -> Mapping[str, Any]:
            answer: Mapping[str, Any] = self.call(
                "POST", f"/v1/writes/{_q(version)}/parts", {"parts": parts}, idempotent=True
            )
            return answer

        return sign

    # ------------------------------------------------------------------------------ read

    def locate(
        self, organization: str, artifact: str, version: str, *, again: bool = False
    ) -> dict[str, Any]:
        """Where ``version`` (an id, ``latest`` or a tag) lives, and a signed download;
        the answer's ``version`` is the one the service resolved. ``again``: the download
        of a read begun, signed again (the service counted the read once already)."""
        place = self.place
        given = {k: v for k, v in place.as_json().items() if v is not None}
        query = urllib.parse.urlencode({**given, **({"again": "true"} if again else {})})
        found: dict[str, Any] = self.call(
            "GET",
            f"/v1/organizations/{_q(organization)}/artifacts/{_q(artifact)}/versions/"
            f"{_q(version)}?{query}",
        )
        return found

    def relocator(self, organization: str, artifact: str, version: str) -> Relocate:
        """What asks for a fresh download of the version id ``version`` (its URL expired,
        or the rest of a read that stopped): not counted as another read."""
        return lambda: self.locate(organization, artifact, version, again=True)

    def cached(
        self,
        organization: str,
        artifact: str,
        version: str,
        locate: Relocate,
        *,
        relocate: Relocate | None = None,
        path: str = "",
        expect: Mapping[str, Any] | None = None,
        progress: Callable[[int], None] | None = None,
    ) -> Got | None:
        """The version id ``version`` (``path``: one file of a directory version) from
        this node's cache, fetched into it first if it is not there (``locate`` signs the
        download: only then is the read counted; ``relocate`` signs it again, default
        ``locate``); None without a cache, with one this
        process cannot write, or for a version larger than it holds.
        :class:`~o41.client.cache.Bypass` carries the read answer of one found too large
        only once located. ``expect``: what the service says of it
        (size, MD5), checked against the entry."""
        cache = self.cache
        if cache is None or (expect is not None and not cache.fits(expect["size"])):
            return None
        if not cache.usable():
            return None  # said once in the log; the caller reads from the bucket

        def fetch(data: Path) -> Mapping[str, Any]:
            found = locate()
            if not cache.fits(found["size"]):
                raise Bypass(found)
            download(found, data, self.timeout, relocate=relocate or locate, progress=progress)
            return found

        got = cache.entry(organization, artifact, version, path).get(expect, fetch)
        if got.hit and progress is not None:
            progress(got.size)
        return got

    def read(
        self,
        organization: str,
        artifact: str,
        version: str,
        output: str | Path,
        *,
        named: Mapping[str, Any] | None = None,
        callback: Callback | None = None,
    ) -> Read:
        """Download a version (an id, ``latest`` or a tag) to ``output`` (written whole or
        not at all; a download that stops goes on from the bytes it has, and one that
        fails keeps them for the next read: :func:`~o41.client.reads.download`). With a
        cache, the version comes from it (fetched into it first when it is not there):
        ``named`` is the service's answer of which version ``version`` is, when the
        caller has it. ``callback``: told the size and the bytes as they come."""
        output = Path(output)
        found: Mapping[str, Any] | None = None
        if self.cache is not None:
            named = named or self.resolve(organization, artifact, version)
            got, found = self._through_cache(organization, artifact, named, callback)
            if got is not None:
                with got.file:
                    copy(got.file, got.size, output)
                return self._read_of(named, got)
        found = found or self.locate(organization, artifact, version)
        locate = self.relocator(organization, artifact, found["version"])
        with Progress(found["size"], f"download from {found['location']}", callback) as p:
            size = download(found, output, self.timeout, relocate=locate, progress=p)
        tag = found.get("tag") if named is None else named.get("tag")
        return Read(found["version"], found["location"], found["locality"], size, tag)

    def _through_cache(
        self,
        organization: str,
        artifact: str,
        named: Mapping[str, Any],
        callback: Callback | None,
    ) -> tuple[Got | None, Mapping[str, Any] | None]:
        """The version the service ``named``, through the cache (fetched into it first when
        it is not there): ``(entry, None)``; ``(None, where to read it)`` when it is too
        large to keep, so the caller reads it from the bucket."""
        pinned = named["version"]
        first = functools.partial(self.locate, organization, artifact, pinned)
        again = self.relocator(organization, artifact, pinned)
        with Progress(named["size"], f"download from {named['location']}", callback) as p:
            try:
                got = self.cached(
                    organization, artifact, pinned, first, relocate=again, expect=named, progress=p
                )
            except Bypass as too_large:
                return None, too_large.found
        return got, None

    @staticmethod
    def _read_of(named: Mapping[str, Any], got: Got) -> Read:
        """The read of a version that came through the cache: ``cached`` when it was there
        (nothing fetched), else the locality of the download that filled it."""
        locality = "cached" if got.hit or got.found is None else got.found["locality"]
        return Read(named["version"], named["location"], locality, got.size, named.get("tag"))

    def read_bytes(
        self,
        organization: str,
        artifact: str,
        version: str,
        *,
        callback: Callback | None = None,
    ) -> tuple[bytes, Read]:
        """A version's bytes in memory, checked against its size, and its recorded parts'
        CRC32s or its MD5; a large version comes as parallel ranges straight into place.
        With a cache: through it, as :meth:`read`."""
        found: Mapping[str, Any] | None = None
        if self.cache is not None:
            named = self.resolve(organization, artifact, version)
            got, found = self._through_cache(organization, artifact, named, callback)
            if got is not None:
                with got.file:
                    return got.file.read(), self._read_of(named, got)
            if found is None:
                found = self.locate(organization, artifact, named["version"])
        else:
            found = self.locate(organization, artifact, version)
        locate = self.relocator(organization, artifact, found["version"])
        data: bytes | bytearray | None = None
        with Progress(found["size"], f"download from {found['location']}", callback) as p:
            if found["size"] > range_size(found) and (
                recorded_parts(found) is not None or not found.get("md5")
            ):
                data = bytearray(found["size"])
                try:
                    into_memory(
                        found,
                        memoryview(data),
                        0,
                        self.timeout,
                        parallel=True,
                        relocate=locate,
                        progress=p,
                    )
                except NoRanges:
                    data = None
            if data is None:
                with RangeReader(found, self.timeout, relocate=locate) as raw:
                    data = raw.readall()
                p(len(data))
        return bytes(data) if isinstance(data, bytearray) else data, Read(
            found["version"], found["location"], found["locality"], len(data), found.get("tag")
        )

    def open(
        self, organization: str, artifact: str, version: str
    ) -> tuple[io.RawIOBase, dict[str, Any]]:
        """A version as a raw seekable stream, and what the service said of it
        (``version``, ``tag``, ``location``, ``locality``, ``size``, ``metadata``). With a
        cache, the version is fetched into it whole first when it is not there, and read
        from there; without, it streams from the bucket as it is read (ranged GETs)."""
        found: Mapping[str, Any] | None = None
        if self.cache is not None:
            named = self.resolve(organization, artifact, version)
            _not_a_directory(named, artifact)
            got, found = self._through_cache(organization, artifact, named, None)
            if got is not None:
                raw: io.RawIOBase = got.file.detach()
                return raw, {**named, "locality": self._read_of(named, got).locality}
            found = found or self.locate(organization, artifact, named["version"])
        else:
            found = self.locate(organization, artifact, version)
        _not_a_directory(found, artifact)
        locate = self.relocator(organization, artifact, found["version"])
        return RangeReader(found, self.timeout, relocate=locate), dict(found)

    def read_range(
        self, organization: str, artifact: str, version: str, start: int, length: int
    ) -> tuple[bytes, Read]:
        """``length`` bytes of a version from offset ``start`` (:func:`read_range`), from
        the bucket always (the cache holds whole versions: :meth:`open` for many pieces)."""
        found = self.locate(organization, artifact, version)
        locate = self.relocator(organization, artifact, found["version"])
        data = read_range(found, start, length, self.timeout, relocate=locate)
        return data, Read(
            found["version"], found["location"], found["locality"], len(data), found.get("tag")
        )

    # ------------------------------------------------------------------ versions and tags

    def versions_page(
        self, organization: str, artifact: str, cursor: str | None = None, limit: int = 100
    ) -> dict[str, Any]:
        """One page of an artifact's versions, newest first (``next``: the next page's
        cursor, or None after the last)."""
        query = urllib.parse.urlencode({"limit": limit, **({"cursor": cursor} if cursor else {})})
        page: dict[str, Any] = self.call(
            "GET", f"/v1/organizations/{_q(organization)}/artifacts/{_q(artifact)}/versions?{query}"
        )
        return page

    def artifacts_page(
        self, organization: str, cursor: str | None = None, limit: int = 100
    ) -> dict[str, Any]:
        query = urllib.parse.urlencode({"limit": limit, **({"cursor": cursor} if cursor else {})})
        page: dict[str, Any] = self.call(
            "GET", f"/v1/organizations/{_q(organization)}/artifacts?{query}"
        )
        return page

    def resolve(self, organization: str, artifact: str, ref: str) -> dict[str, Any]:
        """The version ``ref`` (an id, ``latest`` or a tag) names, with its metadata."""
        found: dict[str, Any] = self.call(
            "GET", f"/v1/organizations/{_q(organization)}/artifacts/{_q(artifact)}/tags/{_q(ref)}"
        )
        return found

    def tags(self, organization: str, artifact: str) -> list[dict[str, Any]]:
        found = self.call(
            "GET", f"/v1/organizations/{_q(organization)}/artifacts/{_q(artifact)}/tags"
        )
        tags: list[dict[str, Any]] = found["tags"]
        return tags

    def move_tag(
        self,
        organization: str,
        artifact: str,
        tag: str,
        version: str,
        expected: str | None = None,
        *,
        check: bool = False,
    ) -> dict[str, Any]:
        """Point ``tag`` at ``version``. With ``check``, only if it points at ``expected``
        now (None: only if it does not exist); a writer that lost gets :class:`Conflict`."""
        body: dict[str, Any] = {"version": version}
        if check:
            body["expected"] = expected
        moved: dict[str, Any] = self.call(
            "PUT",
            f"/v1/organizations/{_q(organization)}/artifacts/{_q(artifact)}/tags/{_q(tag)}",
            body,
            idempotent=True,  # a compare-and-set repeated after it moved answers success
        )
        return moved

    def delete_tag(
        self, organization: str, artifact: str, tag: str, expected: str | None = None
    ) -> dict[str, Any]:
        query = f"?expected={_q(expected)}" if expected else ""
        deleted: dict[str, Any] = self.call(
            "DELETE",
            f"/v1/organizations/{_q(organization)}/artifacts/{_q(artifact)}/tags/{_q(tag)}{query}",
        )
        return deleted
