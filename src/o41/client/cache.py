"""This node's copy of the versions it read: a version never changes, so once its bytes
are here, reading it again costs no request to its bucket and no egress.

An entry is one file of one version, named by (organization, artifact, version id, path
inside a directory version); only the bytes are kept here, never what a reference names:
``latest`` and tags are asked of the service every time, and the version id it answers
is the key. Each entry is a folder ``<root>/v1/<sha256 of the key>/``:

========================= ================================================================
``data``                  the bytes, whole and checked (renamed here only then)
``meta.json``             the key, the size and MD5 the service gave, and the CRC32 of
                          ``data`` taken when it came; its mtime is the entry's last use
``data.o41-partial(.json)`` a download that stopped, continued by the next read
``lock``                  ``fcntl.flock``: shared to read, exclusive to fill or evict
========================= ================================================================

Safe for many processes at once (the ranks of a job on one node): one fills an entry
while the others wait on its lock, then read what it filled; files appear by atomic
renames. Checked on every use: an entry whose size or CRC32 is not the one recorded
(a disk error, a hand that edited it) is fetched again, never served. Bounded: before a
new entry is filled, the least recently used ones go until it fits (``O41_ARTIFACTS_CACHE_SIZE``,
default 50 GiB); an entry in use (locked) is not evicted; a version larger than the bound
is not cached at all.

``O41_ARTIFACTS_CACHE``: the folder (default ``$XDG_CACHE_HOME/o41/artifacts``, else
``~/.cache/o41/artifacts``), or ``off`` (also ``0``, ``false``, ``no``, ``none``) for no
cache. Standard library only (and zlib-ng's CRC32 when installed).
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import io
import json
import logging
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from o41.client.errors import ArtifactError, ConfigError

try:  # zlib-ng's CRC32 costs 0.015 CPU seconds a GiB, the standard library's 0.21
    from zlib_ng.zlib_ng import crc32
except ImportError:  # pragma: no cover - a pod without the wheel: the same CRC32, slower
    from zlib import crc32

log = logging.getLogger("o41")

ENV_CACHE = "O41_ARTIFACTS_CACHE"
ENV_CACHE_SIZE = "O41_ARTIFACTS_CACHE_SIZE"
#: The values of O41_ARTIFACTS_CACHE that turn the cache off.
OFF = frozenset({"off", "0", "false", "no", "none"})
DEFAULT_SIZE = 50 * 2**30
LAYOUT = "v1"
BLOCK = 4 * 1024 * 1024

_UNITS = {
    "": 1,
    "b": 1,
    "k": 2**10,
    "kib": 2**10,
    "m": 2**20,
    "mib": 2**20,
    "g": 2**30,
    "gib": 2**30,
    "t": 2**40,
    "tib": 2**40,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
}


def parse_size(text: str) -> int:
    """``50GiB``, ``50G`` (binary), ``50GB`` (decimal), ``1073741824`` (bytes)."""
    found = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", text)
    unit = found.group(2).lower() if found else ""
    if found is None or unit not in _UNITS:
        raise ConfigError(
            f"{ENV_CACHE_SIZE}={text!r} is not a size: write bytes, or a number with "
            "KiB, MiB, GiB, TiB (or K, M, G, T), or KB, MB, GB, TB"
        )
    return int(float(found.group(1)) * _UNITS[unit])


def default_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "o41" / "artifacts"


def crc_of(f: io.RawIOBase | io.BufferedIOBase | Any, size: int) -> int:
    """The CRC32 of the first ``size`` bytes of the open file ``f`` (read from its start)."""
    crc, at = 0, 0
    block = bytearray(BLOCK)
    view = memoryview(block)
    fd = f.fileno()
    while at < size:
        n = os.preadv(fd, [view[: min(BLOCK, size - at)]], at)
        if not n:
            break
        crc = crc32(view[:n], crc)
        at += n
    return crc


class Bypass(Exception):
    """A fetch that should not go into the cache (larger than it may hold): ``found`` is
    the read answer the caller downloads with instead."""

    def __init__(self, found: Mapping[str, Any]) -> None:
        super().__init__("larger than the cache")
        self.found = found


@dataclass
class Got:
    """An entry open for reading (``file``, at its start): ``hit`` when it was here
    already; else ``found`` is the read answer it was fetched with."""

    file: io.BufferedReader
    size: int
    hit: bool
    found: Mapping[str, Any] | None = None


class Cache:
    """The cache under ``root``, at most ``limit`` bytes (:data:`DEFAULT_SIZE`)."""

    def __init__(self, root: str | os.PathLike[str], limit: int = DEFAULT_SIZE) -> None:
        self.root = Path(root)
        self.limit = limit
        self._usable: bool | None = None

    def __repr__(self) -> str:
        return f"Cache({str(self.root)!r}, limit={self.limit})"

    @classmethod
    def from_env(cls) -> Cache | None:
        """The cache ``O41_ARTIFACTS_CACHE`` and ``O41_ARTIFACTS_CACHE_SIZE`` name (the
        defaults when unset); None when turned off."""
        where = os.environ.get(ENV_CACHE, "").strip()
        if where.lower() in OFF and where:
            return None
        size = os.environ.get(ENV_CACHE_SIZE, "").strip()
        return cls(
            Path(where).expanduser() if where else default_root(),
            parse_size(size) if size else DEFAULT_SIZE,
        )

    @classmethod
    def of(cls, setting: Cache | str | os.PathLike[str] | bool | None) -> Cache | None:
        """A client's ``cache`` argument: a cache, a folder, False (none), True or None
        (the environment's)."""
        if isinstance(setting, Cache):
            return setting
        if setting is False:
            return None
        if setting is None or setting is True:
            return cls.from_env()
        size = os.environ.get(ENV_CACHE_SIZE, "").strip()
        return cls(Path(setting).expanduser(), parse_size(size) if size else DEFAULT_SIZE)

    def fits(self, size: int) -> bool:
        return size <= self.limit

    def usable(self) -> bool:
        """Whether this process can keep entries under the root, tried once. A pod with a
        read-only root filesystem (or a folder it may not write) reads from the buckets
        without a cache, said once in the log, rather than failing its reads."""
        if self._usable is None:
            try:
                self.root.mkdir(parents=True, exist_ok=True)
                fd, probe = tempfile.mkstemp(prefix=".probe-", dir=self.root)
                os.close(fd)
                os.unlink(probe)
                self._usable = True
            except OSError as e:
                log.warning(
                    "cache: %s cannot be written (%s): reading from the buckets without a "
                    "cache; set %s to a writable folder (an emptyDir in a pod), or to off",
                    self.root,
                    e.strerror or e,
                    ENV_CACHE,
                )
                self._usable = False
        return self._usable

    def entry(self, organization: str, artifact: str, version: str, path: str = "") -> Entry:
        key = {"organization": organization, "artifact": artifact, "version": version, "path": path}
        name = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()
        return Entry(self, self.root / LAYOUT / name, key)

    # --- size ---------------------------------------------------------------------------

    def entries(self) -> list[tuple[float, int, Path]]:
        """(last use, bytes on disk, folder) of every entry."""
        found: list[tuple[float, int, Path]] = []
        try:
            folders = list(os.scandir(self.root / LAYOUT))
        except FileNotFoundError:
            return found
        for folder in folders:
            used, size = 0.0, 0
            try:
                for f in os.scandir(folder.path):
                    st = f.stat(follow_symlinks=False)
                    size += st.st_blocks * 512 if f.name != "data" else st.st_size
                    if f.name in ("meta.json", "data.o41-partial.json"):
                        used = max(used, st.st_mtime)
            except FileNotFoundError:
                continue  # evicted meanwhile
            found.append((used, size, Path(folder.path)))
        return found

    def size(self) -> int:
        return sum(size for _, size, _ in self.entries())

    def make_room(self, need: int, keep: Path | None = None) -> None:
        """Evict the least recently used entries until ``need`` more bytes fit (an entry
        being read or filled is skipped: its lock is held)."""
        entries = self.entries()
        total = sum(size for _, size, _ in entries)
        if total + need <= self.limit:
            return
        for _, size, folder in sorted(entries):
            if total + need <= self.limit:
                break
            if folder == keep:
                continue
            if Entry(self, folder, {}).evict():
                total -= size
                log.info("cache: evicted %s (%d bytes, least recently used)", folder.name, size)


class Entry:
    """One file of one version in the cache (see the module)."""

    def __init__(self, cache: Cache, folder: Path, key: Mapping[str, str]) -> None:
        self.cache, self.folder, self.key = cache, folder, dict(key)
        self.data = folder / "data"
        self.meta = folder / "meta.json"
        self._lock = folder / "lock"

    @contextmanager
    def locked(self, how: int) -> Iterator[None]:
        """The entry's lock, ``how`` (LOCK_SH, LOCK_EX, with LOCK_NB: BlockingIOError if
        held). The lock file may be removed with the entry while this waits: then the
        lock is taken again on the new one."""
        while True:
            self.folder.mkdir(parents=True, exist_ok=True)
            try:
                fd = os.open(self._lock, os.O_RDWR | os.O_CREAT, 0o666)
            except FileNotFoundError:
                continue  # the folder went (evicted) between the two calls
            try:
                fcntl.flock(fd, how)
                held = os.fstat(fd)
                now = os.stat(self._lock)
            except FileNotFoundError:
                os.close(fd)
                continue
            except BaseException:
                os.close(fd)
                raise
            if (held.st_dev, held.st_ino) == (now.st_dev, now.st_ino):
                break
            os.close(fd)  # locked a file the entry no longer has
        try:
            yield
        finally:
            os.close(fd)

    def present(self) -> bool:
        """Whether the entry looks whole (its record is there); not checked."""
        return self.meta.exists()

    def _identity(self) -> tuple[int, int] | None:
        try:
            st = os.stat(self.data)
        except FileNotFoundError:
            return None
        return st.st_ino, st.st_mtime_ns

    def _verified(self, expect: Mapping[str, Any] | None) -> io.BufferedReader | None:
        """The data, open, if the entry is whole and checks: its meta is this key's, agrees
        with ``expect`` (size, MD5), and the data has the recorded size and CRC32."""
        try:
            meta = json.loads(self.meta.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            log.warning("cache: %s has an unreadable record: fetching it again", self.folder)
            return None
        if not isinstance(meta, dict) or meta.get("key") != self.key:
            return None
        size = meta.get("size")
        if expect is not None and (
            expect.get("size") != size or (expect.get("md5") and expect["md5"] != meta.get("md5"))
        ):
            log.warning(
                "cache: %s is not what the service says of version %s: fetching it again",
                self.folder,
                self.key.get("version"),
            )
            return None
        try:
            f = open(self.data, "rb")  # noqa: SIM115 - handed to the caller
        except FileNotFoundError:
            return None
        st = os.fstat(f.fileno())
        if st.st_size != size or crc_of(f, size) != meta.get("crc32"):
            f.close()
            log.warning(
                "cache: %s (version %s) is damaged (its size or CRC32 is not the one recorded): "
                "fetching it again",
                self.folder,
                self.key.get("version"),
            )
            return None
        _mark_used(self.meta)  # used now: the last to be evicted
        return f

    def peek(self, expect: Mapping[str, Any] | None) -> io.BufferedReader | None:
        """The entry's bytes, open, if they are here and check; else None (nothing fetched)."""
        with self.locked(fcntl.LOCK_SH):
            return self._verified(expect)

    def get(
        self, expect: Mapping[str, Any] | None, fetch: Callable[[Path], Mapping[str, Any]]
    ) -> Got:
        """The entry's bytes, open: the ones here when they check, else fetched
        (``fetch(path)`` downloads the version to ``path`` and returns its read answer)
        by this process while the others wait, once."""
        for _ in range(8):
            with self.locked(fcntl.LOCK_SH):
                f = self._verified(expect)
                if f is not None:
                    return Got(f, os.fstat(f.fileno()).st_size, True)
                seen = self._identity()
            with self.locked(fcntl.LOCK_EX):
                now = self._identity()
                if now is not None and now != seen:
                    continue  # another process filled it meanwhile: check that
                if now is not None:  # what is here does not check: out with it
                    self.data.unlink(missing_ok=True)
                self.meta.unlink(missing_ok=True)
                return self._fill(expect, fetch)
        raise ArtifactError(f"the cache entry {self.folder} kept changing while read")

    def _fill(
        self, expect: Mapping[str, Any] | None, fetch: Callable[[Path], Mapping[str, Any]]
    ) -> Got:
        if expect is not None:
            self.cache.make_room(int(expect["size"]), keep=self.folder)
        found = fetch(self.data)
        f = open(self.data, "rb")  # noqa: SIM115 - handed to the caller
        size = os.fstat(f.fileno()).st_size
        meta = {
            "key": self.key,
            "size": size,
            "md5": found.get("md5"),
            "crc32": crc_of(f, size),
            "location": found.get("location"),
            "stored": time.time(),
        }
        tmp = self.meta.with_name(f"meta.json.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(meta))
        os.replace(tmp, self.meta)
        _mark_used(self.meta)
        if expect is None:
            self.cache.make_room(0, keep=self.folder)
        return Got(f, size, False, found)

    def evict(self) -> bool:
        """Remove the entry unless it is in use (its lock held): whether it was removed."""
        try:
            with self.locked(fcntl.LOCK_EX | fcntl.LOCK_NB):
                for f in os.scandir(self.folder):
                    if f.name != "lock":
                        os.unlink(f.path)
                os.unlink(self._lock)  # held until the folder is gone: waiters look again
                os.rmdir(self.folder)
        except BlockingIOError:
            return False
        except OSError as e:
            if e.errno not in (errno.ENOENT, errno.ENOTEMPTY):
                raise
            return False
        return True


def _copy_into(source: io.BufferedReader, out: io.BufferedWriter, size: int) -> None:
    """``size`` bytes from ``source``'s start to ``out``'s, by the kernel
    (``copy_file_range``: a reflink where the file system has them), else through here."""
    at, src, dst = 0, source.fileno(), out.fileno()
    while at < size:
        try:
            n = os.copy_file_range(src, dst, size - at, at, at)
        except OSError as e:
            if e.errno not in (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
                raise
            source.seek(at)
            out.seek(at)
            shutil.copyfileobj(source, out, BLOCK)
            return
        if not n:
            raise ArtifactError(f"the cached copy ended at byte {at} of {size}")
        at += n


def copy(source: io.BufferedReader, size: int, output: Path) -> None:
    """``size`` bytes of ``source`` (from its start) to ``output``, whole or not at all
    (``output.o41-partial`` renamed over it), copied by the kernel."""
    partial = output.with_name(output.name + ".o41-partial")
    try:
        with open(partial, "wb") as out:
            _copy_into(source, out, size)
        os.replace(partial, output)
        # a download to this output that stopped earlier is done with: its state goes too
        output.with_name(output.name + ".o41-partial.json").unlink(missing_ok=True)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise


def _mark_used(path: Path) -> None:
    """Stamp ``path`` with this instant from the precise clock: the kernel's own stamp
    (``os.utime`` without times, a file's creation) moves in ticks of a few milliseconds,
    so two uses in one tick would tie and least-recently-used could pick either."""
    now = time.time_ns()
    os.utime(path, ns=(now, now))
