"""Rebuild etcd's index of versions from the buckets' record (issue 32; docs/operations.md
"Rebuild from the buckets"): list every location's ``.o41/`` prefix of each
organization, read the record objects and journal entries, decide with
``o41.core.ledger.rebuild``, then either print what differs from etcd (``--dry-run``) or
write what etcd lacks.

Writing is idempotent, so a rebuild stopped halfway is resumed by running it again:

- a version is put only where etcd has no record of it (a transaction guarded by the
  key's absence), with its index key;
- an artifact's record (``latest``, the sequence counter) is put where etcd has none, or
  moved forward where the buckets know of more commits than etcd (etcd restored from an
  older snapshot), never back;
- a tag is put where etcd's differs and the journal's move is newer than etcd's, and
  deleted where the journal's last move of it, newer than etcd's, deleted it;
- a version the journal says retention deleted is removed from etcd (a snapshot taken
  before the deletion brings it back; its objects are gone).

Nothing in the buckets is changed or deleted. A location that cannot be listed is named
in the report and the rest is rebuilt: run again once it answers.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import logging
import os
import sys
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from aiohttp import web

from o41.core.directories import object_key
from o41.core.ledger import (
    JOURNAL,
    RECORDS,
    Entry,
    Index,
    LedgerRefused,
    Rebuilt,
    TagMove,
    TagRef,
    VersionRecord,
    VersionRef,
    diff,
    doubtful,
    micros,
    parse_entry,
    parse_manifest,
    parse_record,
    rebuild,
    version_fields,
)
from o41.core.versions import index_suffix
from o41.kube.locations import Location
from o41.state import Compare, Delete, Put, Store
from o41.webhook.buckets import PARALLEL_CHECKS, bucket_for
from o41.webhook.cluster.view import VIEW
from o41.webhook.http.errors import LocationFailed
from o41.webhook.http.store import STORE
from o41.webhook.records import (
    PREFIX,
    ArtifactRecord,
    Tag,
    Version,
    artifact_key,
    artifacts_prefix,
    index_prefix,
    tag_key,
    version_key,
)
from o41.webhook.writes.backfill import legacy_suffix

log = logging.getLogger("o41.webhook.rebuild")

T = TypeVar("T")


@dataclass
class Found:
    """What the buckets of one organization hold, and what could not be read."""

    records: list[VersionRecord] = field(default_factory=list)
    entries: list[Entry] = field(default_factory=list)
    unreadable: list[str] = field(default_factory=list)  # objects refused, with why
    unreachable: dict[str, str] = field(default_factory=dict)  # location: error


@dataclass
class Report:
    """A rebuild's outcome, as its last lines print it."""

    organization: str
    records: int = 0
    versions_added: int = 0
    artifacts_set: int = 0
    tags_set: int = 0
    deletions_applied: int = 0
    differences: list[str] = field(default_factory=list)
    set_aside: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    unreadable: list[str] = field(default_factory=list)
    unreachable: dict[str, str] = field(default_factory=dict)


async def _bounded(calls: Iterable[Callable[[], Awaitable[T]]], limit: int) -> list[T]:
    gate = asyncio.Semaphore(limit)

    async def one(call: Callable[[], Awaitable[T]]) -> T:
        async with gate:
            return await call()

    return list(await asyncio.gather(*(one(c) for c in calls)))


