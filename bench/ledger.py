"""The buckets' record of versions (issue 32): what the record PUT costs a commit, and how
fast etcd's index is rebuilt from the record objects; each next to its ceiling, same run.

Starts (all on 127.0.0.1) the S3 stand-in (versitygw; every call here goes to its
us-east-1 gateway's own port, as bench/placement.py), a 3-member etcd, and unless
``--no-process`` a control plane, the operator and the placement service as deployed
(``python -m o41.webhook``). Then:

1. **Commit latency.** Writers loop begin (``POST /v1/writes``, 1 KiB, some metadata),
   the upload to the signed URL, and the commit (``POST /v1/writes/{v}/commit``); only
   the commit is timed, p50/p99 over every commit of ``--rounds`` alternated rounds of
   ``--seconds`` each. Writers: ``1``, ``8`` (an artifact each) and ``8 one artifact``
   (the commits of one artifact take sequence numbers one at a time: a transaction that
   loses the artifact's compare goes round again, and PUTs the record again). Services:

   - ``deployed``: the placement service process (record PUT on, as merged);
   - ``app, PUT on`` / ``app, PUT off``: the same app (``make_app``) in a process of its
     own (this file with ``--serve``), on the same etcd and gateway, with the view and
     the credentials put in directly and any token taken; ``PUT off`` replaces the
     commit's ``put_record`` with a no-op: the commit before issue 32 (AFTER vs BEFORE).
     Both count the commit's calls of ``put_record``: ``tries/commit`` is transactions
     attempted per commit (1.00: no compare lost).

   Then the commit's own store calls, raw, against the same servers, with 1 and 8 in
   flight (threads for boto3, tasks for etcd), ``--seconds``/2 each a round: ``etcd
   get`` (the commit reads the pending write and the artifact's record: two), ``boto3
   HEAD`` (its stat of the object, ``ChecksumMode=ENABLED`` as ``S3Bucket.stat``),
   ``boto3 PUT record`` (the extra call: a real record, ``record_of(...).canonical()``,
   with Content-MD5 as ``S3Bucket.put``) and ``etcd txn`` (the commit's: 2 compares;
   delete the pending key, put the version, its index key and the artifact's record).
   The summary lines give the PUT's share of the commit (raw PUT p50 / commit p50) and
   what the commit gained (PUT on - PUT off). Every process shares the machine's cores:
   with few cores the 8-writer rows measure CPU contention as much as the calls (the
   load averages are printed).

2. **Rebuild rate.** ``--versions`` record objects of one organization (seq 1..N chained
   by ``previous`` in each of ``--artifacts`` artifacts, every 500th tagged ``best``, the
   last ``prod``, the newest's object in the bucket so its check passes) are PUT straight
   into a bucket, then ``o41.webhook.rebuild.rebuild_organization`` runs in this process
   on the app's parts (the view, the credentials, ``Buckets``, an ``EtcdStore``) against
   an etcd emptied of that organization before each of ``--rebuild-rounds`` rounds, its
   phases timed by wrapping the module's functions: ``list``, ``GET + parse``
   (``read_location``; ``read`` is both), ``doubtful``, the objects' ``checks``, ``core
   rebuild``, etcd's ``current index``, ``write`` (``apply``: a transaction per version,
   one at a time). Also: the read phase again with asyncio's default executor raised to
   16 threads (``to_thread``'s default is min(32, cores + 4) workers; the rebuild keeps
   16 calls in flight). The ceilings: boto3 listing and GETting the same objects with 16
   threads (``max_pool_connections`` 16), and etcd puts of the same keys and values the
   rebuild writes (the version and its index key, in one transaction with no compare:
   apply's round trips without its guard), one at a time and 16 in flight.

    .venv/bin/python bench/ledger.py [--seconds 1.5] [--rounds 3] [--versions 5000]
    .venv/bin/python bench/ledger.py --no-process      # no control plane: the app only
    .venv/bin/python bench/ledger.py --skip-commits    # the rebuild only
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import hashlib
import json
import os
import secrets
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "src")]

import aiohttp  # noqa: E402
from aiohttp import web  # noqa: E402

from o41.core.ledger import VersionRecord, version_fields  # noqa: E402
from o41.core.versions import index_suffix  # noqa: E402
from o41.kube.location_record import LocationRecord  # noqa: E402
from o41.kube.locations import Location, read_location  # noqa: E402
from o41.state import Compare, Delete, Put  # noqa: E402
from o41.state.etcd import EtcdStore  # noqa: E402
from o41.webhook.cluster.view import Cluster, View, organization_source  # noqa: E402
from o41.webhook.identity import auth  # noqa: E402
from o41.webhook.ledger import record_of  # noqa: E402
from o41.webhook.records import (  # noqa: E402
    PREFIX,
    ArtifactRecord,
    Pending,
    Version,
    artifact_key,
    index_prefix,
    pending_key,
    version_key,
)
from testbed.etcd import EtcdCluster  # noqa: E402
from testbed.kube import ControlPlane, apply, bin_dir, kubectl  # noqa: E402
from testbed.kube import service_account_token as sa_token  # noqa: E402
from testbed.process import LOOPBACK, Server, free_port, port_open  # noqa: E402
from testbed.product import (  # noqa: E402
    OperatorProcess,
    PlacementProcess,
    install_crds,
    store_secrets,
)
from testbed.stores import start_s3  # noqa: E402

ORG = "bench"  # the commits' organization (namespace "bench")
REBUILT = "rebuilt"  # the rebuild's organization: its own keys in etcd, its own bucket
COMMIT_BUCKET = "o41-bench-ledger"
REBUILD_BUCKET = "o41-bench-rebuild"
SIZE = 1024  # the versions' bytes
PARALLEL = 16  # the rebuild's calls in flight (o41.webhook.buckets.PARALLEL_CHECKS)
METADATA = {"step": 12000, "epoch": 3, "loss": 0.4171, "lr": 3e-4, "run": "bench-ledger"}
PLACE = {"cloud": "aws", "region": "us-east-1", "source": "env"}
DEPLOYED = "deployed service (PUT on)"


def quantile(values: list[float], q: int) -> float:
    """The ``q``th percentile in ms (nan with fewer than two values)."""
    if len(values) < 2:
        return float("nan")
    return statistics.quantiles(values, n=100)[q - 1] * 1000


def new_version(ms: int) -> str:
    return f"{ms:012x}-{secrets.token_hex(8)}"


def location_of(name: str, organization: str, bucket: str, endpoint: str) -> Location:
    """A ready S3 Location on ``bucket`` at ``endpoint``, as the operator would record it."""
    created = "2026-01-01T00:00:00Z"
    obj = {
        "metadata": {"name": name, "uid": f"uid-{name}", "creationTimestamp": created},
        "spec": {
            "organization": organization,
            "cloud": "aws",
            "region": "us-east-1",
            "bucket": bucket,
            "backend": {"s3": {"endpoint": endpoint}},
        },
    }
    return read_location(obj, LocationRecord(f"uid-{name}", name, ready=True, ready_since=created))


class Keys:
    """The Location's credentials, given (the service reads them from a Secret)."""

    def __init__(self, keys: Mapping[str, str]) -> None:
        self.keys = keys

    async def credentials(self, location: Location) -> Mapping[str, str] | None:
        return self.keys


