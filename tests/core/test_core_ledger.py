"""The buckets' record of versions and the rebuild of etcd's index (``o41.core.ledger``,
issue 32): examples, and properties over simulated histories of a service."""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass, field, replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from o41.core.directories import FileEntry
from o41.core.ledger import (
    ARTIFACT_PATTERN,
    JOURNAL,
    ORGANIZATION_PATTERN,
    RESERVED,
    Deletion,
    Entry,
    Index,
    LedgerRefused,
    Rebuilt,
    TagMove,
    VersionRecord,
    canonical,
    diff,
    doubtful,
    entry_bytes,
    entry_key,
    manifest_object,
    micros,
    parse_entry,
    parse_manifest,
    parse_record,
    rebuild,
    record_key,
    version_fields,
)
from o41.core.parts import crc32_b64
from o41.kube.api import NAME_PATTERN
from o41.webhook.cluster.scope import ARTIFACT_PATTERN as SERVICE_ARTIFACT_PATTERN
from o41.webhook.records import Tag, Version

T0 = 1_750_000_000_000_000  # microseconds: June 2025
YEAR_2100 = 4_102_444_800_000_000  # float seconds hold every microsecond until 2106


def vid(n: int, salt: int = 0) -> str:
    return f"{(T0 // 1000 + n):012x}-{(n * 7919 + salt):016x}"


def rec(
    version: str,
    seq: int,
    previous: str | None = None,
    *,
    committed_us: int = T0,
    org: str = "acme",
    artifact: str = "ckpt",
    tag: str | None = None,
    **more: Any,
) -> VersionRecord:
    fields: dict[str, Any] = {
        "location": "aws-east",
        "size": 10,
        "md5": "0" * 32,
        "crc32": None,
        "part_size": None,
        "metadata": None,
        "cloud": "aws",
        "region": "us-east-1",
        "source": "env",
        "rule": "default",
        "by": "ml",
        **more,
    }
    return VersionRecord(
        organization=org,
        artifact=artifact,
        version=version,
        seq=seq,
        previous=previous,
        key=f"{artifact}/{version}",
        committed_us=committed_us,
        tag=tag,
        **fields,
    )


def everything(_: VersionRecord) -> bool:
    return True


# --- strategies ---------------------------------------------------------------------------

json_text = st.text(st.characters(exclude_categories=["Cs"]), max_size=12)
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | json_text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(json_text, inner, max_size=3),
    max_leaves=8,
)
versions = st.builds(
    lambda ms, r: f"{ms:012x}-{r:016x}", st.integers(0, 2**48 - 1), st.integers(0, 2**64 - 1)
)
crcs = st.integers(0, 2**32 - 1).map(crc32_b64)


@st.composite
def records(draw: st.DrawFn) -> VersionRecord:
    org = draw(st.from_regex(r"\A[a-z0-9]([-a-z0-9]{0,10}[a-z0-9])?\Z"))
    artifact = draw(st.from_regex(r"\A[A-Za-z0-9][A-Za-z0-9._-]{0,15}\Z"))
    version = draw(versions)
    directory = draw(st.booleans())
    manifest = None
    if directory:
        n = draw(st.integers(1, 3))
        entries = [FileEntry(f"f{i}/x.bin", i * 3, "a" * 32) for i in range(n)]
        manifest = manifest_object(org, artifact, version, entries)[0]
    parts = draw(st.none() | st.lists(crcs, min_size=1, max_size=4).map(tuple))
    return VersionRecord(
        organization=org,
        artifact=artifact,
        version=version,
        seq=draw(st.integers(0, 2**40)),
        previous=draw(st.none() | versions.filter(lambda v: v != version)),
        location=draw(st.from_regex(r"\A[a-z][a-z0-9-]{0,12}\Z")),
        key=f"{artifact}/{version}",
        size=draw(st.integers(0, 2**50)),
        md5=None if directory else draw(st.none() | st.from_regex(r"\A[0-9a-f]{32}\Z")),
        crc32=None if directory else parts,
        part_size=None if parts is None or directory else draw(st.integers(1, 2**33)),
        metadata=draw(st.none() | st.dictionaries(st.from_regex(r"\A[a-z_]{1,8}\Z"), json_values)),
        cloud=draw(st.none() | st.sampled_from(["aws", "gcp", "azure"])),
        region=draw(st.none() | st.sampled_from(["us-east-1", "europe-west4"])),
        source=draw(st.sampled_from(["env", "skypilot", "metadata", "none"])),
        rule=draw(json_text.filter(bool)),
        committed_us=draw(st.integers(0, YEAR_2100)),
        by=draw(st.sampled_from(["ml", "spiffe://other:ml"])),
        tag=draw(st.none() | st.sampled_from(["best", "prod", "v1.2"])),
        manifest=manifest,
    )