async def read_location(
    app: web.Application, organization: str, location: Location, found: Found, say: Say
) -> None:
    """Every record object and journal entry of ``organization`` in ``location``."""
    try:
        opened = await bucket_for(app, location)
        bucket = opened.bucket
        name = location.name
        records = await opened.call(name, lambda: bucket.list_under(f"{RECORDS}{organization}/"))
        entries = await opened.call(name, lambda: bucket.list_under(f"{JOURNAL}{organization}/"))
        say(f"location {name}: {len(records)} record objects, {len(entries)} journal entries")

        async def fetch(key: str) -> tuple[str, bytes | None]:
            return key, await opened.call(name, lambda: bucket.get(key))

        keys = sorted(records) + sorted(entries)
        got = await _bounded([functools.partial(fetch, k) for k in keys], PARALLEL_CHECKS)
    except LocationFailed as e:
        found.unreachable[location.name] = str(e.error)
        say(f"location {location.name}: NOT READ ({e.error}); the rest is rebuilt without it")
        return
    for key, raw in got:
        if raw is None:
            continue  # deleted since the listing (retention): nothing to restore
        try:
            if key.startswith(RECORDS):
                found.records.append(parse_record(key, raw, location.name))
            else:
                found.entries.append(parse_entry(key, raw))
        except LedgerRefused as e:
            found.unreadable.append(f"{location.name}: {e}")


async def objects_check_out(app: web.Application, record: VersionRecord) -> bool:
    """Whether a version's bytes are in its bucket as its record says: the object's size
    (and MD5 where both know it), or a directory's manifest and every file in it."""
    location = app[VIEW].locations.get(record.location)
    if location is None:
        return False
    try:
        opened = await bucket_for(app, location)
        bucket = opened.bucket
        if record.manifest is None:
            stat = await opened.call(location.name, lambda: bucket.stat(record.key))
            if stat is None or stat.size != record.size:
                return False
            return not (record.md5 and stat.md5 and stat.md5 != record.md5)
        ref = record.manifest
        raw = await opened.call(location.name, lambda: bucket.get(ref.key))
        if raw is None:
            return False
        files = parse_manifest(ref, raw)
        held = await opened.call(location.name, lambda: bucket.list_under(record.key + "/"))
    except (LocationFailed, LedgerRefused):
        return False
    for entry in files:
        stat = held.get(object_key(record.key, entry.path))
        if stat is None or stat.size != entry.size:
            return False
    return True


async def current_index(store: Store, organization: str) -> tuple[Index, dict[Any, Any]]:
    """etcd's index of ``organization`` now, in the shape :func:`diff` compares, and each
    tag's record (its set time decides whether the journal's move is newer)."""
    versions: dict[Any, Any] = {}
    artifacts: dict[Any, Any] = {}
    tags: dict[Any, Any] = {}
    tag_records: dict[Any, Any] = {}
    for kv in await _range_all(store, artifacts_prefix(organization)):
        head = ArtifactRecord.load(kv.value)
        artifacts[(organization, head.artifact)] = (head.latest, head.count)
    for kv in await _range_all(store, PREFIX + f"versions/{organization}/".encode()):
        v = Version.load(kv.value)
        fields = {n: getattr(v, n) for n in Version.__dataclass_fields__}
        versions[(organization, v.artifact, v.version)] = fields
    tprefix = PREFIX + f"tags/{organization}/".encode()
    for kv in await _range_all(store, tprefix):
        artifact, _, name = kv.key[len(tprefix) :].decode().partition("/")
        t = Tag.load(kv.value)
        tags[(organization, artifact, name)] = t.version
        tag_records[(organization, artifact, name)] = t
    return Index(versions, artifacts, tags), tag_records


async def _range_all(store: Store, prefix: bytes) -> list[Any]:
    found, start = [], b""
    while True:
        page = await store.range(prefix, limit=1000, start=start)
        found.extend(page)
        if len(page) < 1000:
            return found
        start = page[-1].key + b"\0"


def deleted_tags(entries: Iterable[Entry]) -> dict[TagRef, int]:
    """Each tag whose last journaled move deleted it: when."""
    last: dict[TagRef, tuple[int, str | None]] = {}
    for e in entries:
        if isinstance(e, TagMove):
            ref = (e.organization, e.artifact, e.tag)
            if ref not in last or last[ref] < (e.when_us, e.version):
                last[ref] = (e.when_us, e.version)
    return {ref: when for ref, (when, version) in last.items() if version is None}