class AnyToken:
    async def review(self, token: str) -> auth.Caller | None:
        return auth.Caller(ORG, "default")


def boto(endpoint: str, keys: Mapping[str, str], pool: int = 16) -> Any:
    import boto3
    from botocore.config import Config

    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id=keys["accessKeyId"],
        aws_secret_access_key=keys["secretAccessKey"],
        config=Config(
            signature_version="s3v4",
            s3={"addressing_style": "path"},
            max_pool_connections=pool,
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
        ),
    )


# ------------------------------------------------------------ the app, in a process of its own


def serve(spec: dict[str, Any]) -> None:
    """``--serve``: the service's app on ``spec["port"]``, the record PUT on or off."""
    from o41.webhook.app import Settings, make_app
    from o41.webhook.writes import commit

    calls = 0
    real = getattr(commit, "put_record")  # noqa: B009 - the module does not export it

    async def counted(*args: Any) -> None:
        nonlocal calls
        calls += 1
        if spec["put"]:
            await real(*args)

    # commit.py imported the name: patching o41.webhook.ledger.put_record would not reach it
    setattr(commit, "put_record", counted)  # noqa: B010
    view = View()
    view.put_location(location_of("east", ORG, spec["bucket"], spec["gateway"]))
    view.put_organization(
        organization_source({"metadata": {"name": ORG}, "spec": {"namespaces": [ORG]}})
    )
    view.synced.set()
    app = make_app(
        Settings(etcd_endpoints=spec["etcd"], usage_interval=3600),
        AnyToken(),
        cluster=Cluster(view, Keys(spec["keys"])),
    )

    async def puts(request: web.Request) -> web.Response:
        return web.json_response({"puts": calls})

    app.router.add_get("/bench/puts", puts)
    web.run_app(app, host=LOOPBACK, port=spec["port"], access_log=None, print=None)


# ---------------------------------------------------------------------------------- commits


@dataclass
class Commits:
    label: str
    writers: str
    latencies: list[float] = field(default_factory=list)
    rounds: list[float] = field(default_factory=list)  # each round's p50, ms
    errors: int = 0
    first_error: str = ""
    seconds: float = 0.0
    puts: int = 0  # put_record calls (the app only)
    counted: bool = False


@dataclass
class Target:
    label: str
    url: str
    token: str
    counts: bool  # whether GET /bench/puts answers


