"""Directory versions from a pod: a local directory written as one version (its files
hashed and uploaded in parallel to the one location the service chose, then one commit),
and read back whole (to a directory, whole or not at all) or file by file.

Everything the service would refuse is refused here first, before anything is sent: a
directory with no files, a symlink that leaves the directory, a path the rules of
``o41.core.directories`` do not take, too many files. Paths the service answers with are
checked again before a file is written, so a read never writes outside its output.
"""

from __future__ import annotations

import fcntl
import hashlib
import io
import json
import os
import shutil
import urllib.parse
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from o41.client.artifacts import Artifacts, Read
from o41.client.cache import Bypass, copy
from o41.client.errors import ArtifactError, Damaged
from o41.client.progress import Callback, Progress
from o41.client.reads import PARTIAL, RangeReader, Relocate, download
from o41.client.retries import begin_elsewhere
from o41.client.transfers import BLOCK, Body, Pool, Source, put
from o41.core.directories import (
    MAX_FILES,
    DirectoryRefused,
    FileEntry,
    check_manifest,
    path_problem,
)

#: Files uploaded (and downloaded) at once: small files cost a round trip each, so more
#: of them are in flight than parts of one large file.
PARALLEL_FILES = 16


@dataclass(frozen=True)
class LocalFile:
    path: str  # relative, '/' between names
    source: Path  # where the bytes are (a symlink inside the directory: its target's)
    size: int


@dataclass(frozen=True)
class DirectoryWritten:
    version: str
    location: str
    rule: str
    warning: str | None
    size: int
    files: int
    tag: str | None = None


def _q(name: str) -> str:
    return urllib.parse.quote(name, safe="")


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def scan(root: str | os.PathLike[str]) -> list[LocalFile]:
    """Every file under ``root``, by relative path. A symlink is followed when its target
    is inside ``root`` (a file: its bytes under the link's path; a folder: walked, once
    per chain, never in a loop); one that leaves ``root``, dangles, or names something
    that is neither a file nor a folder is refused, as is an empty directory. Empty
    folders are not kept (a version holds files)."""
    top = Path(root)
    if not top.is_dir():
        raise ArtifactError(f"{top} is not a directory")
    real_top = os.path.realpath(top)
    found: list[LocalFile] = []

    def walk(folder: str, prefix: str, chain: frozenset[str]) -> None:
        try:
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
        except OSError as e:
            raise ArtifactError(f"cannot list {folder}: {e.strerror}") from None
        for entry in entries:
            rel = prefix + entry.name
            if why := path_problem(rel):
                raise ArtifactError(f"{why}; rename it, then write again")
            if entry.is_symlink():
                target = os.path.realpath(entry.path)
                if not _inside(target, real_top):
                    raise ArtifactError(
                        f"{rel} is a symlink to {target}, outside {top}: a directory version "
                        "holds only what is inside it; copy the file in, or remove the link"
                    )
                if os.path.isdir(target):
                    if target in chain:
                        raise ArtifactError(f"{rel} is a symlink loop (to {target})")
                    walk(target, rel + "/", chain | {target})
                elif os.path.isfile(target):
                    found.append(LocalFile(rel, Path(target), os.stat(target).st_size))
                else:
                    raise ArtifactError(f"{rel} is a symlink to nothing readable ({target})")
            elif entry.is_dir(follow_symlinks=False):
                real = os.path.realpath(entry.path)
                walk(entry.path, rel + "/", chain | {real})
            elif entry.is_file(follow_symlinks=False):
                found.append(LocalFile(rel, Path(entry.path), entry.stat().st_size))
            else:
                raise ArtifactError(
                    f"{rel} is neither a file nor a folder (a socket, FIFO or device)"
                )
            if len(found) > MAX_FILES:
                raise ArtifactError(
                    f"{top} has more than {MAX_FILES} files, the most a directory version "
                    "holds: pack small files together (a tar, shards)"
                )

    walk(str(top), "", frozenset({real_top}))
    if not found:
        raise ArtifactError(f"{top} has no files: a directory version holds files")
    return found