entries = st.one_of(
    st.builds(
        TagMove,
        organization=st.sampled_from(["acme", "o-2"]),
        artifact=st.sampled_from(["ckpt", "a.b_c-d"]),
        tag=st.sampled_from(["best", "prod"]),
        version=st.none() | versions,
        when_us=st.integers(0, 2**53 - 1),
        by=st.sampled_from(["ml", "team:ml"]),
    ),
    st.builds(
        Deletion,
        organization=st.sampled_from(["acme", "o-2"]),
        artifact=st.sampled_from(["ckpt"]),
        version=versions,
        seq=st.integers(0, 2**40),
        when_us=st.integers(0, 2**53 - 1),
    ),
)


# --- record objects -----------------------------------------------------------------------


@given(records())
def test_a_record_object_round_trips_byte_for_byte(record: VersionRecord) -> None:
    raw = record.canonical()
    back = parse_record(record.object_key, raw, record.location)
    assert back == record
    assert back.canonical() == raw
    assert back.sha256() == record.sha256()
    assert json.loads(raw)["schema"] == 1


@given(records())
def test_the_record_restores_the_services_version_record(record: VersionRecord) -> None:
    """``Version(**version_fields(r))`` is etcd's record; its commit time to the µs."""
    version = Version(**version_fields(record))
    assert Version.load(version.dump()) == version
    assert micros(version.committed) == record.committed_us
    assert version.files == (None if record.manifest is None else record.manifest.files)


@given(st.integers(0, YEAR_2100))
def test_microseconds_survive_the_services_float_seconds(us: int) -> None:
    assert micros(us / 1_000_000) == us


def test_canonical_bytes_sort_keys_and_spell_one_way() -> None:
    record = rec(vid(1), 1, metadata={"z": 1, "a": [1.5, "é"], "m": {"y": True, "b": None}})
    raw = record.canonical()
    assert b" " not in raw.replace("é".encode(), b"")
    keys = list(json.loads(raw))
    assert keys == sorted(keys)
    assert '"a":[1.5,"é"]' in raw.decode()
    assert '"m":{"b":null,"y":true}' in raw.decode()
    assert record.object_key == f".o41/versions/acme/ckpt/{vid(1)}"


def test_no_user_object_key_can_start_with_the_reserved_prefix() -> None:
    """User objects are ``<artifact>/<version>[/<path>]``; an artifact's name starts with
    a letter or digit; the patterns are the service's own."""
    assert ARTIFACT_PATTERN == SERVICE_ARTIFACT_PATTERN
    assert ORGANIZATION_PATTERN == NAME_PATTERN
    assert re.fullmatch(ARTIFACT_PATTERN, ".o41") is None
    assert RESERVED == ".o41/"
    assert not ".o41-location".startswith(RESERVED)  # the GCS marker object is not under it


@given(st.from_regex(ARTIFACT_PATTERN, fullmatch=True), versions)
def test_an_artifacts_keys_never_fall_under_the_reserved_prefix(
    artifact: str, version: str
) -> None:
    assert not f"{artifact}/{version}".startswith(RESERVED)
    assert not f"{artifact}/{version}/a/b".startswith(RESERVED)