async def commit_load(
    target: Target, writers: int, one_artifact: bool, seconds: float, into: Commits
) -> None:
    """``writers`` loops of begin, upload, commit for ``seconds``; the commits timed."""
    headers = {"Authorization": f"Bearer {target.token}"}
    data = os.urandom(SIZE)
    md5 = hashlib.md5(data).hexdigest()
    latencies: list[float] = []
    tag = f"w{writers}{'o' if one_artifact else ''}-{secrets.token_hex(3)}"
    connector = aiohttp.TCPConnector(limit=2 * writers + 2)
    async with aiohttp.ClientSession(connector=connector, headers=headers) as session:
        before = await puts_of(session, target)
        stop = time.monotonic() + seconds

        async def cycle(artifact: str, step: int) -> float:
            """One begin, upload and commit: the commit's seconds."""
            body = {
                "organization": ORG,
                "artifact": artifact,
                "size": SIZE,
                "place": PLACE,
                "metadata": {**METADATA, "step": step},
            }
            async with session.post(f"{target.url}/v1/writes", json=body) as r:
                began = await r.json(content_type=None)
                if r.status >= 300:
                    raise RuntimeError(f"begin {r.status} {str(began)[:300]}")
            single = began["upload"]["single"]
            async with session.request(
                single["method"],
                single["url"],
                data=data,
                headers=single["headers"],
                skip_auto_headers=["Content-Type"],
            ) as r:
                if r.status >= 300:
                    raise RuntimeError(f"upload {r.status} {(await r.text())[:300]}")
            url = f"{target.url}/v1/writes/{began['version']}/commit"
            t = time.perf_counter()
            async with session.post(url, json={"etags": [], "md5": md5}) as r:
                answer = await r.read()
                if r.status >= 300:
                    raise RuntimeError(f"commit {r.status} {answer[:300]!r}")
            return time.perf_counter() - t

        async def one(w: int) -> None:
            artifact = f"ckpt-{tag}" if one_artifact else f"ckpt-{tag}-{w}"
            step = 0
            while time.monotonic() < stop:
                step += 1
                try:
                    latencies.append(await cycle(artifact, step))
                except (RuntimeError, aiohttp.ClientError, KeyError) as e:
                    into.errors += 1
                    into.first_error = into.first_error or str(e)
                    await asyncio.sleep(0.05)

        began_at = time.monotonic()
        await asyncio.gather(*(one(w) for w in range(writers)))
        into.seconds += time.monotonic() - began_at
        after = await puts_of(session, target)
    into.latencies += latencies
    into.rounds.append(quantile(latencies, 50))
    if before is not None and after is not None:
        into.puts += after - before
        into.counted = True


async def puts_of(session: aiohttp.ClientSession, target: Target) -> int | None:
    if not target.counts:
        return None
    async with session.get(f"{target.url}/bench/puts") as r:
        return int((await r.json())["puts"])


# ------------------------------------------------------------------ the commit's calls, raw


@dataclass
class Raw:
    label: str
    writers: int
    latencies: list[float] = field(default_factory=list)
    rounds: list[float] = field(default_factory=list)


def threads_for(seconds: float, writers: int, call: Callable[[int, int], None], into: Raw) -> None:
    """``writers`` threads calling ``call(writer, i)`` for ``seconds``, each call timed."""
    stop = time.monotonic() + seconds
    found: list[float] = []
    lock = threading.Lock()

    def loop(w: int) -> None:
        mine, i = [], 0
        while time.monotonic() < stop:
            t = time.perf_counter()
            call(w, i)
            mine.append(time.perf_counter() - t)
            i += 1
        with lock:
            found.extend(mine)

    with ThreadPoolExecutor(writers) as pool:
        list(pool.map(loop, range(writers)))
    into.latencies += found
    into.rounds.append(quantile(found, 50))


async def tasks_for(
    seconds: float,
    writers: int,
    call: Callable[[int, int], Awaitable[Callable[[], Awaitable[Any]]]],
    into: Raw,
) -> None:
    """``writers`` tasks: ``call(writer, i)`` prepares (untimed) and returns the timed call."""
    stop = time.monotonic() + seconds
    found: list[float] = []

    async def loop(w: int) -> None:
        i = 0
        while time.monotonic() < stop:
            timed = await call(w, i)
            t = time.perf_counter()
            await timed()
            found.append(time.perf_counter() - t)
            i += 1

    await asyncio.gather(*(loop(w) for w in range(writers)))
    into.latencies += found
    into.rounds.append(quantile(found, 50))


def sample_version(artifact: str, version: str, seq: int, previous: str | None) -> Version:
    """A committed 1 KiB version as the commit records it (its metadata, its place)."""
    return Version(
        organization=ORG,
        artifact=artifact,
        version=version,
        location="east",
        key=f"{artifact}/{version}",
        size=SIZE,
        md5=hashlib.md5(b"x").hexdigest(),
        rule="region",
        cloud="aws",
        region="us-east-1",
        source="env",
        committed=time.time(),
        metadata=dict(METADATA),
        seq=seq,
        previous=previous,
        by=ORG,
    )


