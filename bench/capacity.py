"""The state store's capacity, measured: bytes in etcd per record kind, and what the
service does when etcd's quota is reached (docs/capacity.md holds the numbers).

One etcd member of the test bed's binary on 127.0.0.1, written through the service's own
code: version records and pending writes as o41.webhook.records makes them and with the
store calls begin and commit make (a pending write under a lease, then the compare-and-
swap transaction that deletes it and puts the version), usage counters through
o41.webhook.usage.counters.Usage, collection entries through the collections' HTTP service
(o41.webhook.collections, the real handler). After each kind: compaction to the current
revision and a defragmentation, then etcd's dbSize from its status endpoint.

Versions as a commit puts them since issue 32 (o41.webhook.writes.commit.make_version: the
version's record with previous, by and tag, its index key, the artifact's record, a tag
on one version in 50), a file version and directory versions of 100 and 1,000 files, with
the directory's manifest in etcd as before issue 32 (the ``manifests/`` key, the records
without the new fields) and after (an object in the bucket, etcd keeping its SHA-256 and
size); and what each version costs in its bucket: its record object and manifest object
(o41.webhook.ledger, into a bucket that only counts the bytes PUT).

Then a second member with a small --quota-backend-bytes is filled until etcd raises its
NOSPACE alarm, and the answers of the store and of the collections' HTTP service are
printed as a client sees them, with what still works, and the recovery (compact,
defragment, disarm).

    .venv/bin/python bench/capacity.py [--records 20000] [--directories 2000] [--quota-mib 16]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import logging
import os
import secrets
import sys
import tempfile
import time
import urllib.request
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "src")]

import aiohttp  # noqa: E402
from aiohttp.test_utils import TestClient, TestServer  # noqa: E402

from o41.collections.keys import encode_key  # noqa: E402
from o41.collections.values import dumps  # noqa: E402
from o41.core.directories import FileEntry, check_manifest, dump_manifest  # noqa: E402
from o41.core.directories import manifest_rows as rows_of  # noqa: E402
from o41.core.ledger import manifest_object, record_key  # noqa: E402
from o41.core.versions import index_suffix  # noqa: E402
from o41.state import Compare, Delete, Put, StoreUnavailable  # noqa: E402
from o41.state.etcd import EtcdStore  # noqa: E402
from o41.webhook import app as service_app  # noqa: E402
from o41.webhook.buckets import OpenBucket  # noqa: E402
from o41.webhook.cluster.view import Cluster, View, organization_source  # noqa: E402
from o41.webhook.collections.quota import Limits  # noqa: E402
from o41.webhook.collections.service import Options  # noqa: E402
from o41.webhook.collections.standalone import make_app  # noqa: E402
from o41.webhook.ledger import put_manifest, record_of  # noqa: E402
from o41.webhook.records import (  # noqa: E402
    ArtifactRecord,
    Pending,
    Tag,
    Version,
    artifact_key,
    index_prefix,
    manifest_key,
    pending_key,
    tag_key,
    version_key,
)
from o41.webhook.usage.counters import Usage, rollup_prefix  # noqa: E402
from o41.webhook.writes.commit import make_version, version_of  # noqa: E402
from testbed.kube import bin_dir  # noqa: E402
from testbed.locations import ORG as SERVICE_ORG  # noqa: E402
from testbed.locations import Keys, location  # noqa: E402
from testbed.process import LOOPBACK, Server, free_port  # noqa: E402
from testbed.standin_bucket import Storage  # noqa: E402
from testbed.usage import FakeReviewer  # noqa: E402

GiB = 1024**3
MiB = 1024**2
ORG = "ml-research"
LOCATION = "aws-us-east-1"


class Etcd:
    """One etcd member on loopback, with its JSON gateway for status and maintenance."""

    def __init__(self, directory: Path, quota: int | None = None) -> None:
        self.port, peer = free_port(), free_port()
        self.url = f"http://{LOOPBACK}:{self.port}"
        argv = [
            str(bin_dir() / "etcd"),
            "--name=capacity",
            f"--data-dir={directory / 'data'}",
            f"--listen-client-urls={self.url}",
            f"--advertise-client-urls={self.url}",
            f"--listen-peer-urls=http://{LOOPBACK}:{peer}",
            f"--initial-advertise-peer-urls=http://{LOOPBACK}:{peer}",
            f"--initial-cluster=capacity=http://{LOOPBACK}:{peer}",
            "--unsafe-no-fsync",
            "--log-level=warn",
        ]
        if quota is not None:
            argv.append(f"--quota-backend-bytes={quota}")
        self.server = Server("etcd capacity", argv, directory / "etcd.log")
        self._compacted = 0

    def start(self) -> Etcd:
        self.server.start()
        self.server.wait_ready(lambda: self._call("/health", None).get("health") == "true", 30)
        return self

    def stop(self) -> None:
        self.server.stop(timeout=5)

    def _call(self, path: str, body: dict[str, Any] | None) -> dict[str, Any]:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            self.url + path, data=data, method="GET" if body is None else "POST"
        )
        with urllib.request.urlopen(req, timeout=60) as r:
            found: dict[str, Any] = json.load(r)
        return found

    def status(self) -> dict[str, Any]:
        return self._call("/v3/maintenance/status", {})

    def db_size(self) -> int:
        return int(self.status()["dbSize"])

    def compact_and_defrag(self) -> int:
        """etcdctl compact $(revision) --physical; etcdctl defrag; returns dbSize."""
        revision = int(self.status()["header"]["revision"])
        if revision != self._compacted:
            self._call("/v3/kv/compaction", {"revision": revision, "physical": True})
            self._compacted = revision
        self._call("/v3/maintenance/defragment", {})
        return self.db_size()

    def defrag(self) -> int:
        self._call("/v3/maintenance/defragment", {})
        return self.db_size()

    def alarms(self) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = self._call("/v3/maintenance/alarm", {"action": "GET"}).get(
            "alarms", []
        )
        return found

    def disarm(self) -> None:
        for alarm in self.alarms():
            self._call(
                "/v3/maintenance/alarm",
                {"action": "DEACTIVATE", "memberID": alarm["memberID"], "alarm": alarm["alarm"]},
            )


# --- records as the service makes them ------------------------------------------------------


def version_id(i: int) -> str:
    """As o41.webhook.records.new_version: ms since the epoch (hex) and 64 random bits."""
    return f"{int(time.time() * 1000) + i:012x}-{secrets.token_hex(8)}"


def artifact(i: int) -> str:
    return f"nlp/llama-8b-sft/run-{i % 1000:04d}/checkpoint"


def artifact_named(phase: str, i: int, artifacts: int) -> str:
    """An artifact's name as the service takes it today (no ``/``; o41.webhook.cluster.scope),
    as long as :func:`artifact`'s, one of ``artifacts`` of a ``phase`` (a letter): each
    kind of version measured has artifacts of its own, so that moving their artifact
    records (and tags) drops nothing of another kind's from the database."""
    return f"nlp.llama-8b-sft.run-{phase}{i % artifacts:03d}.checkpoint"