def _raw(record: VersionRecord, **changes: Any) -> bytes:
    data = record.to_json()
    data.update(changes)
    for name in [k for k, v in changes.items() if v is _GONE]:
        del data[name]
    return canonical(data)


_GONE = object()
RECORD = rec(vid(5), 5, vid(4), metadata={"step": 100})
KEY = RECORD.object_key


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        (b"{not json", "is not JSON"),
        (b"[1,2]", "is not a JSON object"),
        (_raw(RECORD, schema=2), "has schema version 2; this o41 reads version 1"),
        (_raw(RECORD, schema=_GONE), "has schema version null"),
        (_raw(RECORD, seq=_GONE), "lacks field seq"),
        (_raw(RECORD, color="red"), "has unknown field color"),
        (_raw(RECORD, size="10"), "field 'size' of record object"),
        (_raw(RECORD, size=True), "must be an integer, not true"),
        (_raw(RECORD, committed_us=1.5), "must be an integer, not 1.5"),
        (_raw(RECORD, crc32="abc"), "must be a list of text"),
        (_raw(RECORD, metadata=[1]), "must be a JSON object or null"),
        (_raw(RECORD, md5="xyz"), "md5 'xyz' is not 32 hex digits"),
        (_raw(RECORD, crc32=["nope"]), "is not a base64 CRC32"),
        (_raw(RECORD, seq=-1), "sequence -1 is below 0"),
        (_raw(RECORD, committed_us=2**53), "is not microseconds since the epoch"),
        (_raw(RECORD, key="other/x"), "is not ckpt/"),
        (_raw(RECORD, tag="latest"), "'latest' always names the newest"),
        (_raw(RECORD, previous=vid(5)), "names itself as its previous"),
        (_raw(RECORD, version=vid(6), key=f"ckpt/{vid(6)}"), "copied or renamed"),
        (_raw(RECORD, artifact="other", key=f"other/{vid(5)}"), "copied or renamed"),
        (_raw(RECORD, organization="Bad_Org"), "is not an organization's name"),
        (_raw(RECORD, manifest={"key": "x"}), "lacks field files, sha256, size"),
        (
            _raw(RECORD, manifest={"key": "x", "sha256": "0" * 64, "size": 9, "files": 1}),
            "manifest key 'x' is not this version's",
        ),
        (json.dumps(RECORD.to_json(), indent=1).encode(), "is not in canonical form"),
        (RECORD.canonical() + b"\n", "is not in canonical form"),
    ],
)
def test_a_record_object_out_of_its_rules_is_refused(raw: bytes, says: str) -> None:
    with pytest.raises(LedgerRefused, match=re.escape(says)) as refused:
        parse_record(KEY, raw)
    assert f"record object {KEY}" in str(refused.value)


def test_a_record_found_in_another_location_or_at_another_key_is_refused() -> None:
    raw = RECORD.canonical()
    with pytest.raises(LedgerRefused, match="found in location 'gcp-eu' but says"):
        parse_record(KEY, raw, "gcp-eu")
    with pytest.raises(LedgerRefused, match="copied or renamed"):
        parse_record(record_key("acme", "ckpt", vid(9)), raw)


def test_a_directorys_manifest_is_an_object_its_record_names_by_hash() -> None:
    files = [FileEntry("b.txt", 2, "b" * 32), FileEntry("a/c.bin", 1, "a" * 32)]
    ref, raw = manifest_object("acme", "ds", vid(1), files)
    assert ref.key == f".o41/manifests/acme/ds/{vid(1)}"
    assert (ref.size, ref.files) == (len(raw), 2)
    assert parse_manifest(ref, raw) == sorted(files)
    assert raw == manifest_object("acme", "ds", vid(1), reversed(files))[1]  # canonical
    with pytest.raises(LedgerRefused, match="not the manifest committed"):
        parse_manifest(ref, raw.replace(b"b.txt", b"d.txt"))
    with pytest.raises(LedgerRefused, match="path 'a' is given twice"):
        manifest_object("acme", "ds", vid(1), [FileEntry("a", 1, "a" * 32)] * 2)
    record = rec(vid(1), 1, artifact="ds", manifest=ref, md5=None)
    assert parse_record(record.object_key, record.canonical()) == record