class RawCalls:
    """The commit's store calls, straight to the same etcd and gateway."""

    def __init__(self, store: EtcdStore, s3: Any) -> None:
        self.store, self.s3 = store, s3
        self.record = record_of(sample_version("ckpt", new_version(1_700_000_000_000), 7, None))
        self.record_bytes = self.record.canonical()
        self.md5 = base64.b64encode(hashlib.md5(self.record_bytes).digest()).decode()
        self.heads = [f"raw/head-{w}" for w in range(8)]
        for key in self.heads:
            s3.put_object(Bucket=COMMIT_BUCKET, Key=key, Body=os.urandom(SIZE))
        self.artifact_mod: dict[tuple[int, int], int] = {}  # (run, writer): the artifact's mod
        self.run = 0

    def head(self, w: int, i: int) -> None:
        self.s3.head_object(Bucket=COMMIT_BUCKET, Key=self.heads[w], ChecksumMode="ENABLED")

    def put(self, w: int, i: int) -> None:
        key = f"{self.record.object_key}-{self.run}-{w}-{i}"
        self.s3.put_object(
            Bucket=COMMIT_BUCKET,
            Key=key,
            Body=self.record_bytes,
            ContentMD5=self.md5,
            ContentType="application/octet-stream",
        )

    async def get(self, w: int, i: int) -> Callable[[], Awaitable[Any]]:
        key = artifact_key(ORG, "raw-get")
        if i == 0 and w == 0:
            await self.store.put(key, ArtifactRecord("raw-get", "v", time.time(), 3).dump())
        return lambda: self.store.get(key)

    async def txn(self, w: int, i: int) -> Callable[[], Awaitable[Any]]:
        """The commit's transaction (its pending key put first, untimed)."""
        artifact = f"raw-txn-{self.run}-{w}"
        version = new_version(int(time.time() * 1000))
        pending = Pending(
            ORG, artifact, version, ORG, "east", f"{artifact}/{version}", "region", "aws",
            "us-east-1", "env", SIZE, None, None, 1, time.time(), metadata=dict(METADATA),
        )  # fmt: skip
        pkey = pending_key(version)
        pending_mod = await self.store.put(pkey, pending.dump())
        akey = artifact_key(ORG, artifact)
        mod = self.artifact_mod.get((self.run, w))
        guard = (
            Compare(akey, "version", "==", 0) if mod is None else Compare(akey, "mod", "==", mod)
        )
        record = sample_version(artifact, version, i + 1, None)
        listed = replace(record, part_size=None, crc32=None, previous=None, by=None, tag=None)
        made: list[Delete | Put] = [
            Delete(pkey),
            Put(version_key(ORG, artifact, version), record.dump()),
            Put(index_prefix(ORG, artifact) + index_suffix(i + 1, version).encode(), listed.dump()),
            Put(akey, ArtifactRecord(artifact, version, record.committed, i + 1).dump()),
        ]

        async def timed() -> None:
            result = await self.store.txn([Compare(pkey, "mod", "==", pending_mod), guard], made)
            if not result.succeeded:
                raise RuntimeError("the raw transaction lost its compare")
            self.artifact_mod[(self.run, w)] = result.revision

        return timed


# ---------------------------------------------------------------------------------- rebuild


def rebuild_records(versions: int, artifacts: int) -> list[VersionRecord]:
    """``versions`` records of REBUILT, round-robin over ``artifacts`` artifacts, each
    artifact's chained by ``previous``; every 500th tagged ``best``, the last ``prod``."""
    out: list[VersionRecord] = []
    previous: dict[str, str | None] = {}
    seq: dict[str, int] = {}
    start = int(time.time() * 1000) - versions * 60_000
    md5 = hashlib.md5(b"\0" * SIZE).hexdigest()
    for i in range(versions):
        artifact = f"model-{i % artifacts}"
        seq[artifact] = seq.get(artifact, 0) + 1
        version = new_version(start + i * 60_000)
        v = replace(
            sample_version(artifact, version, seq[artifact], previous.get(artifact)),
            organization=REBUILT,
            location="rebuilt-east",
            md5=md5,
            committed=(start + i * 60_000) / 1000,
            metadata={**METADATA, "step": i * 100},
            tag="prod" if i == versions - 1 else ("best" if i % 500 == 499 else None),
        )
        out.append(record_of(v))
        previous[artifact] = version
    return out


@dataclass
class Phases:
    """One rebuild's phases, seconds."""

    values: dict[str, float] = field(default_factory=dict)

    def add(self, name: str, seconds: float) -> None:
        self.values[name] = self.values.get(name, 0.0) + seconds