def md5_of(path: Path) -> str:
    digest = hashlib.md5()  # noqa: S324 - integrity, as the bucket's ETag
    with path.open("rb") as f:
        while block := f.read(BLOCK):
            digest.update(block)
    return digest.hexdigest()


def manifest(files: list[LocalFile]) -> list[FileEntry]:
    """The files' manifest (MD5s hashed in parallel), checked as the service checks it."""
    try:  # the rules first, before hashing a byte
        check_manifest(FileEntry(f.path, f.size, "0" * 32) for f in files)
    except DirectoryRefused as e:
        raise ArtifactError(str(e)) from None
    with ThreadPoolExecutor(max_workers=PARALLEL_FILES) as pool:
        md5s = list(pool.map(lambda f: md5_of(f.source), files))
    return check_manifest(FileEntry(f.path, f.size, m) for f, m in zip(files, md5s, strict=True))


def write_dir(
    api: Artifacts,
    organization: str,
    artifact: str,
    root: str | os.PathLike[str],
    *,
    metadata: Mapping[str, Any] | None = None,
    tag: str | None = None,
    callback: Callback | None = None,
) -> DirectoryWritten:
    """Write the directory ``root`` as one version: begin (one location for all its
    files), upload every file in parallel, commit. When the bucket fails, begin again
    with that location excluded, as a file's write does."""
    files = {f.path: f for f in scan(root)}
    entries = manifest(list(files.values()))
    size = sum(e.size for e in entries)
    request: dict[str, Any] = {
        "organization": organization,
        "artifact": artifact,
        "place": api.place.as_json(),
        "files": [{"path": e.path, "size": e.size, "md5": e.md5} for e in entries],
    }
    if metadata is not None:
        request["metadata"] = dict(metadata)
    if tag is not None:
        request["tag"] = tag

    def begin(exclude: list[str]) -> Mapping[str, Any]:
        # idempotent: a begin sent twice leaves a second pending write that nobody commits;
        # its lease expires and the sweeper deletes the files it had (none: never sent)
        began: Mapping[str, Any] = api.call(
            "POST", "/v1/directories", {**request, "exclude": exclude}, idempotent=True
        )
        return began

    def send(began: Mapping[str, Any]) -> None:
        _upload(api, files, began["files"], size, began["location"], callback)

    began, _ = begin_elsewhere(begin, send)
    # a repeat of a commit that landed answers the version (the service keeps it)
    done = api.call("POST", f"/v1/directories/{_q(began['version'])}/commit", {}, idempotent=True)
    return DirectoryWritten(
        began["version"],
        began["location"],
        began["rule"],
        began.get("warning"),
        size,
        len(entries),
        done.get("tag"),
    )


def _upload(
    api: Artifacts,
    files: Mapping[str, LocalFile],
    uploads: list[Mapping[str, Any]],
    size: int,
    location: str,
    callback: Callback | None = None,
) -> None:
    progress = Progress(size, f"upload to {location}", callback)
    pool = Pool(api.timeout)

    def one(req: Mapping[str, Any]) -> None:
        local = files.get(req["path"])
        if local is None:
            raise ArtifactError(f"the service signed an upload of {req['path']!r}, not asked for")
        source = Source(path=local.source)

        def body() -> Body:
            return source.slice(0, local.size, progress)

        put(pool, req, body, local.size, location)

    try:
        with ThreadPoolExecutor(max_workers=PARALLEL_FILES) as threads:
            list(threads.map(one, uploads))
    finally:
        pool.close()
        progress.close()


# --- reads -------------------------------------------------------------------------------


def _base(organization: str, artifact: str, ref: str) -> str:
    return f"/v1/organizations/{_q(organization)}/artifacts/{_q(artifact)}/versions/{_q(ref)}"