# --- the journal --------------------------------------------------------------------------


@given(entries)
def test_a_journal_entry_round_trips_and_its_key_is_its_content(entry: Entry) -> None:
    key = entry_key(entry)
    assert key.startswith(f"{JOURNAL}{entry.organization}/{entry.when_us:016d}-")
    assert parse_entry(key, entry_bytes(entry)) == entry


@given(st.lists(entries, min_size=2, max_size=10, unique_by=lambda e: e.when_us))
def test_journal_keys_sort_in_time_order(found: list[Entry]) -> None:
    found = [replace(e, organization="acme") for e in found]
    assert sorted(found, key=entry_key) == sorted(found, key=lambda e: e.when_us)


MOVE = TagMove("acme", "ckpt", "best", vid(1), T0, "ml")


@pytest.mark.parametrize(
    ("raw", "key", "says"),
    [
        (b"\xff", entry_key(MOVE), "is not JSON"),
        (canonical({**json.loads(entry_bytes(MOVE)), "kind": "move"}), entry_key(MOVE), "kind"),
        (canonical({**json.loads(entry_bytes(MOVE)), "schema": 3}), entry_key(MOVE), "version 3"),
        (canonical({**json.loads(entry_bytes(MOVE)), "by": ""}), entry_key(MOVE), "by is empty"),
        (
            canonical({**json.loads(entry_bytes(MOVE)), "tag": vid(1)}),
            entry_key(MOVE),
            "looks like a version id",
        ),
        (entry_bytes(MOVE), entry_key(replace(MOVE, when_us=T0 + 1)), "renamed, or changed"),
        (
            entry_bytes(replace(MOVE, version=vid(2))),
            entry_key(MOVE),
            "renamed, or changed",
        ),
        (entry_bytes(MOVE) + b" ", entry_key(MOVE), "is not in canonical form"),
    ],
)
def test_a_journal_entry_out_of_its_rules_is_refused(raw: bytes, key: str, says: str) -> None:
    with pytest.raises(LedgerRefused, match=re.escape(says)):
        parse_entry(key, raw)


# --- the rebuild: examples ----------------------------------------------------------------


def refs(rebuilt: Rebuilt) -> list[str]:
    return sorted(v for _, _, v in rebuilt.records)


def test_a_chain_of_commits_rebuilds_versions_latest_counter_and_a_commit_tag() -> None:
    a, b, c = vid(1), vid(2), vid(3)
    found = [
        rec(a, 1, committed_us=T0),
        rec(b, 2, a, committed_us=T0 + 10, tag="best"),
        rec(c, 3, b, committed_us=T0 + 20),
    ]
    checked: list[str] = []

    def check(r: VersionRecord) -> bool:
        checked.append(r.version)
        return True

    rebuilt = rebuild(found, [], check)
    art = rebuilt.artifacts[("acme", "ckpt")]
    assert (art.versions, art.latest, art.count, art.committed_us) == ((a, b, c), c, 3, T0 + 20)
    assert rebuilt.tags[("acme", "ckpt", "best")].version == b
    assert rebuilt.tags[("acme", "ckpt", "best")].set_us == T0 + 10
    assert checked == [c]  # only the newest: the others are named by their successors
    assert [r.version for r in doubtful(found, [])] == [c]
    assert not rebuilt.set_aside and not rebuilt.notes