class Instrumented:
    """o41.webhook.rebuild's steps, timed where rebuild_organization calls them."""

    def __init__(self) -> None:
        import o41.webhook.rebuild as module

        self.module = module
        self.saved: dict[str, Any] = {}
        self.marks: dict[str, float] = {}
        self.checks: list[tuple[float, float]] = []

    def __enter__(self) -> Instrumented:
        m = self.module
        for name in ("read_location", "current_index", "apply", "objects_check_out"):
            self.saved[name] = getattr(m, name)
            setattr(m, name, self._async(name, self.saved[name]))
        for name in ("doubtful", "rebuild"):
            self.saved[name] = getattr(m, name)
            setattr(m, name, self._sync(name, self.saved[name]))
        return self

    def __exit__(self, *exc: object) -> None:
        for name, fn in self.saved.items():
            setattr(self.module, name, fn)

    def _async(self, name: str, fn: Any) -> Any:
        async def timed(*args: Any, **kw: Any) -> Any:
            t = time.perf_counter()
            try:
                return await fn(*args, **kw)
            finally:
                end = time.perf_counter()
                if name == "objects_check_out":
                    self.checks.append((t, end))
                else:
                    self.marks[f"{name}:start"] = t
                    self.marks[f"{name}:end"] = end

        return timed

    def _sync(self, name: str, fn: Any) -> Any:
        def timed(*args: Any, **kw: Any) -> Any:
            t = time.perf_counter()
            try:
                return fn(*args, **kw)
            finally:
                self.marks[f"{name}:start"] = t
                self.marks[f"{name}:end"] = time.perf_counter()

        return timed

    def say(self, line: str) -> None:
        if " record objects, " in line:  # read_location's, once the prefix is listed
            self.marks["listed"] = time.perf_counter()

    def phases(self, total: float) -> Phases:
        k = self.marks
        p = Phases()
        p.add("list", k["listed"] - k["read_location:start"])
        p.add("GET + parse", k["read_location:end"] - k["listed"])
        p.add("doubtful", k["doubtful:end"] - k["doubtful:start"])
        if self.checks:
            p.add("checks", max(e for _, e in self.checks) - min(s for s, _ in self.checks))
        p.add("core rebuild", k["rebuild:end"] - k["rebuild:start"])
        p.add("current index", k["current_index:end"] - k["current_index:start"])
        p.add("write", k["apply:end"] - k["apply:start"])
        p.add("total", total)
        return p


class Rebuild:
    """The rebuild of REBUILT from its bucket into etcd, and its ceilings."""

    def __init__(
        self, store: EtcdStore, gateway: str, keys: Mapping[str, str], records: list[VersionRecord]
    ) -> None:
        from o41.webhook.buckets import BUCKETS, Buckets
        from o41.webhook.cluster.view import SECRETS, VIEW
        from o41.webhook.http.store import STORE

        self.store, self.records = store, records
        self.s3 = boto(gateway, keys, pool=PARALLEL)
        view = View()
        self.location = location_of("rebuilt-east", REBUILT, REBUILD_BUCKET, gateway)
        view.put_location(self.location)
        view.put_organization(
            organization_source({"metadata": {"name": REBUILT}, "spec": {"namespaces": ["x"]}})
        )
        view.synced.set()
        app = web.Application()
        app[VIEW] = view
        app[SECRETS] = Keys(keys)
        app[BUCKETS] = Buckets()
        app[STORE] = store
        self.app = app
        self.results: dict[str, list[float]] = {}
        self.phases: list[Phases] = []
        self.report = ""

    def seed(self) -> float:
        """PUT every record object, and each artifact's newest version's object; seconds."""
        self.s3.create_bucket(Bucket=REBUILD_BUCKET)
        newest: dict[str, VersionRecord] = {}
        for r in self.records:
            newest[r.artifact] = r
        t = time.perf_counter()
        with ThreadPoolExecutor(PARALLEL) as pool:
            list(
                pool.map(
                    lambda r: self.s3.put_object(
                        Bucket=REBUILD_BUCKET, Key=r.object_key, Body=r.canonical()
                    ),
                    self.records,
                )
            )
        seconds = time.perf_counter() - t
        for r in newest.values():
            self.s3.put_object(Bucket=REBUILD_BUCKET, Key=r.key, Body=b"\0" * SIZE)
        return seconds

    async def warm(self) -> None:
        """The service's S3 client made once (botocore parses S3's model on the first)."""
        from o41.webhook.buckets import bucket_for

        opened = await bucket_for(self.app, self.location)
        await opened.call(self.location.name, lambda: opened.bucket.list_under(".o41/none/"))

    async def wipe(self) -> None:
        for kind in ("versions", "index", "artifacts", "tags"):
            await self.store.delete(PREFIX + f"{kind}/{REBUILT}/".encode(), prefix=True)

    def note(self, name: str, seconds: float) -> None:
        self.results.setdefault(name, []).append(seconds)

    async def rebuild(self) -> None:
        from o41.webhook.rebuild import rebuild_organization, render

        await self.wipe()
        with Instrumented() as timing:
            t = time.perf_counter()
            report = await rebuild_organization(self.app, REBUILT, dry_run=False, say=timing.say)
            total = time.perf_counter() - t
        if report.versions_added != len(self.records):
            raise RuntimeError(f"the rebuild wrote {report.versions_added} versions: {report}")
        self.report = "\n".join(render(report, dry_run=False))
        self.phases.append(timing.phases(total))

    async def read_wider(self) -> None:
        """The read phase alone with asyncio's default executor at 16 threads."""
        from o41.webhook.rebuild import Found, read_location

        loop = asyncio.get_running_loop()
        wide = ThreadPoolExecutor(PARALLEL)
        loop.set_default_executor(wide)
        try:
            found = Found()
            t = time.perf_counter()
            await read_location(self.app, REBUILT, self.location, found, lambda _: None)
            self.note("read, 16 executor threads", time.perf_counter() - t)
            assert len(found.records) == len(self.records), found.unreadable[:3]
        finally:
            loop.set_default_executor(ThreadPoolExecutor())  # the default's size again
            wide.shutdown(wait=False)

    def raw_read(self) -> None:
        t = time.perf_counter()
        keys = []
        for page in self.s3.get_paginator("list_objects_v2").paginate(
            Bucket=REBUILD_BUCKET, Prefix=f".o41/versions/{REBUILT}/"
        ):
            keys += [o["Key"] for o in page.get("Contents", [])]
        listed = time.perf_counter()
        self.note("ceiling: boto3 list", listed - t)

        def get(key: str) -> bytes:
            body: bytes = self.s3.get_object(Bucket=REBUILD_BUCKET, Key=key)["Body"].read()
            return body

        with ThreadPoolExecutor(PARALLEL) as pool:
            got = list(pool.map(get, keys))
        assert len(got) == len(self.records)
        self.note("ceiling: boto3 GETs", time.perf_counter() - listed)
        self.note("ceiling: boto3 read", time.perf_counter() - t)

    def writes(self) -> list[list[Put]]:
        """What the rebuild's ``apply`` puts for each version: its record, its index key."""
        out = []
        for r in self.records:
            fields = version_fields(r)
            listed = {**fields, "part_size": None, "crc32": None, "previous": None}
            listed.update(by=None, tag=None)
            index = index_prefix(REBUILT, r.artifact) + index_suffix(r.seq, r.version).encode()
            out.append(
                [
                    Put(version_key(REBUILT, r.artifact, r.version), Version(**fields).dump()),
                    Put(index, Version(**listed).dump()),
                ]
            )
        return out

    async def raw_puts(self, parallel: int) -> None:
        """Each version's two puts in one transaction (no compare: apply's round trips),
        ``parallel`` transactions in flight."""
        await self.wipe()
        writes = self.writes()
        gate = asyncio.Semaphore(parallel)

        async def one(puts: list[Put]) -> None:
            async with gate:
                await self.store.txn([], puts)

        t = time.perf_counter()
        await asyncio.gather(*(one(puts) for puts in writes))
        name = "one at a time" if parallel == 1 else f"{parallel} in flight"
        self.note(f"ceiling: etcd puts, {name}", time.perf_counter() - t)