def _place_query(api: Artifacts) -> str:
    return urllib.parse.urlencode({k: v for k, v in api.place.as_json().items() if v is not None})


def listing(
    api: Artifacts, organization: str, artifact: str, ref: str, *, download: bool = False
) -> dict[str, Any]:
    """A directory version's files (path, size, MD5), sorted by path; with ``download``
    a signed download of each."""
    query = _place_query(api) + ("&download=true" if download else "")
    found: dict[str, Any] = api.call("GET", f"{_base(organization, artifact, ref)}/files?{query}")
    return found


def locate_file(
    api: Artifacts, organization: str, artifact: str, ref: str, path: str, *, again: bool = False
) -> dict[str, Any]:
    """One file of a directory version: where it lives, its size and MD5, a download
    (``again``: signed again for a read begun, which the service counted already)."""
    if why := path_problem(path):
        raise ArtifactError(why)
    quoted = urllib.parse.quote(path, safe="/")
    query = _place_query(api) + ("&again=true" if again else "")
    found: dict[str, Any] = api.call(
        "GET", f"{_base(organization, artifact, ref)}/files/{quoted}?{query}"
    )
    return found


def _file_of(found: Mapping[str, Any], entry: Mapping[str, Any]) -> dict[str, Any]:
    """The read answer of one file of a directory version (``found``: the version's
    listing; ``entry``: the file's path, size, MD5 and, signed, its download)."""
    return {
        "version": found["version"],
        "location": found["location"],
        "path": entry["path"],
        "size": entry["size"],
        "md5": entry["md5"],
        "download": entry.get("download"),
    }


def _locator(
    api: Artifacts, organization: str, artifact: str, version: str, path: str, *, again: bool = True
) -> Relocate:
    """What signs one file's download again (``again=False``: the first time, counted as
    a read of that file alone)."""
    return lambda: {
        **locate_file(api, organization, artifact, version, path, again=again),
        "path": path,
    }


def _md5_is(path: Path, size: int, md5: str) -> bool:
    try:
        return path.stat().st_size == size and md5_of(path) == md5
    except OSError:
        return False


def read_dir(
    api: Artifacts,
    organization: str,
    artifact: str,
    ref: str,
    output: str | os.PathLike[str],
    *,
    callback: Callback | None = None,
) -> tuple[Read, int]:
    """A directory version to the directory ``output`` (new, or empty), whole or not at
    all: its files come in parallel into a partial directory beside it, renamed into place
    once every file is down and checked. Returns the read and the number of files.

    Through the node's cache when there is one (and the directory fits in it): the files
    it holds cost nothing, the others are fetched into it. Without, a read that fails
    keeps ``output.o41-partial/`` (the files that came whole, and the bytes of those that
    did not) for the next read of the same version to ``output``, which fetches only the
    rest. Only what is fetched is signed, and so counted: every file at once when none
    is here yet, else each missing file on its own."""
    out = Path(output)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ArtifactError(f"{out} exists and is not an empty directory: read to a new path")
    found = listing(api, organization, artifact, ref)
    for f in found["files"]:  # what the service names is checked like what is sent
        if why := path_problem(f["path"]):
            raise ArtifactError(f"the service answered a bad path: {why}")
    partial = out.with_name(out.name + PARTIAL)
    state = out.with_name(out.name + PARTIAL + ".json")
    cache = api.cache
    through_cache = cache is not None and cache.fits(found["size"])
    hit = False
    with Progress(found["size"], f"download from {found['location']}", callback) as progress:
        try:
            if through_cache:
                shutil.rmtree(partial, ignore_errors=True)
                partial.mkdir(parents=True)
                hit = _dir_through_cache(api, organization, artifact, found, partial, progress)
            else:
                _dir_download(api, organization, artifact, found, partial, state, progress)
            if out.exists():
                out.rmdir()
            partial.rename(out)
            state.unlink(missing_ok=True)
        except Damaged:
            shutil.rmtree(partial, ignore_errors=True)
            state.unlink(missing_ok=True)
            raise
        except BaseException:
            if through_cache:  # the cache keeps what came; the copies are no use
                shutil.rmtree(partial, ignore_errors=True)
            raise
    locality = "cached" if hit else found.get("locality", "")
    read = Read(found["version"], found["location"], locality, found["size"], found.get("tag"))
    return read, len(found["files"])


