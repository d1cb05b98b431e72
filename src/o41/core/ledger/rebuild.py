"""etcd's index rebuilt from the record objects and the journal, and the dry run's diff
against etcd as it is."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from o41.core.ledger.common import (
    ArtifactRef,
    TagRef,
    VersionRef,
    canonical,
    micros,
)
from o41.core.ledger.journal import (
    Deletion,
    Entry,
    TagMove,
    entry_key,
)
from o41.core.ledger.records import (
    VersionRecord,
    version_fields,
)

# --- the rebuild -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TagState:
    version: str
    set_us: int
    by: str


@dataclass(frozen=True, slots=True)
class ArtifactState:
    """What etcd's artifact record holds (``count``: the last sequence number taken, the
    next commit takes ``count + 1``) and its versions, oldest first."""

    versions: tuple[str, ...]
    latest: str
    count: int
    committed_us: int  # latest's


@dataclass(frozen=True, slots=True)
class SetAside:
    """A record the rebuild did not restore, and why; its objects stay in the bucket."""

    record: VersionRecord
    reason: str


@dataclass(frozen=True)
class Index:
    """etcd's index in a shape both sides of :func:`diff` can give: each version's record
    fields (``version_fields``; from etcd, ``Version``'s), each artifact's ``(latest,
    count)``, each tag's version."""

    versions: Mapping[VersionRef, Mapping[str, Any]]
    artifacts: Mapping[ArtifactRef, tuple[str, int]]
    tags: Mapping[TagRef, str]


@dataclass(frozen=True)
class Rebuilt:
    """What etcd should hold: the versions restored, the artifacts, the tags; the versions
    retention deleted (absent; their sequence numbers stay taken); and what was left out."""

    records: Mapping[VersionRef, VersionRecord]
    artifacts: Mapping[ArtifactRef, ArtifactState]
    tags: Mapping[TagRef, TagState]
    deleted: Mapping[VersionRef, int]
    set_aside: tuple[SetAside, ...] = ()
    notes: tuple[str, ...] = ()

    def index(self) -> Index:
        return Index(
            {ref: version_fields(r) for ref, r in self.records.items()},
            {ref: (a.latest, a.count) for ref, a in self.artifacts.items()},
            {ref: t.version for ref, t in self.tags.items()},
        )


def _rank(record: VersionRecord) -> tuple[int, int, str]:
    """Oldest first: sequence, then commit time, then id (only ever needed for ties)."""
    return (record.seq, record.committed_us, record.version)


def _distinct(
    records: Iterable[VersionRecord], notes: list[str]
) -> dict[VersionRef, VersionRecord]:
    """One record per version. Two different ones for a version (the same key in two
    listings that disagree): the higher sequence, since a commit that retries PUTs its
    record again only with a higher number."""
    found: dict[VersionRef, dict[str, VersionRecord]] = defaultdict(dict)
    for r in records:
        found[r.ref][r.sha256()] = r
    chosen: dict[VersionRef, VersionRecord] = {}
    for ref, variants in found.items():
        best = max(variants.items(), key=lambda kv: (kv[1].seq, kv[0]))[1]
        if len(variants) > 1:
            notes.append(
                f"{ref[0]}/{ref[1]}: version {ref[2]} has {len(variants)} different record "
                f"objects; the one with sequence {best.seq} is used"
            )
        chosen[ref] = best
    return chosen


def rebuild(
    records: Iterable[VersionRecord],
    journal: Iterable[Entry],
    objects_check_out: Callable[[VersionRecord], bool],
) -> Rebuilt:
    """etcd's index from the buckets alone; the same for any order and any duplicates of
    the inputs. ``objects_check_out(record)``: whether the bucket holds the version as
    its record says. It is asked only about the records :func:`doubtful` returns, so the
    caller checks those first (in parallel, with I/O) and passes the answers.

    A version is **proven** committed when a record names it as ``previous``, a journal
    entry names it (a tag moved onto it, retention deleted it), or it was numbered before
    sequence numbers (``seq`` 0, written from etcd). Per artifact and sequence number:

    - a proven claimant wins it; the others are set aside (their commit's transaction
      never happened: they lost the number to the proven one);
    - with none proven (the newest number, or a version whose successor retention deleted),
      the claimants whose objects check out compete and the one committed last wins: a
      commit that failed after its PUT is followed by the commit that took its number.
    - the winner is restored, unless retention deleted it (absent, number still taken).

    ``latest``: the restored version of the highest sequence; the counter: the highest
    number won. A tag: its journal and the commit-time tags of the winners replayed in
    time order; a tag that ends on a version not restored (deleted by retention: the
    service never lets a tag stay there) is left out, with a note."""
    notes: list[str] = []
    chosen = _distinct(records, notes)
    entries = set(journal)
    deletions: dict[VersionRef, Deletion] = {}
    for e in sorted((e for e in entries if isinstance(e, Deletion)), key=entry_key):
        deletions.setdefault((e.organization, e.artifact, e.version), e)
    proven: set[VersionRef] = set(deletions)
    proven.update(
        (e.organization, e.artifact, e.version)
        for e in entries
        if isinstance(e, TagMove) and e.version is not None
    )
    for r in chosen.values():
        if r.previous is not None:
            proven.add((r.organization, r.artifact, r.previous))
        if r.seq == 0:
            proven.add(r.ref)

    # every claim on an artifact's sequence numbers: records, and deletions without one
    claims: dict[tuple[str, str, int], list[VersionRef]] = defaultdict(list)
    for r in chosen.values():
        if r.seq > 0:
            claims[(r.organization, r.artifact, r.seq)].append(r.ref)
    for ref, d in deletions.items():
        if ref not in chosen and d.seq > 0:
            claims[(d.organization, d.artifact, d.seq)].append(ref)

    winners: set[VersionRef] = {r.ref for r in chosen.values() if r.seq == 0}
    count: dict[ArtifactRef, int] = defaultdict(int)
    set_aside: list[SetAside] = []

    def order(ref: VersionRef) -> tuple[int, str]:
        r = chosen.get(ref)
        return (-1 if r is None else r.committed_us, ref[2])

    for (org, artifact, seq), refs in sorted(claims.items()):
        where = f"{org}/{artifact}"
        sure = [ref for ref in refs if ref in proven]
        winner: VersionRef | None
        if sure:
            winner = max(sure, key=order)
            if len(sure) > 1:
                notes.append(
                    f"{where}: sequence {seq} is claimed by {len(sure)} versions shown "
                    f"committed ({', '.join(sorted(v for _, _, v in sure))}); "
                    f"{winner[2]}, committed last, keeps it"
                )
            for ref in refs:
                if ref != winner and ref in chosen:  # a deletion without a record: none
                    set_aside.append(
                        SetAside(
                            chosen[ref],
                            f"sequence {seq} of {where} went to version {winner[2]}, "
                            "shown committed: this commit's transaction never happened",
                        )
                    )
        else:
            good = [ref for ref in sorted(refs) if objects_check_out(chosen[ref])]
            winner = max(good, key=order) if good else None
            for ref in refs:
                if ref == winner:
                    continue
                if ref in good:
                    assert winner is not None
                    why = (
                        f"sequence {seq} of {where} went to version {winner[2]}, committed "
                        "later: this commit's transaction never happened"
                    )
                else:
                    why = (
                        "nothing shows its commit happened and its objects are not in the "
                        "bucket as its record says"
                    )
                set_aside.append(SetAside(chosen[ref], why))
        if winner is not None:
            winners.add(winner)
            count[(org, artifact)] = max(count[(org, artifact)], seq)

    restored = {ref: chosen[ref] for ref in winners if ref not in deletions}
    deleted = {ref: chosen[ref].seq if ref in chosen else d.seq for ref, d in deletions.items()}

    by_artifact: dict[ArtifactRef, list[VersionRecord]] = defaultdict(list)
    for r in restored.values():
        by_artifact[(r.organization, r.artifact)].append(r)
    artifacts: dict[ArtifactRef, ArtifactState] = {}
    for aref, rs in by_artifact.items():
        rs.sort(key=_rank)
        artifacts[aref] = ArtifactState(
            tuple(r.version for r in rs), rs[-1].version, count[aref], rs[-1].committed_us
        )
    for aref in sorted(set(count) - set(artifacts)):
        notes.append(
            f"{aref[0]}/{aref[1]}: no version is left to restore (sequence numbers up to "
            f"{count[aref]} were taken): no artifact record"
        )

    won = [chosen[ref] for ref in winners if ref in chosen]  # not deletions without one
    tags = _replay(entries, won, restored, deletions, notes)
    set_aside.sort(key=lambda s: s.record.ref)
    return Rebuilt(restored, artifacts, tags, deleted, tuple(set_aside), tuple(sorted(notes)))


def _replay(
    entries: Iterable[Entry],
    winners: Iterable[VersionRecord],
    restored: Mapping[VersionRef, VersionRecord],
    deletions: Mapping[VersionRef, Deletion],
    notes: list[str],
) -> dict[TagRef, TagState]:
    """Each tag's last move, in time order (ties by object key), over the journal and the
    tags the winners' commits moved in their own transactions."""
    moves: list[tuple[int, str, TagRef, str | None, str]] = []
    for e in entries:
        if isinstance(e, TagMove):
            moves.append(
                (e.when_us, entry_key(e), (e.organization, e.artifact, e.tag), e.version, e.by)
            )
    for r in winners:
        if r.tag is not None:
            tref = (r.organization, r.artifact, r.tag)
            moves.append((r.committed_us, r.object_key, tref, r.version, r.by or ""))
    last: dict[TagRef, tuple[int, str, TagRef, str | None, str]] = {}
    for move in sorted(moves):
        last[move[2]] = move
    tags: dict[TagRef, TagState] = {}
    for tref, (when, _, _, version, by) in last.items():
        if version is None:
            continue
        if (tref[0], tref[1], version) in restored:
            tags[tref] = TagState(version, when, by)
            continue
        gone = (
            "retention deleted it"
            if (tref[0], tref[1], version) in deletions
            else "no record restores it"
        )
        notes.append(
            f"{tref[0]}/{tref[1]}: tag {tref[2]} last pointed at version {version}, but "
            f"{gone}: the tag is left out"
        )
    return tags


def doubtful(records: Iterable[VersionRecord], journal: Iterable[Entry]) -> list[VersionRecord]:
    """The records :func:`rebuild` asks ``objects_check_out`` about, sorted: those no
    other record or entry shows committed, at a number no shown-committed one holds.
    Usually one an artifact (its newest version), plus any commit that failed after its
    PUT."""
    asked: dict[VersionRef, VersionRecord] = {}

    def ask(record: VersionRecord) -> bool:
        asked[record.ref] = record
        return True

    rebuild(records, journal, ask)
    return [asked[ref] for ref in sorted(asked)]


# --- the dry run -------------------------------------------------------------------------


def _shown(value: Any) -> str:
    text = canonical(value).decode()
    return text if len(text) <= 80 else text[:77] + "..."


def _same(name: str, a: Any, b: Any) -> bool:
    if name == "committed":  # float seconds both, to the microsecond
        return isinstance(a, int | float) and isinstance(b, int | float) and micros(a) == micros(b)
    return canonical(a) == canonical(b)  # 1 and 1.0, true and 1 differ


def diff(rebuilt: Index, current: Index) -> list[str]:
    """What a rebuild would change in etcd, a line each, sorted by artifact: versions in
    the buckets' records and not in etcd or the reverse, fields that differ (retention's
    mark ``deleting`` is etcd's own: not compared), ``latest`` and the sequence counter,
    tags. Empty: etcd holds what the buckets say."""
    lines: list[tuple[str, str, int, str, str]] = []

    def add(org: str, artifact: str, rank: int, name: str, text: str) -> None:
        lines.append((org, artifact, rank, name, f"{org}/{artifact}: {text}"))

    for ref in rebuilt.versions.keys() | current.versions.keys():
        org, artifact, v = ref
        new, old = rebuilt.versions.get(ref), current.versions.get(ref)
        if old is None:
            assert new is not None
            seq = new.get("seq")
            add(
                org,
                artifact,
                1,
                v,
                f"version {v} (sequence {seq}) is in the buckets' records, not in etcd",
            )
        elif new is None:
            add(org, artifact, 1, v, f"version {v} is in etcd, not in the buckets' records")
        else:
            differ = [
                f"{n} {_shown(old.get(n))} in etcd, {_shown(new.get(n))} rebuilt"
                for n in sorted((new.keys() | old.keys()) - {"deleting"})
                if not _same(n, old.get(n), new.get(n))
            ]
            if differ:
                add(org, artifact, 1, v, f"version {v} differs: {'; '.join(differ)}")
    for aref in rebuilt.artifacts.keys() | current.artifacts.keys():
        org, artifact = aref
        new_a, old_a = rebuilt.artifacts.get(aref), current.artifacts.get(aref)
        if old_a is None:
            assert new_a is not None
            add(
                org,
                artifact,
                0,
                "",
                f"no artifact record in etcd; rebuilt: latest "
                f"{new_a[0]}, sequence counter {new_a[1]}",
            )
        elif new_a is None:
            add(
                org,
                artifact,
                0,
                "",
                f"artifact record in etcd (latest {old_a[0]}, "
                f"sequence counter {old_a[1]}), none rebuilt",
            )
        else:
            if old_a[0] != new_a[0]:
                add(org, artifact, 0, "latest", f"latest is {old_a[0]} in etcd, {new_a[0]} rebuilt")
            if old_a[1] != new_a[1]:
                add(
                    org,
                    artifact,
                    0,
                    "seq",
                    f"sequence counter is {old_a[1]} in etcd, {new_a[1]} rebuilt",
                )
    for tref in rebuilt.tags.keys() | current.tags.keys():
        org, artifact, tag = tref
        new_t, old_t = rebuilt.tags.get(tref), current.tags.get(tref)
        if old_t is None:
            add(org, artifact, 2, tag, f"tag {tag} is rebuilt (at {new_t}), not in etcd")
        elif new_t is None:
            add(org, artifact, 2, tag, f"tag {tag} is in etcd (at {old_t}), not rebuilt")
        elif old_t != new_t:
            add(org, artifact, 2, tag, f"tag {tag} points at {old_t} in etcd, {new_t} rebuilt")
    return [line[4] for line in sorted(lines)]