def pending(i: int, version: str, parts: int = 1, name: str | None = None) -> Pending:
    name = artifact(i) if name is None else name
    multipart = parts > 1
    return Pending(
        organization=ORG,
        artifact=name,
        version=version,
        namespace="team-nlp",
        location=LOCATION,
        key=f"{name}/{version}",
        rule="region",
        cloud="aws",
        region="us-east-1",
        source="env",
        size=2_147_483_648,
        md5=None if multipart else secrets.token_hex(16),
        upload_id=secrets.token_urlsafe(48) if multipart else None,
        parts=parts,
        began=time.time(),
        crc32=[base64.b64encode(secrets.token_bytes(4)).decode() for _ in range(parts)]
        if multipart
        else None,
    )


def committed(p: Pending) -> Version:
    return Version(
        organization=p.organization,
        artifact=p.artifact,
        version=p.version,
        location=p.location,
        key=p.key,
        size=p.size or 0,
        md5=p.md5,
        rule=p.rule,
        cloud=p.cloud,
        region=p.region,
        source=p.source,
        committed=time.time(),
    )


async def begin(store: EtcdStore, lease: int, i: int, parts: int = 1) -> Pending:
    """What begin stores: the pending record under the minute's lease."""
    p = pending(i, version_id(i), parts)
    await store.put(pending_key(p.version), p.dump(), lease=lease)
    return p


async def commit(store: EtcdStore, p: Pending) -> None:
    """What commit stores: one transaction deleting the pending record, putting the
    version, guarded by the pending record's mod revision."""
    found = await store.get(pending_key(p.version))
    assert found is not None
    result = await store.txn(
        [Compare(pending_key(p.version), "mod", "==", found.mod_revision)],
        [
            Delete(pending_key(p.version)),
            Put(version_key(p.organization, p.artifact, p.version), committed(p).dump()),
        ],
    )
    assert result.succeeded


