"""The rules of a directory version, as plain functions of data: which relative paths a
directory may hold, the bounds of its manifest, and the manifest's stored form.

A directory version is one version whose bytes are many files: each file is an object
under the version's key prefix (``<artifact>/<version>/<path>``), all in the version's
one location. Its **manifest** lists every file's relative path, size and MD5, sorted by
path; the service stores it in the commit's own transaction, so a reader finds either no
version or the whole directory.

A path is relative and POSIX (``/`` between names): no empty name (so no leading or
trailing ``/``, no ``//``), no ``.`` or ``..``, no backslash, no control character, at most
:data:`MAX_NAME_BYTES` bytes a name and :data:`MAX_PATH_BYTES` in all (UTF-8). No path
may be both a file and a directory of another (``a`` and ``a/b``). Refusals are
:class:`DirectoryRefused` (HTTP 400) with a message naming the path and the rule.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from o41.core.writes import WriteRefused

MAX_FILES = 10_000
MAX_PATH_BYTES = 512
MAX_NAME_BYTES = 255
MAX_FILE_SIZE = 5 * 1024**3  # each file goes up in one PUT: S3's limit for one
#: The manifest as stored (compact JSON): it rides in the pending write's record and in
#: the commit's transaction (etcd takes at most 1.5 MiB a request), and the begin's body
#: carries it (the service takes at most 1 MiB a body).
MAX_MANIFEST_BYTES = 768 * 1024

_MD5 = re.compile(r"^[0-9a-f]{32}$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_COMPACT = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


class DirectoryRefused(WriteRefused):
    """A directory that cannot be written as sent; the message names the path and rule."""


@dataclass(frozen=True, slots=True, order=True)
class FileEntry:
    """One file of a directory version: its relative path, size and MD5 (hex)."""

    path: str
    size: int
    md5: str


def path_problem(path: str) -> str | None:
    """Why ``path`` cannot name a file of a directory version, or None."""
    shown = repr(path[:80])
    if not path:
        return "a file's path is empty"
    if path.startswith("/"):
        return f"path {shown} is absolute: give paths relative to the directory"
    if "\\" in path:
        return f"path {shown} has a backslash: separate names with '/'"
    if _CONTROL.search(path):
        return f"path {shown} has a control character"
    try:
        size = len(path.encode())
    except UnicodeEncodeError:
        return f"path {shown} is not valid UTF-8 text (a lone surrogate)"
    if size > MAX_PATH_BYTES:
        return f"path {shown}... is {size} bytes; at most {MAX_PATH_BYTES} are taken"
    for name in path.split("/"):
        if name in ("", ".", ".."):
            what = "an empty name ('//' or a trailing '/')" if not name else f"{name!r}"
            return f"path {shown} has {what}: each name between '/' is a real file or folder"
        if len(name.encode()) > MAX_NAME_BYTES:
            return f"path {shown} has a name over {MAX_NAME_BYTES} bytes"
    return None


def check_path(path: str) -> str:
    if why := path_problem(path):
        raise DirectoryRefused(why)
    return path


def check_manifest(files: Iterable[FileEntry]) -> list[FileEntry]:
    """The manifest sorted by path, or :class:`DirectoryRefused` naming the first rule a
    file breaks: no files, too many, a bad path or size or MD5, a path given twice, a path
    that is a file and a folder at once, or a manifest too large."""
    entries = sorted(files)
    if not entries:
        raise DirectoryRefused("the directory has no files: a directory version holds files")
    if len(entries) > MAX_FILES:
        raise DirectoryRefused(
            f"the directory has {len(entries)} files; at most {MAX_FILES} are taken: pack "
            "small files together (a tar, shards) or write several versions"
        )
    previous: FileEntry | None = None
    for entry in entries:
        check_path(entry.path)
        if not 0 <= entry.size <= MAX_FILE_SIZE:
            raise DirectoryRefused(
                f"file {entry.path[:80]!r} has {entry.size} bytes; a file of a directory is "
                f"at most {MAX_FILE_SIZE} bytes (one PUT): write it as a version of its own"
            )
        if _MD5.fullmatch(entry.md5) is None:
            raise DirectoryRefused(
                f"file {entry.path[:80]!r} has md5 {entry.md5[:40]!r}: 32 hex digits"
            )
        if previous is not None and previous.path == entry.path:
            raise DirectoryRefused(f"path {entry.path[:80]!r} is given twice")
        previous = entry
    # a file and a folder of the same name ("a", "a/b"): reading it back could not
    folders = {e.path.rsplit("/", 1)[0] for e in entries if "/" in e.path}
    paths = {e.path for e in entries}
    for folder in sorted(folders):
        parts = folder.split("/")
        for n in range(1, len(parts) + 1):
            if (prefix := "/".join(parts[:n])) in paths:
                raise DirectoryRefused(f"{prefix[:80]!r} is a file and a folder at once")
    size = len(dump_manifest(entries))
    if size > MAX_MANIFEST_BYTES:
        raise DirectoryRefused(
            f"the directory's manifest (paths, sizes, checksums) is {size} bytes as JSON; "
            f"at most {MAX_MANIFEST_BYTES} are kept: shorter paths, or fewer files"
        )
    return entries


def manifest_rows(entries: Sequence[FileEntry]) -> list[list[Any]]:
    """The stored form: ``[[path, size, md5], ...]``, sorted by path."""
    return [[e.path, e.size, e.md5] for e in entries]


def from_rows(rows: Iterable[Sequence[Any]]) -> list[FileEntry]:
    return [FileEntry(str(p), int(s), str(m)) for p, s, m in rows]


def dump_manifest(entries: Sequence[FileEntry]) -> bytes:
    """:func:`manifest_rows` as compact JSON."""
    return _COMPACT(manifest_rows(entries)).encode()


def load_manifest(raw: bytes) -> list[FileEntry]:
    return from_rows(json.loads(raw))


def entries_of(files: Iterable[Mapping[str, Any]]) -> list[FileEntry]:
    """A manifest from the JSON objects of an API answer (``path``, ``size``, ``md5``)."""
    return [FileEntry(f["path"], f["size"], f["md5"]) for f in files]


def object_key(prefix: str, path: str) -> str:
    """The key of a directory's file in the bucket: under the version's prefix."""
    return f"{prefix}/{path}"


def total_size(entries: Iterable[FileEntry]) -> int:
    return sum(e.size for e in entries)


def find(entries: Sequence[FileEntry], path: str) -> FileEntry | None:
    """The entry of ``path`` in a manifest sorted by path (binary search)."""
    lo, hi = 0, len(entries)
    while lo < hi:
        mid = (lo + hi) // 2
        if entries[mid].path < path:
            lo = mid + 1
        else:
            hi = mid
    return entries[lo] if lo < len(entries) and entries[lo].path == path else None


def children(entries: Iterable[FileEntry], folder: str) -> tuple[list[FileEntry], list[str]]:
    """What ``folder`` ("" for the top) holds: its files, and its sub-folders' paths
    (sorted, each once)."""
    prefix = f"{folder}/" if folder else ""
    files: list[FileEntry] = []
    folders: set[str] = set()
    for e in entries:
        if not e.path.startswith(prefix):
            continue
        rest = e.path[len(prefix) :]
        head, slash, _ = rest.partition("/")
        if slash:
            folders.add(prefix + head)
        else:
            files.append(e)
    return files, sorted(folders)


def is_folder(entries: Iterable[FileEntry], folder: str) -> bool:
    """Whether ``folder`` is a folder of the directory ("" is its top)."""
    if not folder:
        return True
    prefix = folder + "/"
    return any(e.path.startswith(prefix) for e in entries)