def test_a_record_whose_transaction_failed_loses_its_number_to_the_commit_shown_committed() -> None:
    """The orphan PUT its record at sequence 2, then its transaction failed; another
    commit took 2, and the commit after it names that one as previous. The orphan's
    objects check out, and it was even committed later: it still loses."""
    a, orphan, b, c = vid(1), vid(2), vid(3), vid(4)
    found = [
        rec(a, 1),
        rec(orphan, 2, a, committed_us=T0 + 50, tag="prod"),
        rec(b, 2, a, committed_us=T0 + 20),
        rec(c, 3, b, committed_us=T0 + 60),
    ]
    rebuilt = rebuild(found, [], everything)
    assert refs(rebuilt) == sorted([a, b, c])
    assert [s.record.version for s in rebuilt.set_aside] == [orphan]
    assert "went to version " + b in rebuilt.set_aside[0].reason
    assert ("acme", "ckpt", "prod") not in rebuilt.tags  # its commit's tag never moved
    assert orphan not in [r.version for r in doubtful(found, [])]


def test_at_the_newest_number_the_commit_that_checks_out_and_came_last_wins() -> None:
    a, orphan, b = vid(1), vid(2), vid(3)
    found = [rec(a, 1), rec(orphan, 2, a, committed_us=T0 + 5), rec(b, 2, a, committed_us=T0 + 9)]
    assert [r.version for r in doubtful(found, [])] == sorted([orphan, b])
    both = rebuild(found, [], everything)
    assert both.artifacts[("acme", "ckpt")].latest == b
    assert "committed later" in both.set_aside[0].reason
    # the later one's objects are gone: the orphan, whose objects are all there, wins
    only = rebuild(found, [], lambda r: r.version != b)
    assert only.artifacts[("acme", "ckpt")].latest == orphan
    assert "its objects are not in the bucket" in only.set_aside[0].reason
    # neither checks out: nothing at 2, the counter stays at 1
    none = rebuild(found, [], lambda r: r.version == a)
    assert none.artifacts[("acme", "ckpt")].count == 1
    assert len(none.set_aside) == 2


def test_a_journal_entry_proves_a_commit_without_a_check() -> None:
    a, b = vid(1), vid(2)
    found = [rec(a, 1), rec(b, 2, a)]
    moved = [TagMove("acme", "ckpt", "best", b, T0 + 1, "ml")]
    assert doubtful(found, moved) == []
    rebuilt = rebuild(found, moved, lambda r: False)  # proven: restored as etcd had it
    assert refs(rebuilt) == sorted([a, b])


def test_retention_deletions_leave_the_version_out_and_its_number_taken() -> None:
    a, b, c = vid(1), vid(2), vid(3)
    found = [rec(b, 2, a), rec(c, 3, b)]  # a's record object went with its bytes
    journal = [Deletion("acme", "ckpt", a, 1, T0 + 5), Deletion("acme", "ckpt", b, 2, T0 + 6)]
    rebuilt = rebuild(found, journal, everything)
    assert refs(rebuilt) == [c]
    assert rebuilt.deleted == {("acme", "ckpt", a): 1, ("acme", "ckpt", b): 2}
    assert rebuilt.artifacts[("acme", "ckpt")].count == 3
    # an orphan at a deleted version's number loses to it
    orphan = rec(vid(9), 1, committed_us=T0 + 99)
    again = rebuild([*found, orphan], journal, everything)
    assert refs(again) == [c] and again.set_aside[0].record == orphan


def test_tags_replay_in_time_order_whatever_the_order_found() -> None:
    a, b, c = vid(1), vid(2), vid(3)
    found = [rec(a, 1), rec(b, 2, a), rec(c, 3, b, committed_us=T0 + 40, tag="prod")]
    journal = [
        TagMove("acme", "ckpt", "best", c, T0 + 30, "ml"),
        TagMove("acme", "ckpt", "best", a, T0 + 10, "ml"),
        TagMove("acme", "ckpt", "best", b, T0 + 20, "ops"),
        TagMove("acme", "ckpt", "old", a, T0 + 1, "ml"),
        TagMove("acme", "ckpt", "old", None, T0 + 2, "ml"),  # deleted
        TagMove("acme", "ckpt", "prod", a, T0 + 50, "ml"),  # after the commit's own move
    ]
    for order in (journal, journal[::-1], sorted(journal, key=lambda e: e.by)):
        rebuilt = rebuild(found, order, everything)
        assert {t[2]: s.version for t, s in rebuilt.tags.items()} == {"best": c, "prod": a}
        assert rebuilt.tags[("acme", "ckpt", "best")].by == "ml"
    # the same microsecond: the entry whose key sorts last wins, in any order found
    tie = [TagMove("acme", "ckpt", "t", v, T0, "ml") for v in (a, b, c)]
    last = max(tie, key=entry_key).version
    for order in (tie, tie[::-1]):
        assert rebuild(found, order, everything).tags[("acme", "ckpt", "t")].version == last


