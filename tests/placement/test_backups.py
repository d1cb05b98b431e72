"""Scheduled etcd snapshots (``o41.webhook.backups``) against a real 3-member etcd and the
in-process bucket stand-in: where they go, the compare-and-swap that lets one replica of
many take each, retention, the metrics; and one member restored from a snapshot by the
init container's own code (``o41.restore.member``) with the test bed's etcdutl, then
read back by a real etcd."""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from prometheus_client import generate_latest

from o41.state import Put, open_store
from o41.state.etcd import EtcdStore
from o41.state.snapshot import PREFIX, Snapshot, newest_first, parse_key, snapshot_key
from o41.webhook import telemetry
from o41.webhook.app import Settings, make_app
from o41.webhook.backups import LAST_KEY, Backups
from o41.webhook.cluster.view import Cluster, View, organization_source
from o41.webhook.http.store import STORE
from testbed.etcd import EtcdCluster
from testbed.kube import bin_dir
from testbed.locations import ORG, Keys, location
from testbed.process import LOOPBACK, Server, free_port, wait_until
from testbed.standin_bucket import Storage, Stored

from support import wait_for_async

pytestmark = pytest.mark.etcd


@pytest.fixture(autouse=True)
def etcdutl(monkeypatch: pytest.MonkeyPatch) -> None:
    """The test bed's etcdutl, as the image's: the snapshot's exact revision."""
    monkeypatch.setenv("O41_ETCDUTL", str(bin_dir() / "etcdutl"))


def app_on(etcd: EtcdCluster, storage: Storage, organization: str = ORG, **more: Any) -> Any:
    """The service's app on ``etcd``, its backups pointed at ``organization``; its
    resources put in place by hand (no server, so no background task runs)."""
    view = View()
    view.put_location(location("east", "aws", "us-east-1", 1))  # the first: the fallback
    view.put_location(location("west", "aws", "us-west-2", 2))
    view.put_organization(
        organization_source({"metadata": {"name": ORG}, "spec": {"namespaces": ["team-a"]}})
    )
    settings = Settings(etcd_endpoints=etcd.endpoints, backup_organization=organization, **more)
    app = make_app(settings, cluster=Cluster(view, Keys()), buckets=storage.opener)
    app[STORE] = open_store(etcd.endpoints)
    return app


def objects(storage: Storage, bucket: str = "bucket-east") -> dict[str, bytes]:
    base = f"/{bucket}/"
    return {
        p.removeprefix(base).replace("%2F", "/"): o.data
        for p, o in storage.objects.items()
        if p.startswith(base + ".o41")
    }


async def close(app: web.Application) -> None:
    await app[STORE].close()


async def test_a_snapshot_goes_to_the_backup_organizations_fallback_with_its_sidecar(
    etcd_cluster: EtcdCluster,
) -> None:
    storage = Storage()
    app = app_on(etcd_cluster, storage)
    try:
        for i in range(50):
            await app[STORE].put(f"/o41/test/{i}".encode(), b"x" * 100)
        taken = await Backups(app).tick()
        assert taken is not None
        held = objects(storage)
        assert sorted(held) == [taken.key, taken.key + ".json"]
        assert taken.key.startswith(PREFIX) and taken.key.endswith(f"-{taken.revision}.db")
        assert parse_key(taken.key) == (float(int(taken.taken)), taken.revision)
        data = held[taken.key]
        assert (len(data), hashlib.sha256(data).hexdigest()) == (taken.size, taken.sha256)
        assert Snapshot.from_json(held[taken.key + ".json"], taken.key) == taken
        assert taken.etcd_version.startswith("3.6.")
        # the key says so, for every replica
        kept = await app[STORE].get(LAST_KEY)
        assert kept is not None
        record = json.loads(kept.value)
        assert record["last"]["key"] == taken.key and record["claim"] is None
        # etcd's own tool reads it: its hash, revision and keys
        (snapshot := etcd_cluster.directory / "s.db").write_bytes(data)
        tool = [str(bin_dir() / "etcdutl"), "snapshot", "status", str(snapshot), "-w", "json"]
        status = await asyncio.to_thread(
            lambda: subprocess.run(tool, capture_output=True, text=True, check=True)
        )
        assert json.loads(status.stdout)["revision"] == taken.revision
        # not due again before the interval
        assert await Backups(app).tick() is None
    finally:
        await close(app)