# ------------------------------------------------------------------------------------- main


def commit_table(commits: list[Commits], raw: list[Raw], record_size: int) -> list[str]:
    lines = [
        f"{'':<44} {'commits':>7} {'p50 ms':>7} {'p99 ms':>7} {'tries/commit':>12} "
        f"{'errors':>6}  round p50s"
    ]
    for c in commits:
        tries = f"{c.puts / len(c.latencies):12.2f}" if c.counted and c.latencies else f"{'':>12}"
        lines.append(
            f"{c.label + ', ' + c.writers:<44} {len(c.latencies):7d} "
            f"{quantile(c.latencies, 50):7.2f} {quantile(c.latencies, 99):7.2f} {tries} "
            f"{c.errors:6d}  {' '.join(f'{x:.1f}' for x in c.rounds)}"
            + (f"  first error: {c.first_error[:200]}" if c.first_error else "")
        )
    lines.append("the commit's own store calls, raw, same servers:")
    for r in raw:
        label = r.label.replace("RECORD", f"{record_size} B")
        lines.append(
            f"{label + f', {r.writers} in flight':<44} {len(r.latencies):7d} "
            f"{quantile(r.latencies, 50):7.2f} {quantile(r.latencies, 99):7.2f} {'':>12} "
            f"{'':>6}  {' '.join(f'{x:.1f}' for x in r.rounds)}"
        )
    return lines