def test_a_tag_that_ends_on_a_deleted_version_is_left_out_with_a_note() -> None:
    """The service never lets it happen (a move onto a marked version is refused,
    retention keeps tagged ones); a lost journal write could: the tag is dropped, not
    moved back to an older version a reader would then get silently."""
    a, b, c = vid(1), vid(2), vid(3)
    found = [rec(a, 1), rec(b, 2, a), rec(c, 3, b)]
    journal: list[Entry] = [
        TagMove("acme", "ckpt", "best", a, T0 + 1, "ml"),
        TagMove("acme", "ckpt", "best", b, T0 + 2, "ml"),
        Deletion("acme", "ckpt", b, 2, T0 + 3),
        TagMove("acme", "ckpt", "gone", vid(7), T0 + 4, "ml"),
    ]
    rebuilt = rebuild(found, journal, everything)
    assert rebuilt.tags == {}
    assert any(
        f"tag best last pointed at version {b}" in n and "retention deleted" in n
        for n in rebuilt.notes
    )
    assert any("tag gone" in n and "no record restores it" in n for n in rebuilt.notes)


def test_versions_numbered_before_sequence_numbers_come_first_and_need_no_check() -> None:
    old1, old2, new = vid(1), vid(2), vid(3)
    found = [
        rec(old1, 0, committed_us=T0 + 2),
        rec(old2, 0, committed_us=T0 + 1),
        rec(new, 1, old1, committed_us=T0 + 3),
    ]
    rebuilt = rebuild(found, [], everything)
    art = rebuilt.artifacts[("acme", "ckpt")]
    assert (art.versions, art.latest, art.count) == ((old2, old1, new), new, 1)
    assert [r.version for r in doubtful(found, [])] == [new]
    legacy_only = rebuild(found[:2], [], lambda r: False)
    assert legacy_only.artifacts[("acme", "ckpt")].latest == old1


def test_two_different_record_objects_of_one_version_keep_the_higher_number() -> None:
    a, b = vid(1), vid(2)
    first, retried = rec(b, 2, a), rec(b, 3, a)
    rebuilt = rebuild([rec(a, 1), retried, first], [], everything)
    assert rebuilt.records[("acme", "ckpt", b)] == retried
    assert any("2 different record objects" in n for n in rebuilt.notes)


# --- the rebuild: properties over simulated histories ----------------------------------


@dataclass
class History:
    """What a service did, and what its etcd holds at the end; what its buckets hold."""

    records: list[VersionRecord] = field(default_factory=list)
    journal: list[Entry] = field(default_factory=list)
    orphans: set[str] = field(default_factory=set)  # commits that failed after the PUT
    live: dict[tuple[str, str, str], VersionRecord] = field(default_factory=dict)
    heads: dict[tuple[str, str], tuple[str, int]] = field(default_factory=dict)
    tags: dict[tuple[str, str, str], str] = field(default_factory=dict)

    def etcd(self) -> Index:
        return Index(
            {ref: version_fields(r) for ref, r in self.live.items()}, self.heads, self.tags
        )