# --- a version as a commit puts it since issue 32 --------------------------------------------

NAMESPACE = "team-a"  # the tenant that commits: the record's `by`
TAG_EVERY = 50  # one commit in this many moves a tag ("stable") to its version
# The fields issue 32 added to etcd's version record: absent from a record made before.
NEW_FIELDS = ("previous", "by", "tag", "manifest_sha256", "manifest_size")


class CountingBucket:
    """A bucket that keeps only the size of each object PUT into it: the record and
    manifest objects a commit writes (o41.webhook.ledger)."""

    def __init__(self) -> None:
        self.sizes: dict[str, int] = {}

    def put(self, key: str, data: bytes) -> None:
        self.sizes[key] = len(data)


def directory_files(n: int) -> list[FileEntry]:
    """A sharded checkpoint's files: ``shards/part-00042.safetensors``, up to 4 GiB each."""
    return [
        FileEntry(
            f"shards/part-{k:05d}.safetensors",
            2**20 + secrets.randbelow(4 * GiB),
            secrets.token_hex(16),
        )
        for k in range(n)
    ]


def directory_pending(i: int, version: str, name: str, entries: list[FileEntry]) -> Pending:
    """What a directory's begin stores (o41.webhook.directories.write): the manifest's rows
    ride in the pending record."""
    p = pending(i, version, name=name)
    return replace(
        p,
        size=sum(e.size for e in entries),
        md5=None,
        parts=len(entries),
        manifest=rows_of(sorted(entries)),
    )


def before_32(record: Version) -> bytes:
    """``record`` as a replica before issue 32 stored it: without the new fields."""
    data = json.loads(record.dump())
    return json.dumps(
        {k: v for k, v in data.items() if k not in NEW_FIELDS}, separators=(",", ":")
    ).encode()


def listed_key(v: Version) -> tuple[bytes, Version]:
    """A version's index key and the copy it holds (make_version's ``listed``)."""
    key = index_prefix(v.organization, v.artifact) + index_suffix(v.seq, v.version).encode()
    return key, replace(v, part_size=None, crc32=None, previous=None, by=None, tag=None)


@dataclass
class Committed:
    """One committed version's bytes: in etcd (keys + values it added, the artifact's
    record not counted: it is overwritten) and in its bucket."""

    etcd: int
    record_object: int = 0
    manifest_object: int = 0


async def begin_version(
    store: EtcdStore, lease: int, i: int, name: str, entries: list[FileEntry] | None
) -> Pending:
    version = version_id(i)
    p = (
        pending(i, version, name=name)
        if entries is None
        else directory_pending(i, version, name, entries)
    )
    await store.put(pending_key(p.version), p.dump(), lease=lease)
    return p


async def commit_now(
    store: EtcdStore,
    opened: OpenBucket,
    lease: int,
    i: int,
    name: str,
    entries: list[FileEntry] | None = None,
) -> Committed:
    """Begin, then commit as the service does since issue 32: the manifest object and the
    record object PUT to the bucket, then make_version's transaction (the version's
    record with previous, by and tag; its index key; the artifact's record; the tag)."""
    bucket = opened.bucket
    assert isinstance(bucket, CountingBucket)
    p = await begin_version(store, lease, i, name, entries)
    found = await store.get(pending_key(p.version))
    assert found is not None
    files = None if entries is None else len(entries)
    record = version_of(p, p.size or 0, p.md5, p.metadata, files=files)
    manifest = 0
    if entries is not None:
        ref = await put_manifest(opened, LOCATION, ORG, p.artifact, p.version, entries)
        record = replace(record, manifest_sha256=ref.sha256, manifest_size=ref.size)
        manifest = bucket.sizes[ref.key]
        assert manifest == len(manifest_object(ORG, p.artifact, p.version, entries)[1])
    tag = "stable" if i % TAG_EVERY == 0 else None
    made = await make_version(store, p, found.mod_revision, record, tag, NAMESPACE, opened)
    assert made
    got = await store.get(version_key(ORG, p.artifact, p.version))
    assert got is not None
    v = Version.load(got.value)
    assert v.by == NAMESPACE and v.tag == tag
    index, listed = listed_key(v)
    etcd = len(got.key) + len(got.value) + len(index) + len(listed.dump())
    if tag is not None:
        moved = Tag(v.version, v.committed, NAMESPACE).dump()
        etcd += len(tag_key(ORG, v.artifact, tag)) + len(moved)
    obj = bucket.sizes[record_key(ORG, v.artifact, v.version)]
    assert obj == len(record_of(v).canonical())
    return Committed(etcd, obj, manifest)