async def test_two_replicas_racing_take_one_snapshot(etcd_cluster: EtcdCluster) -> None:
    storage = Storage()
    app = app_on(etcd_cluster, storage)
    try:
        replicas = [Backups(app) for _ in range(4)]
        for n, r in enumerate(replicas):
            r.replica = f"replica-{n}"
        taken = await asyncio.gather(*(r.tick() for r in replicas))
        assert len([t for t in taken if t is not None]) == 1
        assert len(newest_first(list(objects(storage)))) == 1
        # everyone reports the one snapshot from the key at its next look
        await asyncio.gather(*(r.tick() for r in replicas))
        assert {r.stats.last.key for r in replicas if r.stats.last} == {
            next(t.key for t in taken if t)
        }
    finally:
        await close(app)


async def test_a_claim_left_by_a_dead_replica_expires(etcd_cluster: EtcdCluster) -> None:
    storage = Storage()
    app = app_on(etcd_cluster, storage)
    try:
        fresh = {"last": None, "claim": {"by": "dead", "at": time.time()}}
        await app[STORE].put(LAST_KEY, json.dumps(fresh).encode())
        assert await Backups(app).tick() is None  # someone is taking it
        old = {"last": None, "claim": {"by": "dead", "at": time.time() - 1000}}
        await app[STORE].put(LAST_KEY, json.dumps(old).encode())
        assert await Backups(app, claim_seconds=900).tick() is not None
    finally:
        await close(app)


async def test_an_empty_etcd_beside_snapshots_is_not_snapshotted(
    etcd_cluster: EtcdCluster, caplog: pytest.LogCaptureFixture
) -> None:
    """etcd lost and made again empty: its snapshot would become "latest", and retention
    would go on to delete the good ones. None is taken until it is restored."""
    storage = Storage()
    app = app_on(etcd_cluster, storage)
    good = snapshot_key(1.7e9, 12345)
    storage.objects[f"/bucket-east/{good}"] = Stored(b"good")
    try:
        backups = Backups(app)
        with caplog.at_level(logging.WARNING):
            assert await backups.tick() is None
        assert "etcd holds no record of a snapshot but location east holds 1" in caplog.text
        assert backups.stats.failures == {"etcd_new": 1}
        assert list(objects(storage)) == [good]
        # restored: the key came back with the snapshot (claimed by the replica that
        # took it, which is not taking one now): that replica goes on at once
        claimed = {"last": None, "claim": {"by": backups.replica, "at": time.time()}}
        await app[STORE].put(LAST_KEY, json.dumps(claimed).encode())
        other = Backups(app)
        other.replica = "another"
        assert await other.tick() is None  # to another replica it is a claim in force
        assert await backups.tick() is not None
    finally:
        await close(app)


async def test_retention_keeps_the_newest_and_touches_nothing_else(
    etcd_cluster: EtcdCluster,
) -> None:
    storage = Storage()
    app = app_on(etcd_cluster, storage, backup_keep=3)
    older = [snapshot_key(t, 10 + n) for n, t in enumerate((1.6e9, 1.7e9, 1.75e9, 1.76e9))]
    for key in [*older, *(k + ".json" for k in older), ".o41/snapshots/notes.txt"]:
        storage.objects[f"/bucket-east/{key}"] = Stored(b"old")
    storage.objects["/bucket-east/.o41/versions/ml/a/v1"] = Stored(b"record")
    try:
        # etcd has taken snapshots before (its record), so the older objects are its own
        await app[STORE].put(LAST_KEY, b'{"claim":null,"last":null}')
        taken = await Backups(app).tick()
        assert taken is not None
        held = objects(storage)
        assert newest_first(list(held)) == [taken.key, older[3], older[2]]
        assert {older[3] + ".json", older[2] + ".json", taken.key + ".json"} <= set(held)
        assert older[0] + ".json" not in held and older[1] not in held
        assert ".o41/snapshots/notes.txt" in held and ".o41/versions/ml/a/v1" in held
    finally:
        await close(app)


def scrape() -> dict[str, float]:
    found = {}
    for line in generate_latest(telemetry.REGISTRY).decode().splitlines():
        if line.startswith("o41_etcd_snapshot"):
            name, _, value = line.rpartition(" ")
            found[name] = float(value)
    return found


