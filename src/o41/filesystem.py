"""Artifact versions as an fsspec filesystem: ``o41://ORG/ARTIFACT@VERSION/PATH``.

Anything that reads through fsspec (pandas, pyarrow, Hugging Face ``datasets``, a file
object handed to ``torch.load``) reads a version where it lives, without a copy: each read
is a ranged GET on the download URL the service signs (the same answers ``o41 read``
uses), so pyarrow reads a Parquet file's footer and then only the columns it wants.

- ``VERSION`` is a version id, ``latest`` or a tag; left out (``o41://ORG/ARTIFACT``) it
  is ``latest``. It is resolved on the service at each ``info``/``open``/``ls``; a
  directory's manifest is kept per version id (a version never changes).
- ``PATH`` names a file (or a folder) of a directory version; a file version is the path
  ``ORG/ARTIFACT@VERSION`` itself.
- ``o41://ORG`` lists the organization's artifacts.
- Writing: ``open("o41://ORG/ARTIFACT", "wb")`` (or ``ORG/ARTIFACT@TAG``: the tag moves to
  it) spools what is written to a temporary file and writes it as a new single-file
  version when the file is closed (``.written`` is the result then). A file closed while
  an exception propagates (out of a ``with``, fsspec's own ``OpenFile`` too, or through a
  ``finally``), discarded (``discard()``), dropped unclosed, or opened in a transaction
  that fails (``with fs.transaction:``) writes nothing: a crashed job publishes nothing
  and moves no tag.

Registered for fsspec by the entry point ``fsspec.specs: o41`` (pyproject.toml), so
``fsspec.open("o41://...")`` and ``pandas.read_parquet("o41://...")`` find it. The
connection comes from the environment as for the SDK (``$O41_ARTIFACTS_ENDPOINT``, the
pod's token, the place detected once), or from ``endpoint=``, ``token_file=`` and
``place=`` (storage options).

Through this node's cache of versions (``o41.client.cache``; ``cache=`` as the SDK's
client takes it, by default ``$O41_ARTIFACTS_CACHE``'s): a file whose version is there is
read from it (no request to the bucket); ``cat_file`` of a whole file and ``get_file``
fetch the file into it; ``open`` of a file not there reads ranges from the bucket as
before, without filling the cache (a Parquet reader wants a few columns, not the file).
"""

from __future__ import annotations

import functools
import http.client
import io
import os
import re
import sys
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from fsspec import AbstractFileSystem
from fsspec.caching import ReadAheadCache
from fsspec.callbacks import NoOpCallback
from fsspec.spec import AbstractBufferedFile

from o41.client.artifacts import Artifacts, CacheSetting, Written
from o41.client.cache import Bypass, Got, copy
from o41.client.directories import listing, locate_file
from o41.client.errors import ArtifactError, NotFound, O41Error
from o41.client.progress import Callback, Progress
from o41.client.reads import ATTEMPTS, Relocate, backoff, download
from o41.client.transfers import Pool
from o41.core.directories import FileEntry, children, entries_of, find, is_folder
from o41.core.places import Place
from o41.core.versions import LATEST, is_version

__all__ = ["O41File", "O41FileSystem", "O41Writer", "parse"]

_ARTIFACT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")
#: A download URL lasts 15 minutes; one older than this is signed again before a read.
RESIGN_AFTER = 600.0
MANIFESTS_KEPT = 32
#: The least a GET fetches: a file object read in small pieces (torch.load, a tar) costs
#: one GET a MiB; a read of more (a Parquet column chunk) is fetched as asked, no more.
BLOCK_SIZE = 1024 * 1024


def parse(path: str) -> tuple[str, str | None, str, str]:
    """``ORG[/ARTIFACT[@VERSION][/PATH]]`` (the protocol already stripped) as
    (organization, artifact or None, version reference, path inside or "")."""
    parts = path.strip("/").split("/", 2)
    org = parts[0]
    if not org:
        raise ValueError("an o41 path starts with the organization: o41://ORG/ARTIFACT@VERSION")
    if len(parts) == 1:
        return org, None, LATEST, ""
    artifact, _, ref = parts[1].partition("@")
    if _ARTIFACT.fullmatch(artifact) is None:
        raise ValueError(f"{artifact[:80]!r} is not an artifact name (o41://ORG/ARTIFACT@VERSION)")
    inner = parts[2] if len(parts) == 3 else ""
    return org, artifact, ref or LATEST, inner