def shares(commits: list[Commits], raw: list[Raw]) -> list[str]:
    def p50(items: list[Any], label: str, writers: str | int) -> float:
        for x in items:
            if x.label == label and str(x.writers).split()[0] == str(writers):
                return quantile(x.latencies, 50)
        return float("nan")

    lines = []
    for n, writers in ((1, "1 writer"), (8, "8 writers")):
        raw_put = p50(raw, "boto3 PUT record (RECORD)", n)
        parts = {
            "get": p50(raw, "etcd get", n),
            "head": p50(raw, "boto3 HEAD", n),
            "put": raw_put,
            "txn": p50(raw, "etcd txn (the commit's)", n),
        }
        calls = 2 * parts["get"] + parts["head"] + parts["put"] + parts["txn"]
        on = p50(commits, "app, PUT on (AFTER)", writers.split()[0])
        off = p50(commits, "app, PUT off (BEFORE)", writers.split()[0])
        deployed = p50(commits, DEPLOYED, writers.split()[0])
        of_deployed = (
            f", {raw_put / deployed:.0%} of the deployed service's ({deployed:.2f} ms)"
            if deployed == deployed  # not nan: the deployed service ran
            else ""
        )
        lines.append(
            f"{writers}: raw PUT p50 {raw_put:.2f} ms = {raw_put / on:.0%} of the app's commit "
            f"p50 ({on:.2f} ms, PUT on){of_deployed}; PUT on - off = {on - off:+.2f} ms "
            f"({(on - off) / off:+.0%} over {off:.2f} ms); the commit's raw calls (2 etcd "
            f"gets + HEAD + PUT + txn) sum to {calls:.2f} ms, the PUT {raw_put / calls:.0%}"
        )
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=1.5, help="each measure of a round")
    parser.add_argument("--rounds", type=int, default=3, help="alternated rounds")
    parser.add_argument("--versions", type=int, default=5000, help="record objects to rebuild")
    parser.add_argument("--artifacts", type=int, default=1, help="the rebuilt versions' artifacts")
    parser.add_argument("--rebuild-rounds", type=int, default=2)
    parser.add_argument("--no-process", action="store_true", help="no control plane")
    parser.add_argument("--skip-commits", action="store_true")
    parser.add_argument("--skip-rebuild", action="store_true")
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(json.loads(args.serve))
        return 0
    began = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="o41-bench-ledger-"))
    bins = bin_dir()
    started: list[Server] = []
    plane: ControlPlane | None = None
    s3 = None
    etcd: EtcdCluster | None = None
    try:
        s3 = start_s3(work / "s3")
        gateway = s3.gateway("us-east-1")  # its own port: the router is Python
        keys = {"accessKeyId": s3.access_key, "secretAccessKey": s3.secret_key}
        etcd = EtcdCluster(bins / "etcd", work / "etcd").start()
        targets: list[Target] = []
        if not args.skip_commits and not args.no_process:
            plane = ControlPlane(work / "kube", bins).start()
            kc = plane.kubeconfig
            install_crds(kc)
            store_secrets(kc, s3)
            operator = OperatorProcess(kc, work / "operator", check_interval=60).start()
            assert operator.server is not None
            started.append(operator.server)
            org = {
                "apiVersion": "artifacts.o41.io/v1alpha1",
                "kind": "Organization",
                "metadata": {"name": ORG},
                "spec": {"namespaces": [ORG]},
            }
            location = {
                "apiVersion": "artifacts.o41.io/v1alpha1",
                "kind": "Location",
                "metadata": {"name": "east"},
                "spec": {
                    "organization": ORG,
                    "cloud": "aws",
                    "region": "us-east-1",
                    "backend": {"s3": {"endpoint": gateway}},
                    "credentials": {"secretName": "creds-s3"},
                },
            }
            apply(kc, org, location)
            kubectl(
                kc,
                "wait",
                "--for=jsonpath={.status.takesWrites}=true",
                f"organization/{ORG}",
                "--timeout=60s",
            )
            service = PlacementProcess(kc, etcd.endpoints, work / "placement").start()
            assert service.server is not None
            started.append(service.server)
            targets.append(Target(DEPLOYED, service.url, sa_token(kc, ORG), False))
        s3_client = boto(gateway, keys, pool=16)
        s3_client.create_bucket(Bucket=COMMIT_BUCKET)
        if not args.skip_commits:
            for put, label in ((True, "app, PUT on (AFTER)"), (False, "app, PUT off (BEFORE)")):
                port = free_port()
                spec = {
                    "port": port,
                    "put": put,
                    "bucket": COMMIT_BUCKET,
                    "gateway": gateway,
                    "keys": keys,
                    "etcd": etcd.endpoints,
                }
                name = "app-on" if put else "app-off"
                app_server = Server(
                    name,
                    [sys.executable, __file__, "--serve", json.dumps(spec)],
                    work / f"{name}.log",
                    env={"AWS_EC2_METADATA_DISABLED": "true", "NO_PROXY": "*"},
                )
                app_server.start()
                started.append(app_server)
                app_server.wait_ready(lambda port=port: port_open(port))  # type: ignore[misc]
                targets.append(Target(label, f"http://{LOOPBACK}:{port}", "any", True))
        print(
            f"{os.cpu_count()} cores; started in {time.monotonic() - began:.0f} s; load average "
            f"before {os.getloadavg()}",
            flush=True,
        )
        commits: list[Commits] = []
        raw: list[Raw] = []
        record_size = 0
        if not args.skip_commits:
            store = EtcdStore(etcd.endpoints, timeout=30)
            calls = RawCalls(store, s3_client)
            record_size = len(calls.record_bytes)
            modes = ["1 writer", "8 writers", "8 one artifact"]
            for t in targets:
                for writers in modes:
                    if t.label == DEPLOYED and "one" in writers:
                        continue  # the pair below answers the contention question
                    commits.append(Commits(t.label, writers))
            raw = [
                Raw(label, n)
                for label in (
                    "etcd get",
                    "boto3 HEAD",
                    "boto3 PUT record (RECORD)",
                    "etcd txn (the commit's)",
                )
                for n in (1, 8)
            ]

            async def commit_rounds() -> None:
                for t in targets:  # warm: connections, token caches, the gateway
                    await commit_load(t, 2, False, 0.5, Commits("warm", "2"))
                for r in range(args.rounds):
                    order = commits if r % 2 == 0 else list(reversed(commits))
                    for c in order:
                        target = next(t for t in targets if t.label == c.label)
                        n = int(c.writers.split()[0])
                        await commit_load(target, n, "one" in c.writers, args.seconds, c)
                        print(
                            f"  round {r + 1} {c.label}, {c.writers}: p50 {c.rounds[-1]:.2f} ms",
                            flush=True,
                        )
                    calls.run = r
                    for x in raw if r % 2 == 0 else list(reversed(raw)):
                        half = args.seconds / 2
                        if x.label == "boto3 HEAD":
                            await asyncio.to_thread(threads_for, half, x.writers, calls.head, x)
                        elif x.label.startswith("boto3 PUT"):
                            await asyncio.to_thread(threads_for, half, x.writers, calls.put, x)
                        elif x.label == "etcd get":
                            await tasks_for(half, x.writers, calls.get, x)
                        else:
                            await tasks_for(half, x.writers, calls.txn, x)
                        print(
                            f"  round {r + 1} raw {x.label}, {x.writers}: "
                            f"p50 {x.rounds[-1]:.2f} ms",
                            flush=True,
                        )
                await store.close()

            asyncio.run(commit_rounds())

        rebuild_lines: list[str] = []
        if not args.skip_rebuild:
            rebuild_lines = asyncio.run(rebuild_rounds(args, etcd.endpoints, gateway, keys))
        print(f"load average after {os.getloadavg()}; {time.monotonic() - began:.0f} s in all")
        print()
        if commits:
            print(
                f"commit of a {SIZE} B version (POST /v1/writes/{{v}}/commit after begin + "
                f"upload), {args.rounds} alternated rounds of {args.seconds:g} s; p50/p99 over "
                "every commit of the rounds; round p50s in ms"
            )
            print(
                "AFTER = the app as merged (record PUT before the transaction); BEFORE = the "
                "same app with the commit's put_record a no-op"
            )
            for line in commit_table(commits, raw, record_size):
                print(line)
            for line in shares(commits, raw):
                print(line)
            print()
        for line in rebuild_lines:
            print(line)
    finally:
        for server in reversed(started):
            server.stop()
        if etcd is not None:
            etcd.stop()
        if s3 is not None:
            s3.stop()
        if plane is not None:
            plane.stop()
        shutil.rmtree(work, ignore_errors=True)
    return 0