def _dir_download(
    api: Artifacts,
    organization: str,
    artifact: str,
    found: Mapping[str, Any],
    partial: Path,
    state: Path,
    progress: Callable[[int], None],
) -> None:
    """Every file to ``partial/PATH``, each checked; a partial directory of this same
    version (``state`` says which) is gone on from: its whole files are kept (checked
    again), the others continue from their bytes."""
    version = found["version"]
    mark = {"organization": organization, "artifact": artifact, "version": version}
    try:
        same = json.loads(state.read_text()) == mark and partial.is_dir()
    except (OSError, ValueError):
        same = False
    if not same:
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        state.write_text(json.dumps(mark))
    todo = []
    for f in found["files"]:
        dest = partial.joinpath(*f["path"].split("/"))
        if same and _md5_is(dest, f["size"], f["md5"]):
            progress(f["size"])
        else:
            todo.append(f)
    if not todo:
        return
    signed: dict[str, Mapping[str, Any]] = {}
    if len(todo) == len(found["files"]):  # nothing here yet: every file signed at once
        answer = listing(api, organization, artifact, version, download=True)
        signed = {f["path"]: f for f in answer["files"]}

    def one(f: Mapping[str, Any]) -> None:
        dest = partial.joinpath(*f["path"].split("/"))
        dest.parent.mkdir(parents=True, exist_ok=True)
        locate = _locator(api, organization, artifact, version, f["path"])
        first = _locator(api, organization, artifact, version, f["path"], again=False)
        entry = signed.get(f["path"])
        file_found = _file_of(found, entry) if entry is not None else first()
        download(file_found, dest, api.timeout, relocate=locate, progress=progress)

    with ThreadPoolExecutor(max_workers=PARALLEL_FILES) as threads:
        list(threads.map(one, todo))


def _dir_through_cache(
    api: Artifacts,
    organization: str,
    artifact: str,
    found: Mapping[str, Any],
    partial: Path,
    progress: Callable[[int], None],
) -> bool:
    """Every file from the node's cache (fetched into it first when it is not there) to
    ``partial/PATH``. Under the directory's own lock, so that many readers of one version
    at once sign (and count) its files once. Whether every file was there already."""
    assert api.cache is not None
    version = found["version"]
    cache = api.cache
    entries = {
        f["path"]: cache.entry(organization, artifact, version, f["path"]) for f in found["files"]
    }
    hits: list[bool] = []
    with cache.entry(organization, artifact, version, "/").locked(fcntl.LOCK_EX):
        missing = [p for p, e in entries.items() if not e.present()]
        signed: dict[str, Mapping[str, Any]] = {}
        if missing and len(missing) == len(entries):  # none here: signed all at once
            answer = listing(api, organization, artifact, version, download=True)
            signed = {f["path"]: f for f in answer["files"]}

        def one(f: Mapping[str, Any]) -> None:
            locate = _locator(api, organization, artifact, version, f["path"])
            first = _locator(api, organization, artifact, version, f["path"], again=False)
            entry = signed.pop(f["path"], None)

            def fetch(data: Path) -> Mapping[str, Any]:
                file_found = _file_of(found, entry) if entry is not None else first()
                download(file_found, data, api.timeout, relocate=locate, progress=progress)
                return file_found

            got = entries[f["path"]].get({"size": f["size"], "md5": f["md5"]}, fetch)
            with got.file:
                dest = partial.joinpath(*f["path"].split("/"))
                dest.parent.mkdir(parents=True, exist_ok=True)
                copy(got.file, got.size, dest)
            if got.hit:
                progress(got.size)
            hits.append(got.hit)

        with ThreadPoolExecutor(max_workers=PARALLEL_FILES) as threads:
            list(threads.map(one, found["files"]))
    return all(hits)