def _raise_service_errors(error: Exception) -> None:
    """fsspec's walk ``on_error``: a path that is not there is left out, as by default;
    the service's own errors are raised."""
    if isinstance(error, O41Error):
        raise error


class O41FileSystem(AbstractFileSystem):  # type: ignore[misc]
    """``o41://ORG/ARTIFACT@VERSION/PATH``: read-only but for writing new versions."""

    protocol = ("o41",)
    root_marker = ""

    def __init__(
        self,
        endpoint: str | None = None,
        token_file: str | None = None,
        place: Place | Mapping[str, Any] | None = None,
        timeout: float = 60.0,
        ca_file: str | None = None,
        cache: CacheSetting = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if isinstance(place, Mapping):
            place = Place(place.get("cloud"), place.get("region"), place.get("source", "none"))
        self.api = Artifacts(
            endpoint, token_file, place=place, timeout=timeout, ca_file=ca_file, cache=cache
        )
        self._manifests: OrderedDict[tuple[str, str, str], list[FileEntry]] = OrderedDict()
        self._lock = threading.Lock()

    # --- what a path names -------------------------------------------------------------

    def _version(self, org: str, artifact: str, ref: str) -> dict[str, Any]:
        try:
            found: dict[str, Any] = self.api.resolve(org, artifact, ref)
        except NotFound as e:
            raise FileNotFoundError(str(e)) from None
        return found

    def _manifest(self, org: str, artifact: str, version: str) -> list[FileEntry]:
        key = (org, artifact, version)
        with self._lock:
            if key in self._manifests:
                self._manifests.move_to_end(key)
                return self._manifests[key]
        entries = entries_of(listing(self.api, org, artifact, version)["files"])
        with self._lock:
            self._manifests[key] = entries
            while len(self._manifests) > MANIFESTS_KEPT:
                self._manifests.popitem(last=False)
        return entries

    def _name(self, org: str, artifact: str, ref: str, inner: str = "") -> str:
        name = f"{org}/{artifact}@{ref}"
        return f"{name}/{inner}" if inner else name

    def _file_info(
        self, name: str, found: Mapping[str, Any], size: int, md5: str | None
    ) -> dict[str, Any]:
        return {
            "name": name,
            "size": size,
            "type": "file",
            "version": found["version"],
            "md5": md5,
            "committed": found["committed"],
        }

    def info(self, path: str, **kwargs: Any) -> dict[str, Any]:
        org, artifact, ref, inner = parse(self._strip_protocol(path))
        if artifact is None:
            return {"name": org, "size": 0, "type": "directory"}
        found = self._version(org, artifact, ref)
        name = self._name(org, artifact, ref, inner)
        if found.get("files") is None:  # a file version: the path is the file
            if inner:
                raise FileNotFoundError(f"{path}: version {found['version']} is one file")
            return self._file_info(name, found, found["size"], found.get("md5"))
        entries = self._manifest(org, artifact, found["version"])
        entry = find(entries, inner) if inner else None
        if entry is not None:
            return self._file_info(name, found, entry.size, entry.md5)
        if is_folder(entries, inner):
            return {"name": name, "size": 0, "type": "directory", "version": found["version"]}
        raise FileNotFoundError(f"{path}: no such file in version {found['version']}")

    def ls(self, path: str, detail: bool = True, **kwargs: Any) -> list[Any]:
        org, artifact, ref, inner = parse(self._strip_protocol(path))
        if artifact is None:
            names: list[dict[str, Any]] = []
            cursor: str | None = None
            while True:
                page = self.api.artifacts_page(org, cursor, 1000)
                names += [
                    {"name": f"{org}/{a['artifact']}", "size": 0, "type": "directory"}
                    for a in page["artifacts"]
                ]
                cursor = page.get("next")
                if cursor is None:
                    break
            return names if detail else [n["name"] for n in names]
        found = self._version(org, artifact, ref)
        if found.get("files") is None:
            got = [self.info(path)]
        else:
            entries = self._manifest(org, artifact, found["version"])
            if inner and find(entries, inner) is not None:
                got = [self.info(path)]
            elif not is_folder(entries, inner):
                raise FileNotFoundError(f"{path}: no such folder in version {found['version']}")
            else:
                files, folders = children(entries, inner)
                got = [
                    {
                        "name": self._name(org, artifact, ref, f),
                        "size": 0,
                        "type": "directory",
                        "version": found["version"],
                    }
                    for f in folders
                ] + [
                    self._file_info(self._name(org, artifact, ref, e.path), found, e.size, e.md5)
                    for e in files
                ]
        return got if detail else [g["name"] for g in got]

    # fsspec takes an OSError in isdir and walk (so find and glob) for "no such path". Some
    # of the client's errors are OSErrors too (Unavailable, TransportError, NotAllowed): a
    # service that is down, or a token it refuses, is raised, never a path that is not there.

    def isdir(self, path: str) -> bool:
        try:
            return bool(self.info(path)["type"] == "directory")
        except O41Error:
            raise
        except OSError:
            return False

    def walk(
        self,
        path: str,
        maxdepth: int | None = None,
        topdown: bool = True,
        on_error: Any = "omit",
        **kwargs: Any,
    ) -> Any:
        if on_error == "omit":
            on_error = _raise_service_errors
        return super().walk(path, maxdepth, topdown, on_error, **kwargs)

    def ukey(self, path: str) -> str:
        info = self.info(path)
        return f"{info.get('version')}:{info['name']}:{info.get('md5')}"

    # --- reading and writing -----------------------------------------------------------

    def locate(self, path: str) -> dict[str, Any]:
        """The read answer of a file path: its size, MD5 and a signed download."""
        org, artifact, ref, inner = parse(self._strip_protocol(path))
        if artifact is None:
            raise IsADirectoryError(f"{path} is an organization")
        try:
            if inner:
                return locate_file(self.api, org, artifact, ref, inner)
            found = self.api.locate(org, artifact, ref)
        except NotFound as e:
            raise FileNotFoundError(str(e)) from None
        if found.get("download") is None:
            raise IsADirectoryError(
                f"{path} is a directory version of {found.get('files')} files: open one of them"
            )
        return found

    def _open(
        self,
        path: str,
        mode: str = "rb",
        block_size: int | None = None,
        autocommit: bool = True,
        cache_options: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> Any:
        if "r" in mode:
            local: Any = None
            here = self._from_cache(path, fill=False)
            if here is not None:
                got, found = here
                local = got.file
            else:
                found = self.locate(path)
            pinned = self._name(*self._pinned(path, found["version"]))
            return O41File(
                self,
                pinned,
                found,
                local=local,
                mode=mode,
                block_size=block_size or BLOCK_SIZE,
                cache_options=cache_options,
                **kwargs,
            )
        if mode not in ("wb", "xb"):
            raise ValueError(f"o41 opens files to read ('rb') or to write ('wb'), not {mode!r}")
        stripped = self._strip_protocol(path)
        org, artifact, ref, inner = parse(stripped)
        named = artifact is not None and "@" in stripped.strip("/").split("/", 2)[1]
        if artifact is None or inner or is_version(ref) or (ref == LATEST and named):
            raise ValueError(
                f"{path}: write to o41://ORG/ARTIFACT (a new version, then the latest) or "
                "o41://ORG/ARTIFACT@TAG (a new version the tag moves to); a version id, "
                "'latest' or a path inside name versions written already, and a version is "
                "never written twice"
            )
        tag = None if ref == LATEST else ref
        return O41Writer(self.api, org, artifact, tag, autocommit=autocommit)

    def _pinned(self, path: str, version: str) -> tuple[str, str, str, str]:
        """The path with its reference replaced by the version it named."""
        org, artifact, _, inner = parse(self._strip_protocol(path))
        assert artifact is not None
        return org, artifact, version, inner

    def _from_cache(
        self, path: str, *, fill: bool, progress: Callable[[int], None] | None = None
    ) -> tuple[Got, dict[str, Any]] | None:
        """The file ``path`` names from the node's cache, and what the service says of it;
        None without a cache, when it is not there (``fill``: fetched into it first) or
        is larger than the cache holds (:class:`Bypass`, with the read answer to use)."""
        cache = self.api.cache
        if cache is None:
            return None
        org, artifact, ref, inner = parse(self._strip_protocol(path))
        if artifact is None:
            raise IsADirectoryError(f"{path} is an organization")
        named = self._version(org, artifact, ref)
        version = named["version"]
        if inner:
            entry = find(self._manifest(org, artifact, version), inner)
            if entry is None:
                return None  # a folder, or nothing: locate says which
            expect = {"size": entry.size, "md5": entry.md5}
            pinned = version

            def locate(again: bool = False) -> Mapping[str, Any]:
                found = locate_file(self.api, org, artifact, pinned, inner, again=again)
                return {**found, "path": inner}

        else:
            if named.get("files") is not None:
                return None
            expect = named

            def locate(again: bool = False) -> Mapping[str, Any]:
                return self.api.locate(org, artifact, version, again=again)

        about = {**named, "size": expect["size"], "md5": expect["md5"], "path": inner or None}
        if not fill:
            held = cache.entry(org, artifact, version, inner).peek(expect)
            if held is None:
                return None
            return Got(held, int(about["size"]), True), {**about, "locality": "cached"}
        got = self.api.cached(
            org,
            artifact,
            version,
            locate,
            relocate=functools.partial(locate, again=True),
            path=inner,
            expect=expect,
            progress=progress,
        )
        if got is None:
            return None
        locality = "cached" if got.hit or got.found is None else got.found["locality"]
        return got, {**about, "locality": locality}

    def _relocator(self, path: str, found: Mapping[str, Any]) -> Relocate:
        org, artifact, _, inner = parse(self._strip_protocol(path))
        assert artifact is not None
        if inner:
            return lambda: {
                **locate_file(self.api, org, artifact, found["version"], inner, again=True),
                "path": inner,
            }
        return self.api.relocator(org, artifact, found["version"])

    def cat_file(
        self, path: str, start: int | None = None, end: int | None = None, **kwargs: Any
    ) -> bytes:
        if start is None and end is None and self.api.cache is not None:
            try:
                here = self._from_cache(path, fill=True)
            except Bypass:
                here = None
            if here is not None:
                with here[0].file as f:
                    whole: bytes = f.read()
                    return whole
        with self.open(path, "rb") as f:
            size = f.size
            begin = 0 if start is None else (start if start >= 0 else max(0, size + start))
            stop = size if end is None else (end if end >= 0 else max(0, size + end))
            f.seek(begin)
            data: bytes = f.read(max(0, stop - begin))
            return data

    def get_file(
        self, rpath: str, lpath: str, callback: Any = None, outfile: Any = None, **kwargs: Any
    ) -> None:
        """The file ``rpath`` to the local ``lpath``: through the node's cache, else a
        download that goes on from its bytes (``lpath.o41-partial``) after a failure, as
        the SDK's ``read``. ``callback`` (fsspec's): told the size and the bytes."""
        if self.isdir(rpath):
            os.makedirs(lpath, exist_ok=True)
            return
        given: Callback | None = None if isinstance(callback, NoOpCallback | None) else callback
        if outfile is not None:  # fsspec's own copy into an open file
            super().get_file(rpath, lpath, callback=callback or NoOpCallback(), outfile=outfile)
            return
        found: Mapping[str, Any] | None = None
        with Progress(0, "download", given, show=False) as p:
            try:
                here = self._from_cache(rpath, fill=True, progress=p)
            except Bypass as too_large:
                here, found = None, too_large.found
        if here is not None:
            with here[0].file as f:
                copy(f, here[0].size, Path(lpath))
            return
        found = found or self.locate(rpath)
        with Progress(found["size"], f"download from {found['location']}", given) as p:
            download(
                found,
                lpath,
                self.api.timeout,
                relocate=self._relocator(rpath, found),
                progress=p,
            )

    def rm(self, path: str, recursive: bool = False, maxdepth: int | None = None) -> None:
        raise PermissionError("versions are never deleted through the filesystem")

    def mkdir(self, path: str, create_parents: bool = True, **kwargs: Any) -> None:
        pass  # folders exist by the files in them; a write makes its own version

    def makedirs(self, path: str, exist_ok: bool = False) -> None:
        pass


class AtLeastABlock(ReadAheadCache):  # type: ignore[misc]
    """fsspec's read-ahead cache, but a read fetches *at least* a block, not a block past
    what it asked: small reads are served a block at a time, large ones cost no more
    than their bytes (the read-ahead cache would fetch a block past each column chunk a
    Parquet reader asks for, twice the bytes for chunks of about a block)."""

    name = "o41-at-least-a-block"
    cache: bytes
    start: int
    end: int

    def _fetch(self, start: int | None, end: int | None) -> bytes:
        start = start or 0
        end = self.size if end is None or end > self.size else end
        if start >= self.size or start >= end:
            return b""
        if self.start <= start and end <= self.end:
            self.hit_count += 1
            data: bytes = self.cache[start - self.start : end - self.start]
            return data
        self.miss_count += 1
        upto = min(self.size, max(end, start + self.blocksize))
        self.total_requested_bytes += upto - start
        self.cache = self.fetcher(start, upto)
        self.start, self.end = start, start + len(self.cache)
        return bytes(self.cache[: end - start])


class _Refused(Exception):
    """The bucket refused the download URL (400, 401, 403): sign it again."""


class _Short(Exception):
    """A read that stopped before its last byte; ``data``: what it got."""

    def __init__(self, data: bytes) -> None:
        super().__init__("short")
        self.data = data


class O41File(AbstractBufferedFile):  # type: ignore[misc]
    """One file of a version, read by ranged GETs on its signed download (signed again
    when it is older than :data:`RESIGN_AFTER`)."""

    def __init__(
        self,
        fs: O41FileSystem,
        path: str,
        found: Mapping[str, Any],
        local: io.BufferedReader | None = None,
        **kwargs: Any,
    ):
        self.found = dict(found)
        self._signed_at = time.monotonic()
        self._pool = Pool(fs.api.timeout)
        self._local = local  # the node's cached copy: read from it, not the bucket
        self.version: str = found["version"]
        super().__init__(fs, path, size=found["size"], **kwargs)
        if kwargs.get("cache_type") is None:  # the caller's choice, if any, stays
            self.cache = AtLeastABlock(self.blocksize, self._fetch_range, self.size)

    def _download(self) -> Mapping[str, Any]:
        if time.monotonic() - self._signed_at > RESIGN_AFTER:
            self.found = self.fs.locate(self.path)
            self._signed_at = time.monotonic()
        download: Mapping[str, Any] = self.found["download"]
        return download

    def _fetch_range(self, start: int, end: int) -> bytes:
        end = min(end, self.size)
        if start >= end:
            return b""
        if self._local is not None:
            got = os.pread(self._local.fileno(), end - start, start)
            if len(got) != end - start:
                raise ArtifactError(f"the cached copy of {self.path} is short: read it again")
            return got
        data = b""
        stalled, refused = 0, False
        while len(data) < end - start:  # what a try got is kept: the next asks for the rest
            try:
                data += self._fetch_once(start + len(data), end)
                stalled = 0
            except _Refused:
                if refused:
                    raise
                refused = True  # the URL expired early, or was revoked: signed again once
                self.found = self.fs.locate(self.path)
                self._signed_at = time.monotonic()
            except _Short as short:
                data += short.data
                stalled = 0 if short.data else stalled + 1
                if stalled >= ATTEMPTS:
                    raise ArtifactError(
                        f"read of {self.path} got {len(data)} bytes of {end - start}: read it again"
                    ) from None
                time.sleep(backoff(stalled or 1))
        return data

    def _fetch_once(self, start: int, end: int) -> bytes:
        req = self._download()
        headers = {**req["headers"], "Range": f"bytes={start}-{end - 1}"}
        try:
            resp = self._pool.request(req["method"], req["url"], headers)
            data = resp.read()
        except http.client.IncompleteRead as e:
            self._pool.forget(req["url"])
            raise _Short(bytes(e.partial)) from None
        except (OSError, http.client.HTTPException):
            self._pool.forget(req["url"])
            raise _Short(b"") from None
        if resp.status == 200:  # a store that ignores ranges: the whole object
            data = data[start:end]
        elif resp.status in (400, 401, 403):
            raise _Refused
        elif resp.status >= 500 or resp.status in (408, 429):
            raise _Short(b"")
        elif resp.status != 206:
            raise ArtifactError(
                f"location {self.found['location']} answered HTTP {resp.status} to a read of "
                f"{self.path}"
            )
        if len(data) > end - start:
            raise ArtifactError(
                f"read of {self.path} got {len(data)} bytes of {end - start}: read it again"
            )
        if len(data) < end - start:
            raise _Short(bytes(data))
        return bytes(data)

    def close(self) -> None:
        try:
            super().close()
        finally:
            self._pool.close()
            if self._local is not None:
                self._local.close()


class O41Writer(io.RawIOBase):
    """What is written, spooled to a temporary file and written as a new version on
    :meth:`close`; ``written`` is that version then.

    A crashed write must publish nothing, however the file was opened. fsspec's
    ``OpenFile.__exit__`` (what ``fsspec.open`` returns) calls ``close()`` without the
    exception, so ``close()`` looks for itself: an exception being handled while it runs
    (one propagating out of a ``with`` or through a ``finally``) that is not the one
    already being handled when the file was opened (a file opened inside an ``except``
    block still commits) means the job failed, and nothing is written. In a transaction
    (``autocommit=False``: ``with fs.transaction:``) the version is written by
    :meth:`commit`, when the transaction ends without an exception."""

    def __init__(
        self,
        api: Artifacts,
        organization: str,
        artifact: str,
        tag: str | None,
        *,
        autocommit: bool = True,
    ):
        super().__init__()
        self._api, self._org, self._artifact, self._tag = api, organization, artifact, tag
        self.autocommit = autocommit
        self._opened_during = sys.exc_info()[1]
        # open until close() writes the version (a context manager cannot span it)
        self._spool = tempfile.NamedTemporaryFile(  # noqa: SIM115
            prefix="o41-", suffix=".spool", delete=False
        )
        self.written: Written | None = None
        self._failed = False
        self._done = False  # the spool is written as a version or discarded

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        return self._spool.write(data)

    def __exit__(self, *exc: Any) -> None:
        if exc[0] is not None:
            self._failed = True
        self.close()

    def _failing(self) -> bool:
        """Whether an exception other than the one in flight at open is in flight now."""
        now = sys.exc_info()[1]
        return now is not None and now is not self._opened_during

    def close(self) -> None:
        """Write the version (with ``autocommit``; else :meth:`commit` does), unless an
        exception is propagating: then nothing is written."""
        if self.closed:
            return
        if self._failing():
            self._failed = True
        try:
            self._spool.close()
        finally:
            super().close()
        if self._failed:
            self._forget()
        elif self.autocommit:
            self._publish()

    def commit(self) -> None:
        """Write what the file holds as the version, once (a transaction's end calls
        this); nothing after :meth:`discard` or a failed close."""
        self.close()
        self._publish()

    def discard(self) -> None:
        """Close without writing a version (a transaction that failed calls this)."""
        self._failed = True
        self.close()
        self._forget()

    def _publish(self) -> None:
        if self._done:
            return
        try:
            self.written = self._api.write(
                self._org, self._artifact, self._spool.name, tag=self._tag
            )
        finally:
            self._forget()

    def _forget(self) -> None:
        if not self._done:
            self._done = True
            self._spool.close()
            os.unlink(self._spool.name)

    def __del__(self) -> None:
        """A writer dropped without :meth:`close` writes nothing (IOBase would close it,
        and so commit, whatever state the job is in)."""
        if not getattr(self, "_done", True):
            self.discard()