@st.composite
def histories(draw: st.DrawFn) -> History:
    h = History()
    now = T0
    rnd = random.Random(draw(st.integers(0, 2**32)))
    steps = draw(st.lists(st.sampled_from("ccccoomtddrr"), max_size=40))
    for i, step in enumerate(steps):
        now += draw(st.integers(1, 1000))
        artifact = rnd.choice(["ckpt", "model"])
        aref = ("acme", artifact)
        latest, count = h.heads.get(aref, (None, 0))
        mine = [r for r in h.live.values() if r.artifact == artifact]
        if step in "co":  # a commit: its record PUT, then its transaction (or not: "o")
            tag = rnd.choice([None, None, "best", "prod"])
            r = rec(vid(i, 1), count + 1, latest, artifact=artifact, committed_us=now, tag=tag)
            h.records.append(r)
            if step == "o":
                h.orphans.add(r.version)
                continue
            h.live[r.ref] = r
            h.heads[aref] = (r.version, r.seq)
            if tag is not None:
                h.tags[("acme", artifact, tag)] = r.version
        elif step == "m" and mine:  # a tag move
            target = rnd.choice(mine)
            tag = rnd.choice(["best", "prod", "rc"])
            h.journal.append(TagMove("acme", artifact, tag, target.version, now, "ml"))
            h.tags[("acme", artifact, tag)] = target.version
        elif step == "t":  # a tag deletion
            held = [t for t in h.tags if t[1] == artifact]
            if held:
                tref = rnd.choice(sorted(held))
                h.journal.append(TagMove("acme", artifact, tref[2], None, now, "ml"))
                del h.tags[tref]
        elif step in "dr":  # retention deletes one neither latest nor tagged
            kept = {latest, *h.tags.values()}
            free = [r for r in mine if r.version not in kept]
            if free:
                gone = rnd.choice(free)
                h.journal.append(Deletion("acme", artifact, gone.version, gone.seq, now))
                del h.live[gone.ref]
                if step == "d":  # its record object went with its bytes ("r": a stop before)
                    h.records.remove(gone)
    return h


def orphans_missing(h: History) -> Any:
    return lambda r: r.version not in h.orphans


@settings(max_examples=200)
@given(histories())
def test_the_rebuild_gives_back_what_etcd_held(h: History) -> None:
    """With the failed commits' objects not all there, the buckets alone give etcd's
    index exactly: every version, latest, counter, tag."""
    rebuilt = rebuild(h.records, h.journal, orphans_missing(h))
    assert diff(rebuilt.index(), h.etcd()) == []
    assert rebuilt.index() == h.etcd()
    assert {s.record.version for s in rebuilt.set_aside} == h.orphans
    assert not rebuilt.notes