async def apply(
    store: Store,
    rebuilt: Rebuilt,
    tag_records: dict[Any, Any],
    report: Report,
    tags_deleted: dict[TagRef, int],
) -> None:
    """Write into etcd what it lacks of ``rebuilt`` (see the module's rules)."""

    async def put_version(ref: VersionRef, record: VersionRecord) -> bool:
        org, artifact, v = ref
        version = Version(**version_fields(record))
        suffix = index_suffix(record.seq, v) if record.seq else legacy_suffix(version)
        vkey = version_key(org, artifact, v)
        listed = Version(
            **{
                **version_fields(record),
                "part_size": None,
                "crc32": None,
                "previous": None,
                "by": None,
                "tag": None,
            }
        )
        done = await store.txn(
            [Compare(vkey, "version", "==", 0)],
            [
                Put(vkey, version.dump()),
                Put(index_prefix(org, artifact) + suffix.encode(), listed.dump()),
            ],
        )
        return bool(done.succeeded)

    added = await _bounded(  # each guarded by its own key's absence: safe side by side
        [functools.partial(put_version, ref, r) for ref, r in sorted(rebuilt.records.items())],
        PARALLEL_CHECKS,
    )
    report.versions_added += sum(added)
    for (org, artifact), state in sorted(rebuilt.artifacts.items()):
        akey = artifact_key(org, artifact)
        head = ArtifactRecord(artifact, state.latest, state.committed_us / 1e6, state.count)
        found = await store.get(akey)
        if found is None:
            done = await store.txn([Compare(akey, "version", "==", 0)], [Put(akey, head.dump())])
        elif ArtifactRecord.load(found.value).count < state.count:
            done = await store.txn(
                [Compare(akey, "mod", "==", found.mod_revision)], [Put(akey, head.dump())]
            )
        else:
            continue
        report.artifacts_set += int(done.succeeded)
    for tref, tag in sorted(rebuilt.tags.items()):
        org, artifact, name = tref
        held: Tag | None = tag_records.get(tref)
        if held is not None and (held.version == tag.version or micros(held.set) >= tag.set_us):
            continue
        key = tag_key(org, artifact, name)
        moved = Tag(tag.version, tag.set_us / 1e6, tag.by)
        await store.put(key, moved.dump())
        report.tags_set += 1
    for tref, when in sorted(tags_deleted.items()):
        held = tag_records.get(tref)
        if tref not in rebuilt.tags and held is not None and micros(held.set) < when:
            key = tag_key(*tref)
            await store.txn([Compare(key, "version", "!=", 0)], [Delete(key)])
            report.tags_set += 1
    for (org, artifact, v), _seq in sorted(rebuilt.deleted.items()):
        vkey = version_key(org, artifact, v)
        found = await store.get(vkey)
        if found is None:
            continue
        gone = Version.load(found.value)
        suffix = index_suffix(gone.seq, v) if gone.seq else legacy_suffix(gone)
        await store.txn(
            [Compare(vkey, "mod", "==", found.mod_revision)],
            [Delete(vkey), Delete(index_prefix(org, artifact) + suffix.encode())],
        )
        report.deletions_applied += 1


Say = Callable[[str], None]


async def rebuild_organization(
    app: web.Application, organization: str, *, dry_run: bool, say: Say
) -> Report:
    """Rebuild (or, ``dry_run``, compare) one organization's index from its buckets."""
    report = Report(organization)
    found = Found()
    locations = sorted(
        (loc for loc in app[VIEW].locations.values() if loc.organization == organization),
        key=lambda loc: loc.name,
    )
    say(f"organization {organization}: reading {len(locations)} locations")
    await asyncio.gather(*(read_location(app, organization, loc, found, say) for loc in locations))
    report.records = len(found.records)
    report.unreadable, report.unreachable = found.unreadable, found.unreachable
    asked = doubtful(found.records, found.entries)
    say(f"organization {organization}: checking the objects of {len(asked)} versions")
    answers = await _bounded(
        [functools.partial(objects_check_out, app, r) for r in asked],
        PARALLEL_CHECKS,
    )
    checked = {r.ref: ok for r, ok in zip(asked, answers, strict=True)}
    rebuilt = rebuild(found.records, found.entries, lambda r: checked.get(r.ref, False))
    report.set_aside = [f"{s.record.object_key}: {s.reason}" for s in rebuilt.set_aside]
    report.notes = list(rebuilt.notes)
    store = app[STORE]
    current, tag_records = await current_index(store, organization)
    report.differences = diff(rebuilt.index(), current)
    if not dry_run:
        await apply(store, rebuilt, tag_records, report, deleted_tags(found.entries))
    return report


