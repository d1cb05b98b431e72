"""etcd snapshots: one streamed to a file through etcd's Maintenance Snapshot API, and
how a snapshot object and its sidecar are named and read in a bucket.

Shared by the placement service, which takes them on a schedule (``o41.webhook.backups``),
and ``o41 admin restore`` (``o41.restore``), which finds one. The snapshot is etcd's own
format (what ``etcdctl snapshot save`` writes, its SHA-256 trailer included), so
``etcdutl snapshot restore`` restores it as it restores any other.
"""

from __future__ import annotations

import asyncio
import calendar
import hashlib
import json
import os
import re
import shutil
import subprocess
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from o41.state import EtcdTls, StoreUnavailable

#: Where snapshots go in a bucket: under the reserved ``.o41/`` prefix, which no artifact
#: name can start with (docs/operations.md, "Backup and rebuild").
PREFIX = ".o41/snapshots/"
SIDECAR = ".json"
_KEY = re.compile(r"^\.o41/snapshots/(\d{8}T\d{6}Z)-(\d+)\.db$")
IMAGE_ETCDUTL = "/usr/local/bin/etcdutl"  # the app image's (Dockerfile)
STREAM_TIMEOUT = 1800.0  # seconds a whole snapshot may take (etcd's quota is 2-8 GiB)


class SnapshotError(Exception):
    """No snapshot could be taken or read; the message says why."""


@dataclass(frozen=True, slots=True)
class Snapshot:
    """One snapshot object, as its sidecar describes it."""

    key: str
    taken: float  # seconds since the epoch (UTC), when the stream began
    revision: int  # etcd's revision the snapshot holds
    size: int
    sha256: str  # of the object's bytes
    etcd_version: str

    @property
    def sidecar(self) -> str:
        return sidecar_key(self.key)

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, data: bytes, key: str) -> Snapshot:
        """The sidecar of ``key``; SnapshotError for anything else."""
        try:
            found = json.loads(data)
            snapshot = cls(
                key=str(found["key"]),
                taken=float(found["taken"]),
                revision=int(found["revision"]),
                size=int(found["size"]),
                sha256=str(found["sha256"]),
                etcd_version=str(found["etcd_version"]),
            )
        except (ValueError, KeyError, TypeError) as e:
            raise SnapshotError(f"the sidecar of {key} cannot be read: {e}") from None
        if snapshot.key != key or not re.fullmatch(r"[0-9a-f]{64}", snapshot.sha256):
            raise SnapshotError(f"the sidecar of {key} names {snapshot.key} or no SHA-256")
        return snapshot


def snapshot_key(taken: float, revision: int) -> str:
    """``.o41/snapshots/<UTC YYYYmmddTHHMMSSZ>-<revision>.db``: keys sort by time."""
    return f"{PREFIX}{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime(taken))}-{revision}.db"


def sidecar_key(key: str) -> str:
    return key + SIDECAR


def parse_key(key: str) -> tuple[float, int] | None:
    """(time taken, revision) of a snapshot object's key; None for any other key."""
    found = _KEY.match(key)
    if found is None:
        return None
    taken = calendar.timegm(time.strptime(found[1], "%Y%m%dT%H%M%SZ"))
    return float(taken), int(found[2])


def newest_first(keys: list[str]) -> list[str]:
    """The snapshot keys among ``keys`` (sidecars and other objects left out), newest
    first: by time taken, then revision."""
    parsed = [(p, k) for k in keys if (p := parse_key(k)) is not None]
    return [k for _, k in sorted(parsed, reverse=True)]


async def take(
    endpoints: list[str], tls: EtcdTls | None, path: Path, *, seconds: float = STREAM_TIMEOUT
) -> Snapshot:
    """Stream a snapshot of etcd into ``path`` from the first member that answers; its
    revision, size, SHA-256 and etcd's version (the object key is left to the caller:
    ``snapshot_key``). StoreUnavailable when no member could give one."""
    import grpc  # type: ignore[import-untyped]
    import grpc.aio  # type: ignore[import-untyped]
    from aetcd import rpc

    from o41.state.etcd import connection_settings

    targets, credentials = connection_settings(endpoints, tls)
    failures = []
    for target in targets:
        if credentials is None:
            channel = grpc.aio.insecure_channel(target)
        else:
            channel = grpc.aio.secure_channel(target, credentials)
        try:
            stub = rpc.MaintenanceStub(channel)
            status = await stub.Status(rpc.StatusRequest(), timeout=5.0)
            taken = time.time()
            # the snapshot holds at least the revision etcd had before it began; the file
            # itself says which (etcdutl, in the image), else that lower bound is kept
            at_least = int(status.header.revision)
            got = await _stream(stub, rpc, path, taken, at_least, str(status.version), seconds)
            exact = await asyncio.to_thread(exact_revision, path)
            return got if exact is None else replace(got, revision=exact)
        except grpc.aio.AioRpcError as e:
            failures.append(f"{target}: {e.code().name} {e.details()}")
        finally:
            await channel.close()
    raise StoreUnavailable(f"no etcd member gave a snapshot ({'; '.join(failures)})")


async def _stream(
    stub: object,
    rpc: object,
    path: Path,
    taken: float,
    revision: int,
    version: str,
    seconds: float,
) -> Snapshot:
    digest, size = hashlib.sha256(), 0
    call = stub.Snapshot(rpc.SnapshotRequest(), timeout=seconds)  # type: ignore[attr-defined]
    with path.open("wb") as out:
        async for chunk in call:
            out.write(chunk.blob)
            digest.update(chunk.blob)
            size += len(chunk.blob)
    if size == 0:
        raise SnapshotError("etcd sent an empty snapshot")
    return Snapshot("", taken, revision, size, digest.hexdigest(), version)


def etcdutl() -> str | None:
    """etcdutl, where there is one: ``$O41_ETCDUTL``, on PATH, or the image's."""
    found = os.environ.get("O41_ETCDUTL") or shutil.which("etcdutl")
    if found is None and os.access(IMAGE_ETCDUTL, os.X_OK):
        found = IMAGE_ETCDUTL
    return found


def exact_revision(path: Path) -> int | None:
    """The revision the snapshot file holds, read by ``etcdutl snapshot status`` (None
    without etcdutl, or when it cannot read it)."""
    tool = etcdutl()
    if tool is None:
        return None
    done = subprocess.run(
        [tool, "snapshot", "status", str(path), "-w", "json"],
        capture_output=True, text=True, check=False, timeout=300,
    )  # fmt: skip
    try:
        return int(json.loads(done.stdout)["revision"]) if done.returncode == 0 else None
    except (ValueError, KeyError, TypeError):
        return None