@settings(max_examples=200)
@given(histories(), st.randoms(use_true_random=False), st.integers(0, 3))
def test_the_rebuild_is_the_same_in_any_order_with_any_duplicates(
    h: History, rnd: random.Random, copies: int
) -> None:
    check = orphans_missing(h)
    first = rebuild(h.records, h.journal, check)
    found = h.records + [rnd.choice(h.records) for _ in range(copies * len(h.records) // 2)]
    journal = h.journal + [rnd.choice(h.journal) for _ in range(copies * bool(h.journal))]
    rnd.shuffle(found)
    rnd.shuffle(journal)
    assert rebuild(found, journal, check) == first


@settings(max_examples=200)
@given(histories())
def test_a_rebuild_from_its_own_records_gives_the_same_index(h: History) -> None:
    check = orphans_missing(h)
    first = rebuild(h.records, h.journal, check)
    kept = [r for r in h.records if r.ref in first.records or r.ref in first.deleted]
    again = rebuild(kept, h.journal, everything)
    assert again.index() == first.index()
    assert again.deleted == first.deleted
    assert again.set_aside == ()
    # and from everything it mentions: the same in every part, notes and set-asides too
    mentioned = kept + [s.record for s in first.set_aside]
    assert rebuild(mentioned, h.journal, check) == first


@settings(max_examples=200)
@given(histories())
def test_only_the_doubtful_records_are_checked(h: History) -> None:
    asked: list[str] = []

    def check(r: VersionRecord) -> bool:
        asked.append(r.version)
        return r.version not in h.orphans

    rebuild(h.records, h.journal, check)
    doubted = [r.version for r in doubtful(h.records, h.journal)]
    assert sorted(asked) == sorted(doubted)
    named = {(r.artifact, r.previous) for r in h.records}
    assert not [v for v in doubtful(h.records, h.journal) if (v.artifact, v.version) in named]


@given(st.lists(records(), max_size=6), st.lists(entries, max_size=6))
def test_any_records_and_entries_rebuild_the_same_however_found(
    found: list[VersionRecord], journal: list[Entry]
) -> None:
    check = lambda r: r.size % 2 == 0  # noqa: E731
    first = rebuild(found, journal, check)
    assert rebuild(found[::-1] + found, journal[::-1] + journal, check) == first
    for name, art in first.artifacts.items():
        assert art.latest == art.versions[-1]
        assert art.count >= first.records[(*name, art.latest)].seq


# --- the dry run --------------------------------------------------------------------------


def test_the_dry_run_says_what_differs_line_by_line() -> None:
    a, b, c = vid(1), vid(2), vid(3)
    found = [rec(a, 1), rec(b, 2, a, committed_us=T0 + 1), rec(c, 3, b, committed_us=T0 + 2)]
    journal = [TagMove("acme", "ckpt", "best", b, T0 + 3, "ml")]
    rebuilt = rebuild(found, journal, everything).index()
    assert diff(rebuilt, rebuilt) == []
    etcd_b = {**version_fields(found[1]), "size": 11, "deleting": 1.0}
    etcd_x = version_fields(rec(vid(8), 1, artifact="other"))
    current = Index(
        {
            ("acme", "ckpt", a): version_fields(found[0]),
            ("acme", "ckpt", b): etcd_b,
            ("acme", "other", vid(8)): etcd_x,
        },
        {("acme", "ckpt"): (b, 2), ("acme", "other"): (vid(8), 1)},
        {("acme", "ckpt", "best"): a, ("acme", "ckpt", "old"): a},
    )
    assert diff(rebuilt, current) == [
        f"acme/ckpt: latest is {b} in etcd, {c} rebuilt",
        "acme/ckpt: sequence counter is 2 in etcd, 3 rebuilt",
        f"acme/ckpt: version {b} differs: size 11 in etcd, 10 rebuilt",
        f"acme/ckpt: version {c} (sequence 3) is in the buckets' records, not in etcd",
        f"acme/ckpt: tag best points at {a} in etcd, {b} rebuilt",
        f"acme/ckpt: tag old is in etcd (at {a}), not rebuilt",
        f"acme/other: artifact record in etcd (latest {vid(8)}, sequence counter 1), none rebuilt",
        f"acme/other: version {vid(8)} is in etcd, not in the buckets' records",
    ]
    assert diff(current, rebuilt)[0] == f"acme/ckpt: latest is {c} in etcd, {b} rebuilt"


def test_the_dry_run_compares_times_to_the_microsecond_and_json_by_its_spelling() -> None:
    record = rec(vid(1), 1, metadata={"flag": True, "n": 1})
    fields_ = version_fields(record)
    rebuilt = Index({record.ref: fields_}, {}, {})
    close = {**fields_, "committed": fields_["committed"] + 1e-8}
    assert diff(rebuilt, Index({record.ref: close}, {}, {})) == []
    other = {**fields_, "metadata": {"flag": 1, "n": 1.0}}
    (line,) = diff(rebuilt, Index({record.ref: other}, {}, {}))
    assert 'metadata {"flag":1,"n":1.0} in etcd, {"flag":true,"n":1} rebuilt' in line


def test_the_etcd_tag_record_carries_what_the_rebuild_gives() -> None:
    """The I/O layer writes ``Tag(version, set, namespace)`` from a TagState."""
    a = vid(1)
    state = rebuild([rec(a, 1, tag="best", committed_us=T0 + 7, by="team:ml")], [], everything)
    t = state.tags[("acme", "ckpt", "best")]
    tag = Tag(t.version, t.set_us / 1_000_000, t.by)
    assert micros(Tag.load(tag.dump()).set) == T0 + 7 and tag.namespace == "team:ml"