async def rebuild_rounds(
    args: argparse.Namespace,
    endpoints: list[str],
    gateway: str,
    keys: Mapping[str, str],
) -> list[str]:
    records = rebuild_records(args.versions, args.artifacts)
    store = EtcdStore(endpoints, timeout=60)
    try:
        bench = Rebuild(store, gateway, keys, records)
        seeded = await asyncio.to_thread(bench.seed)
        size = statistics.mean(len(r.canonical()) for r in records)
        print(
            f"  seeded {len(records)} record objects ({size:.0f} B each) in {seeded:.1f} s "
            f"({len(records) / seeded:.0f}/s, {PARALLEL} threads)",
            flush=True,
        )
        await bench.warm()
        steps: list[tuple[str, Callable[[], Awaitable[None]]]] = [
            ("rebuild", bench.rebuild),
            ("read, 16 executor threads", bench.read_wider),
            ("ceiling: boto3 read", lambda: asyncio.to_thread(bench.raw_read)),
            ("ceiling: etcd puts, one at a time", lambda: bench.raw_puts(1)),
            (f"ceiling: etcd puts, {PARALLEL} in flight", lambda: bench.raw_puts(PARALLEL)),
        ]
        for r in range(args.rebuild_rounds):
            for name, step in steps if r % 2 == 0 else list(reversed(steps)):
                t = time.perf_counter()
                await step()
                print(f"  round {r + 1} {name}: {time.perf_counter() - t:.1f} s", flush=True)
        await bench.wipe()
    finally:
        await store.close()
    n = len(records)
    workers = min(32, (os.cpu_count() or 1) + 4)
    lines = [
        f"rebuild of {n} versions of one organization ({args.artifacts} artifact(s), "
        f"{size:.0f} B record objects) from a versitygw bucket into an emptied 3-member etcd, "
        f"{args.rebuild_rounds} alternated rounds, medians; versions/s = {n} / seconds",
        f"{'':<44} {'seconds':>8} {'versions/s':>10}",
    ]
    names = list(bench.phases[0].values)
    for name in names:
        m = statistics.median(p.values.get(name, 0.0) for p in bench.phases)
        label = {"write": "write (apply, a txn per version)"}.get(name, name)
        lines.append(f"{'rebuild: ' + label:<44} {m:8.3f} {n / m if m else 0:10.0f}")
    read = statistics.median(p.values["list"] + p.values["GET + parse"] for p in bench.phases)
    lines.append(f"{'rebuild: read (list + GET + parse)':<44} {read:8.3f} {n / read:10.0f}")
    for name, times in bench.results.items():
        m = statistics.median(times)
        lines.append(f"{name:<44} {m:8.3f} {n / m:10.0f}")
    lines.append(
        f"(asyncio.to_thread's default executor here: {workers} threads; the rebuild keeps "
        f"{PARALLEL} calls in flight; the service's S3 client pool: botocore's default, 10)"
    )
    lines.append("the rebuild's report (last round):")
    lines += [f"  {line}" for line in bench.report.splitlines()]
    return lines


if __name__ == "__main__":
    sys.exit(main())