def render(report: Report, *, dry_run: bool) -> list[str]:
    """The report's lines, as the command prints them."""
    lines = [f"organization {report.organization}: {report.records} record objects read"]
    if dry_run:
        lines += [f"  differs: {d}" for d in report.differences] or [
            "  etcd holds what the buckets say"
        ]
    else:
        lines.append(
            f"  written: {report.versions_added} versions, {report.artifacts_set} artifact "
            f"records, {report.tags_set} tags; {report.deletions_applied} versions retention "
            "had deleted removed"
        )
    lines += [f"  set aside: {s}" for s in report.set_aside]
    lines += [f"  note: {n}" for n in report.notes]
    lines += [f"  unreadable: {u}" for u in report.unreadable]
    lines += [
        f"  UNREACHABLE location {name}: {error}: run again once it answers"
        for name, error in sorted(report.unreachable.items())
    ]
    return lines


async def run(app: web.Application, organizations: list[str], *, dry_run: bool, say: Say) -> int:
    """Rebuild every organization named (all known, when none): the exit status (1: a
    location was unreachable, so the rebuild is not complete)."""
    names = organizations or sorted(app[VIEW].organizations)
    incomplete = False
    for name in names:
        started = time.monotonic()
        report = await rebuild_organization(app, name, dry_run=dry_run, say=say)
        for line in render(report, dry_run=dry_run):
            say(line)
        say(f"  in {time.monotonic() - started:.1f} s")
        incomplete = incomplete or bool(report.unreachable)
    return 1 if incomplete else 0


def main(argv: list[str] | None = None) -> int:
    """``python -m o41.webhook.rebuild``: run where the service runs (its settings, its
    service account): the chart's rebuild Job, or ``kubectl o41 admin rebuild``."""
    parser = argparse.ArgumentParser(prog="python -m o41.webhook.rebuild", description=__doc__)
    parser.add_argument("--etcd", default=os.environ.get("O41_ETCD_ENDPOINTS", ""))
    parser.add_argument("--kubeconfig", default=None)
    parser.add_argument(
        "--secrets-namespace", default=os.environ.get("O41_OPERATOR_NAMESPACE", "o41-system")
    )
    parser.add_argument(
        "--organization", action="append", default=[], help="only this one (repeat); default all"
    )
    parser.add_argument("--dry-run", action="store_true", help="print what differs; write nothing")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")

    from o41.state import store_settings
    from o41.webhook.app import Settings, rebuild_app

    try:
        endpoints, tls = store_settings(args.etcd, os.environ)
    except ValueError as e:
        parser.error(str(e))
    if not endpoints:
        parser.error("--etcd (or O41_ETCD_ENDPOINTS) names the etcd to rebuild")
    settings = Settings(
        etcd_endpoints=endpoints,
        etcd_tls=tls,
        kubeconfig=args.kubeconfig,
        secrets_namespace=args.secrets_namespace,
    )

    def say(line: str) -> None:
        print(line, flush=True)

    async def go() -> int:
        app = rebuild_app(settings)
        runner = web.AppRunner(app)
        await runner.setup()
        try:
            await asyncio.wait_for(app[VIEW].synced.wait(), timeout=60)
            unknown = sorted(set(args.organization) - set(app[VIEW].organizations))
            if unknown:
                say(f"no Organization {', '.join(unknown)} in the cluster: nothing to rebuild")
                return 2
            return await run(app, args.organization, dry_run=args.dry_run, say=say)
        finally:
            await runner.cleanup()

    return asyncio.run(go())


if __name__ == "__main__":
    sys.exit(main())