async def commit_before(
    store: EtcdStore, lease: int, i: int, name: str, entries: list[FileEntry] | None = None
) -> Committed:
    """Begin, then commit as the service did before issue 32 (make_version of then): one
    transaction puts the version's record (no previous, by, tag, manifest hash), its index
    key, the artifact's record, the tag, and a directory's manifest under ``manifests/``."""
    p = await begin_version(store, lease, i, name, entries)
    found = await store.get(pending_key(p.version))
    assert found is not None
    org, name, version = p.organization, p.artifact, p.version
    akey = artifact_key(org, name)
    files = None if entries is None else len(entries)
    record = version_of(p, p.size or 0, p.md5, p.metadata, files=files)
    for _ in range(20):
        current = await store.get(akey)
        if current is None:
            guard, seq = Compare(akey, "version", "==", 0), 1
        else:
            guard = Compare(akey, "mod", "==", current.mod_revision)
            seq = ArtifactRecord.load(current.value).count + 1
        numbered = replace(record, seq=seq)
        vkey, vvalue = version_key(org, name, version), before_32(numbered)
        index = index_prefix(org, name) + index_suffix(seq, version).encode()
        listed = before_32(replace(numbered, part_size=None, crc32=None))
        made: list[Delete | Put] = [
            Delete(pending_key(version)),
            Put(vkey, vvalue),
            Put(index, listed),
            Put(akey, ArtifactRecord(name, version, record.committed, seq).dump()),
        ]
        etcd = len(vkey) + len(vvalue) + len(index) + len(listed)
        if entries is not None:
            mkey, rows = manifest_key(org, name, version), dump_manifest(check_manifest(entries))
            made.append(Put(mkey, rows))
            etcd += len(mkey) + len(rows)
        if i % TAG_EVERY == 0:
            tkey, moved = tag_key(org, name, "stable"), Tag(version, record.committed, NAMESPACE)
            made.append(Put(tkey, moved.dump()))
            etcd += len(tkey) + len(moved.dump())
        pending_guard = Compare(pending_key(version), "mod", "==", found.mod_revision)
        if (await store.txn([pending_guard, guard], made)).succeeded:
            return Committed(etcd)
    raise RuntimeError(f"artifact {name!r}: 20 commits in a row ahead of this one")


@dataclass
class Ledgered:
    """A kind of version: its bytes in etcd (measured) and in its bucket (summed)."""

    etcd: Measured
    record_object: float  # bytes a version, in its bucket
    manifest_object: float