async def test_metrics_say_the_last_snapshot_from_etcd_and_count_failures(
    etcd_cluster: EtcdCluster, caplog: pytest.LogCaptureFixture
) -> None:
    storage = Storage()
    app = app_on(etcd_cluster, storage, backup_interval=7200)
    nowhere = app_on(etcd_cluster, storage, organization="nobody")
    try:
        from o41.webhook.backups import COLLECTOR

        lost = Backups(nowhere)
        COLLECTOR.follow(lost)
        with caplog.at_level(logging.WARNING):
            assert await lost.tick() is None
        assert "organization nobody does not exist: no snapshot taken" in caplog.text
        seen = scrape()
        assert seen['o41_etcd_snapshot_failures_total{stage="config"}'] == 1
        assert seen["o41_etcd_snapshot_last_success_timestamp_seconds"] == 0
        taker, other = Backups(app), Backups(app)
        taken = await taker.tick()
        assert taken is not None
        await other.tick()  # another replica reads the key
        COLLECTOR.follow(other)
        seen = scrape()
        assert seen["o41_etcd_snapshot_last_success_timestamp_seconds"] == taken.taken
        assert seen["o41_etcd_snapshot_interval_seconds"] == 7200
        assert seen["o41_etcd_snapshot_last_size_bytes"] == taken.size
        assert seen["o41_etcd_snapshots_taken_total"] == 0  # this one took none
    finally:
        await close(app)
        await close(nowhere)


async def test_the_embedded_store_has_no_snapshot_and_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    app = make_app(Settings(backup_organization=ORG), cluster=Cluster(View(), Keys()))
    backups = Backups(app)
    with caplog.at_level(logging.WARNING):
        await asyncio.wait_for(backups.run(), 5)
    assert "the embedded store has no snapshot API" in caplog.text
    assert not backups.enabled


def restore_member(data: Path, request: Path, peer: str) -> subprocess.CompletedProcess[str]:
    import sys

    return subprocess.run(
        [
            sys.executable, "-m", "o41.restore.member", "--name=m0", f"--data-dir={data}",
            f"--request={request}", f"--initial-cluster=m0={peer}",
            "--initial-cluster-token=restored", f"--initial-advertise-peer-urls={peer}",
            f"--etcdutl={bin_dir() / 'etcdutl'}",
        ],
        capture_output=True, text=True, check=False,
    )  # fmt: skip


async def test_a_member_restores_from_a_snapshot_only_when_empty_and_asked(
    etcd_cluster: EtcdCluster, tmp_path: Path
) -> None:
    storage = Storage()
    app = app_on(etcd_cluster, storage)
    try:
        for i in range(20):
            await app[STORE].put(f"/o41/kept/{i}".encode(), f"value-{i}".encode())
        taken = await Backups(app).tick()
        assert taken is not None
        await app[STORE].put(b"/o41/kept/after", b"lost")  # after the snapshot
    finally:
        await close(app)
    (tmp_path / "snap.db").write_bytes(objects(storage)[taken.key])
    request, data = tmp_path / "request", tmp_path / "volume" / "data"
    request.mkdir()
    data.parent.mkdir()
    peer = f"http://{LOOPBACK}:{free_port()}"

    done = restore_member(data, request, peer)  # no Secret mounted: nothing
    assert done.returncode == 0 and "no restore asked for" in done.stdout
    (request / "url").write_text((tmp_path / "snap.db").as_uri())
    (request / "sha256").write_text("0" * 64)
    (request / "key").write_text(taken.key)
    done = restore_member(data, request, peer)  # a changed object: refused
    assert done.returncode == 1 and "not restored" in done.stdout, done.stdout
    assert not data.exists()
    (request / "sha256").write_text(taken.sha256)
    done = restore_member(data, request, peer)
    assert done.returncode == 0, done.stdout
    assert f"member m0 restored from {taken.key}" in done.stdout
    done = restore_member(data, request, peer)  # it has data now: never again
    assert "holds data: nothing to restore" in done.stdout

    client = f"http://{LOOPBACK}:{free_port()}"
    server = Server(
        "restored etcd",
        [str(bin_dir() / "etcd"), "--name=m0", f"--data-dir={data}",
         f"--listen-client-urls={client}", f"--advertise-client-urls={client}",
         f"--listen-peer-urls={peer}", "--log-level=warn"],
        log=tmp_path / "etcd.log",
    ).start()  # fmt: skip
    store = EtcdStore([client])
    try:
        wait_until(server.alive, timeout=10, what="etcd to start")

        async def answers() -> bool:
            try:
                return await store.get(b"/o41/kept/0") is not None
            except Exception:
                return False

        await wait_for_async(answers, 30, "the restored member to answer")
        kept = await store.range(b"/o41/kept/")
        assert {kv.key: kv.value for kv in kept} == {
            f"/o41/kept/{i}".encode(): f"value-{i}".encode() for i in range(20)
        }
        # revisions go on far above the snapshot's: none read before the loss comes again
        revision = await store.put(b"/o41/new", b"1")
        assert revision > taken.revision + 1_000_000_000
        assert await store.txn([], [Put(b"/o41/new", b"2")])
    finally:
        await store.close()
        server.stop(timeout=5)