def read_file(
    api: Artifacts,
    organization: str,
    artifact: str,
    ref: str,
    path: str,
    output: str | os.PathLike[str],
    *,
    callback: Callback | None = None,
) -> Read:
    """One file of a directory version to ``output``, whole or not at all (through the
    node's cache when there is one; without, a read that fails keeps its bytes for the
    next, as a file version's)."""
    out = Path(output)
    found: Mapping[str, Any] | None = None
    if api.cache is not None:
        if why := path_problem(path):
            raise ArtifactError(why)
        named = api.resolve(organization, artifact, ref)
        first = _locator(api, organization, artifact, named["version"], path, again=False)
        again = _locator(api, organization, artifact, named["version"], path)
        with Progress(0, "download", callback, show=False) as progress:
            try:
                got = api.cached(
                    organization,
                    artifact,
                    named["version"],
                    first,
                    relocate=again,
                    path=path,
                    progress=progress,
                )
            except Bypass as too_large:
                got, found = None, too_large.found
        if got is not None:
            with got.file:
                copy(got.file, got.size, out)
            locality = "cached" if got.hit or got.found is None else got.found["locality"]
            return Read(named["version"], named["location"], locality, got.size, named.get("tag"))
    if found is None:
        found = {**locate_file(api, organization, artifact, ref, path), "path": path}
    locate = _locator(api, organization, artifact, found["version"], path)
    with Progress(found["size"], f"download from {found['location']}", callback) as progress:
        download(found, out, api.timeout, relocate=locate, progress=progress)
    return Read(
        found["version"], found["location"], found["locality"], found["size"], found.get("tag")
    )


def open_file(
    api: Artifacts, organization: str, artifact: str, ref: str, path: str
) -> tuple[io.RawIOBase, dict[str, Any]]:
    """One file of a directory version as a raw seekable stream: from the node's cache
    when there is one (fetched into it first), else ranged GETs on the bucket."""
    found: Mapping[str, Any] | None = None
    if api.cache is not None:
        if why := path_problem(path):
            raise ArtifactError(why)
        named = api.resolve(organization, artifact, ref)
        first = _locator(api, organization, artifact, named["version"], path, again=False)
        again = _locator(api, organization, artifact, named["version"], path)
        try:
            got = api.cached(
                organization, artifact, named["version"], first, relocate=again, path=path
            )
        except Bypass as too_large:
            got, found = None, too_large.found
        if got is not None:
            locality = "cached" if got.hit or got.found is None else got.found["locality"]
            raw: io.RawIOBase = got.file.detach()
            return raw, {**named, "size": got.size, "path": path, "locality": locality}
    if found is None:
        found = {**locate_file(api, organization, artifact, ref, path), "path": path}
    locate = _locator(api, organization, artifact, found["version"], path)
    return RangeReader(found, api.timeout, relocate=locate), dict(found)


def read_any(
    api: Artifacts,
    organization: str,
    artifact: str,
    ref: str,
    output: str | os.PathLike[str],
    *,
    callback: Callback | None = None,
) -> tuple[Read, int | None]:
    """A version to ``output``: a file version to a file, a directory version to a
    directory. ``ref`` is resolved first (no download is signed for that), then read by
    its id, so both steps read the same version. The number of files of a directory."""
    named = api.resolve(organization, artifact, ref)
    if named.get("files") is not None:
        read, count = read_dir(
            api, organization, artifact, named["version"], output, callback=callback
        )
        return Read(read.version, read.location, read.locality, read.size, named.get("tag")), count
    r = api.read(
        organization, artifact, named["version"], Path(output), named=named, callback=callback
    )
    return Read(r.version, r.location, r.locality, r.size, named.get("tag")), None