async def ledger_sizes(
    etcd: Etcd, store: EtcdStore, lease: int, n: int, directories: int
) -> list[Ledgered]:
    """Bytes a committed version costs in etcd, before issue 32 and now, and in its bucket:
    a file version (``n`` of them), directory versions of 100 files (``directories``) and
    of 1,000 files (a tenth as many)."""
    opened = OpenBucket(CountingBucket(), signs_locally=True)  # type: ignore[arg-type]
    phases = iter("abcdef")
    found: list[Ledgered] = []
    found += await ledger_shape(etcd, store, opened, lease, phases, "file version", n, None)
    for files, count in ((100, directories), (1000, max(1, directories // 10))):
        what = f"directory version, {files:,} files"
        found += await ledger_shape(etcd, store, opened, lease, phases, what, count, files)
    return found


async def ledger_shape(
    etcd: Etcd,
    store: EtcdStore,
    opened: OpenBucket,
    lease: int,
    phases: Iterator[str],
    what: str,
    count: int,
    files: int | None,
) -> list[Ledgered]:
    """``count`` versions of one shape committed as before issue 32, then as now, each
    over artifacts of its own, about 20 versions each: every commit but an artifact's
    first has a previous, and moves the artifact's record (overwritten: not counted)."""
    # one file list for all: the bytes do not depend on which paths
    entries = None if files is None else directory_files(files)
    width = 64 if files is None else 16
    artifacts = min(1000, max(width, count // 20))
    old = "before issue 32" + ("" if files is None else " (manifests/ key)")
    then_phase, now_phase = next(phases), next(phases)

    async def before() -> int:
        async def one(i: int) -> int:
            name = artifact_named(then_phase, i, artifacts)
            return (await commit_before(store, lease, i, name, entries)).etcd

        return await in_batches(count, one, width)

    made: list[Committed] = []

    async def now() -> int:
        async def one(i: int) -> int:
            name = artifact_named(now_phase, i, artifacts)
            c = await commit_now(store, opened, lease, i, name, entries)
            made.append(c)
            return c.etcd

        return await in_batches(count, one, width)

    then = await measure(etcd, f"{what}, {old}", count, before)
    measured = await measure(etcd, f"{what}, now", count, now)
    record_bytes = sum(c.record_object for c in made) / count
    manifest_bytes = sum(c.manifest_object for c in made) / count
    print(
        f"  {'':44} in its bucket: record object {record_bytes:,.0f} B, "
        f"manifest object {manifest_bytes:,.0f} B",
        flush=True,
    )
    return [Ledgered(then, 0, 0), Ledgered(measured, record_bytes, manifest_bytes)]


def write_dims(i: int) -> dict[str, str | None]:
    """A write counter's dimensions (o41.webhook.writes.commit's), one place each."""
    region = f"us-east-{i}"
    return {
        "cloud": "aws",
        "region": region,
        "source": "env",
        "rule": "region",
        "location": f"aws-{region}",
        "locationCloud": "aws",
        "locationRegion": region,
    }


# --- measuring -------------------------------------------------------------------------------


@dataclass
class Measured:
    kind: str
    records: int
    db_bytes: int  # dbSize grown, after compaction (unless not asked) and defragmentation
    logical: int  # key + value bytes, summed

    @property
    def per_record(self) -> float:
        return self.db_bytes / self.records

    @property
    def logical_per_record(self) -> float:
        return self.logical / self.records


async def in_batches(n: int, one: Callable[[int], Awaitable[int]], width: int = 64) -> int:
    """``one(i)`` for i below ``n``, ``width`` at a time; the sum of what they return."""
    total = 0
    for start in range(0, n, width):
        done = await asyncio.gather(*(one(i) for i in range(start, min(n, start + width))))
        total += sum(done)
    return total


async def measure(
    etcd: Etcd, kind: str, n: int, write: Callable[[], Awaitable[int]], compact: bool = True
) -> Measured:
    before = etcd.compact_and_defrag()
    logical = await write()
    after = etcd.compact_and_defrag() if compact else etcd.defrag()
    m = Measured(kind, n, after - before, logical)
    print(
        f"  {kind:44} {m.per_record:7.0f} B/record in dbSize"
        f"  ({m.logical_per_record:4.0f} B key + value)",
        flush=True,
    )
    return m


async def sizes(
    directory: Path, n: int, directories: int = 0
) -> tuple[list[Measured], list[Ledgered]]:
    etcd = Etcd(directory / "sizes").start()
    store = EtcdStore([etcd.url], timeout=30)
    found = []
    ledgered: list[Ledgered] = []
    try:
        print(f"etcd {etcd.status()['version']}, {n:,} records of each kind", flush=True)
        lease = await store.lease_grant(3600)

        async def versions() -> int:
            async def one(i: int) -> int:
                p = await begin(store, lease, i)
                await commit(store, p)
                v = committed(p)
                return len(version_key(ORG, v.artifact, v.version)) + len(v.dump())

            return await in_batches(n, one)

        async def pendings(parts: int) -> int:
            async def one(i: int) -> int:
                p = await begin(store, lease, i, parts)
                return len(pending_key(p.version)) + len(p.dump())

            return await in_batches(n, one)

        found.append(await measure(etcd, "committed version (begin + commit)", n, versions))
        found.append(
            await measure(
                etcd, "committed version, history not compacted", n, versions, compact=False
            )
        )
        found.append(await measure(etcd, "pending write, single upload", n, lambda: pendings(1)))
        await store.delete(pending_key(""), prefix=True)
        found.append(
            await measure(etcd, "pending write, multipart (64 parts)", n, lambda: pendings(64))
        )
        await store.delete(pending_key(""), prefix=True)

        async def usage() -> int:
            counters = Usage(store, interval=3600)
            for i in range(n):
                counters.add(ORG, "write", write_dims(i), versions=6, bytes=12_884_901_888)
            await counters.flush()  # each into its hour's record and its day's
            records = [
                *await store.range(rollup_prefix("hour")),
                *await store.range(rollup_prefix("day")),
            ]
            return sum(len(kv.key) + len(kv.value) for kv in records)

        found.append(await measure(etcd, "usage counter record (one hour, place)", 2 * n, usage))
        found.append(await collection_entries(etcd, n))
        if directories:
            print(
                f"versions as a commit puts them, before issue 32 and now: {n:,} file versions, "
                f"{directories:,} directories of 100 files, {max(1, directories // 10):,} of "
                "1,000",
                flush=True,
            )
            ledgered = await ledger_sizes(etcd, store, lease, n, directories)
    finally:
        await store.close()
        etcd.stop()
    return found, ledgered


def entry_value(i: int) -> bytes:
    """A typical entry: a worker's progress, as the Python client encodes it."""
    return dumps({"step": 1200 + i, "loss": 0.8125, "worker": f"node-{i % 64}", "done": False})


async def collection_entries(etcd: Etcd, n: int) -> Measured:
    options = Options(limits=Limits(ops_per_second=0, bytes_per_second=0, entries=0, bytes=0))
    app = make_app([etcd.url], "team-nlp", options, store_timeout=30)
    async with TestClient(TestServer(app, host=LOOPBACK)) as client:

        async def write() -> int:
            async def one(i: int) -> int:
                key, value = encode_key(f"worker-{i:06d}"), entry_value(i)
                r = await client.post(
                    "/v1/collections/run-0042/dict/progress/set",
                    json={"key": key, "value": base64.b64encode(value).decode()},
                )
                assert r.status == 200, await r.text()
                stored = f"/o41/collections/team-nlp/run-0042/dict/progress/e/{key}"
                return len(stored) + len(value)

            return await in_batches(n, one, width=32)

        return await measure(etcd, "collection entry (dict, strong)", n, write)


# --- the quota -------------------------------------------------------------------------------


class PlacementService:
    """The placement service's app in-process on ``store`` (etcd), with a stand-in bucket
    over HTTP on 127.0.0.1 and two locations, as tests/placement/test_writes.py runs it."""

    def __init__(self, store: EtcdStore) -> None:
        self.store = store
        self.storage = Storage()
        self.servers: list[TestServer] = []
        self.url = ""

    async def __aenter__(self) -> PlacementService:
        buckets = TestServer(self.storage.app(), host=LOOPBACK)
        await buckets.start_server()
        self.servers.append(buckets)
        self.storage.url = str(buckets.make_url("")).rstrip("/")
        view = View()
        view.put_location(location("east", "aws", "us-east-1", 1))
        view.put_organization(
            organization_source(
                {"metadata": {"name": SERVICE_ORG}, "spec": {"namespaces": ["team-a"]}}
            )
        )
        view.synced.set()
        app = service_app.make_app(
            service_app.Settings(usage_interval=3600),
            FakeReviewer(),
            store=self.store,
            cluster=Cluster(view, Keys()),
            buckets=self.storage.opener,
        )
        server = TestServer(app, host=LOOPBACK)
        await server.start_server()
        self.servers.append(server)
        self.url = str(server.make_url("")).rstrip("/")
        return self

    async def __aexit__(self, *exc: object) -> None:
        for server in reversed(self.servers):
            await server.close()

    async def api(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        headers = {"Authorization": "Bearer token-team-a"}
        async with (
            aiohttp.ClientSession(headers=headers) as s,
            s.request(method, self.url + path, json=body) as r,
        ):
            return r.status, await r.json(content_type=None)

    async def begin(self, artifact: str, data: bytes) -> tuple[int, Any]:
        """POST /v1/writes, and the upload when it is granted."""
        place = {"cloud": "aws", "region": "us-east-1", "source": "env"}
        body = {"organization": SERVICE_ORG, "artifact": artifact, "size": len(data)}
        status, began = await self.api("POST", "/v1/writes", {**body, "place": place})
        if status == 201:
            single = began["upload"]["single"]
            async with aiohttp.ClientSession() as s, s.put(single["url"], data=data) as r:
                assert r.status == 200, await r.text()
        return status, began

    async def commit(self, version: str) -> tuple[int, Any]:
        return await self.api("POST", f"/v1/writes/{version}/commit", {})

    async def read(self, artifact: str, version: str) -> tuple[int, Any]:
        path = f"/v1/organizations/{SERVICE_ORG}/artifacts/{artifact}/versions/{version}"
        return await self.api("GET", path)


async def nospace(directory: Path, quota: int) -> dict[str, str]:
    """Fill an etcd with a ``quota`` of bytes through begin and commit; what then."""
    etcd = Etcd(directory / "nospace", quota=quota).start()
    store = EtcdStore([etcd.url], timeout=10)
    seen: dict[str, str] = {}
    options = Options(limits=Limits(ops_per_second=0, bytes_per_second=0, entries=0, bytes=0))
    app = make_app([etcd.url], "team-nlp", options, store_timeout=10)
    try:
        async with (
            TestClient(TestServer(app, host=LOOPBACK)) as client,
            PlacementService(store) as service,
        ):
            status, kept = await service.begin("kept", b"committed before the alarm")
            assert status == 201, kept
            status, answer = await service.commit(kept["version"])
            assert status == 200, answer
            status, waiting = await service.begin("waiting", b"uploaded before the alarm")
            assert status == 201, waiting
            lease = await store.lease_grant(3600)
            r = await client.post(
                "/v1/collections/run-0042/dict/progress/set",
                json={"key": encode_key("before"), "value": base64.b64encode(b"1").decode()},
            )
            assert r.status == 200
            done = 0
            last: Pending | None = None
            while True:
                step = "begin"
                try:
                    p = await begin(store, lease, done)
                    step = "commit"
                    await commit(store, p)
                    last = p
                except StoreUnavailable as e:
                    seen[f"store, {step} (the service's {step} answers 503 with it)"] = str(e)
                    break
                done += 1
            seen["versions committed before the alarm"] = f"{done:,} in a {quota / MiB:g} MiB quota"
            seen["alarms"] = json.dumps(etcd.alarms())
            seen["dbSize at the alarm"] = f"{etcd.db_size():,} B"
            assert last is not None
            v = await store.get(version_key(ORG, last.artifact, last.version))
            seen["store: read a version (strong)"] = "works" if v is not None else "NOT FOUND"
            status, answer = await service.commit(waiting["version"])
            seen["service: POST /v1/writes/{version}/commit"] = f"{status} {json.dumps(answer)}"
            status, answer = await service.begin("after", b"x")
            seen["service: POST /v1/writes"] = f"{status} {json.dumps(answer)}"
            status, answer = await service.read("kept", kept["version"])
            seen["service: GET a version"] = f"{status} (location {answer.get('location')})"
            status, answer = await service.api(
                "GET", f"/v1/usage?organization={SERVICE_ORG}&window=24h"
            )
            seen["service: GET /v1/usage"] = f"{status}"
            listed = await store.range(b"/o41/placement/versions/", limit=10)
            seen["store: list versions"] = f"works ({len(listed)} of a page of 10)"
            counters = Usage(store, interval=3600)
            counters.add(ORG, "write", write_dims(0), versions=1, bytes=1)
            logging.getLogger("o41.webhook.usage").setLevel(logging.ERROR)
            await counters.flush()
            kept = len(counters._counts)
            seen["usage flush"] = f"refused; {kept} record kept in memory for the next flush"
            r = await client.post(
                "/v1/collections/run-0042/dict/progress/set",
                json={"key": encode_key("after"), "value": base64.b64encode(b"2").decode()},
            )
            seen["collections HTTP: dict set (strong)"] = f"{r.status} {await r.text()}"
            r = await client.post(
                "/v1/collections/run-0042/dict/progress/set",
                json={
                    "key": encode_key("after-eventual"),
                    "value": base64.b64encode(b"2").decode(),
                    "consistency": "eventual",
                },
            )
            seen["collections HTTP: dict set (eventual)"] = f"{r.status} {await r.text()}"
            r = await client.post(
                "/v1/collections/run-0042/dict/progress/get", json={"key": encode_key("before")}
            )
            seen["collections HTTP: dict get"] = f"{r.status} {await r.text()}"
            try:
                await store.delete(version_key(ORG, last.artifact, last.version))
                seen["store: delete a key"] = "works"
            except StoreUnavailable as e:
                seen["store: delete a key"] = f"refused: {e}"
            # the procedure of docs/capacity.md: free space, compact, defragment, disarm
            await store.delete(b"/o41/placement/versions/", prefix=True)
            etcd.compact_and_defrag()
            etcd.disarm()
            try:
                p = await begin(store, lease, 0)
                await commit(store, p)
                seen["after delete + compact + defrag + disarm"] = (
                    f"writes work again (dbSize {etcd.db_size():,} B, alarms "
                    f"{json.dumps(etcd.alarms())})"
                )
            except StoreUnavailable as e:
                seen["after delete + compact + defrag + disarm"] = f"still refused: {e}"
    finally:
        await store.close()
        etcd.stop()
    return seen


def plan(found: list[Measured]) -> None:
    per = {m.kind: m.per_record for m in found}
    version = per["committed version (begin + commit)"]
    usage = per["usage counter record (one hour, place)"]
    print("\nplan:")
    for quota in (2 * GiB, 8 * GiB):
        print(f"  versions in {quota / GiB:g} GiB: {quota / version:,.0f}")
    per_day = 1000 * 6 * 24
    print(f"  1,000 jobs, a checkpoint every 10 min: {per_day:,} versions/day")
    places = 50  # distinct dimension sets an hour, of each of begin, write and read
    counters = places * 3 * (24 + 1) * usage  # the hours' records and the day's
    daily = per_day * version + counters
    print(
        f"  growth: {daily / MiB:,.1f} MiB/day ({per_day * version / MiB:,.1f} versions + "
        f"{counters / MiB:,.2f} usage counters: {places} begin, write and read dimension "
        "sets an hour each)"
    )
    for quota in (2 * GiB, 8 * GiB):
        print(f"  days to {quota / GiB:g} GiB: {quota / daily:,.1f}")


def plan_ledger(found: list[Ledgered], records: list[Measured]) -> None:
    """Versions per GiB of etcd's quota, growth at the load of :func:`plan` with versions
    as a commit puts them, and the bucket's bytes per million versions."""
    print("\nversions per GiB of etcd quota (dbSize after compaction + defrag):")
    for kind in found:
        m = kind.etcd
        print(
            f"  {m.kind:64} {m.per_record:7,.0f} B {GiB / m.per_record:10,.0f} / GiB"
            f" ({0.8 * 2 * GiB / m.per_record:10,.0f} in 80 % of 2 GiB,"
            f" {0.8 * 8 * GiB / m.per_record:10,.0f} of 8 GiB)"
        )
    per = {m.etcd.kind: m.etcd.per_record for m in found}
    version = per.get("file version, now")
    usage = {m.kind: m.per_record for m in records}.get("usage counter record (one hour, place)")
    if version is not None and usage is not None:
        per_day = 1000 * 6 * 24
        counters = 50 * 3 * (24 + 1) * usage
        daily = per_day * version + counters
        print(
            f"  1,000 jobs, a file version every 10 min: {daily / MiB:,.1f} MiB/day "
            f"({per_day * version / MiB:,.1f} versions + {counters / MiB:,.2f} usage); "
            f"2 GiB in {2 * GiB / daily:,.1f} days, 8 GiB in {8 * GiB / daily:,.1f}"
        )
    print("\nin the buckets, a million versions:")
    for kind in found:
        if kind.record_object:
            m = kind.etcd
            total = kind.record_object + kind.manifest_object
            print(
                f"  {m.kind:60} {kind.record_object * 1e6 / GiB:6.2f} GiB of record objects"
                f" + {kind.manifest_object * 1e6 / GiB:6.2f} GiB of manifest objects"
                f" = {total * 1e6 / GiB:6.2f} GiB"
            )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=20_000, help="records of each kind")
    parser.add_argument(
        "--directories",
        type=int,
        default=2_000,
        help="directory versions of 100 files measured (of 1,000 files: a tenth); 0: none",
    )
    parser.add_argument("--quota-mib", type=float, default=16, help="the small etcd's quota")
    parser.add_argument("--skip-quota", action="store_true")
    args = parser.parse_args(argv)
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    with tempfile.TemporaryDirectory(prefix="o41-capacity-") as tmp:
        found, ledgered = asyncio.run(sizes(Path(tmp), args.records, args.directories))
        plan(found)
        if ledgered:
            plan_ledger(ledgered, found)
        if not args.skip_quota:
            print(f"\nNOSPACE (--quota-backend-bytes={int(args.quota_mib * MiB)}):")
            for what, answer in asyncio.run(nospace(Path(tmp), int(args.quota_mib * MiB))).items():
                print(f"  {what}: {answer}")


if __name__ == "__main__":
    main()
