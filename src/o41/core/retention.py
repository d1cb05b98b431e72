"""Retention: which of an artifact's versions an organization's rule lets go, as plain
functions of data (issue 17, point 6; docs/artifacts.md "Retention").

- A **rule** (``spec.retention`` of the Organization, written by the platform engineer)
  names artifacts by a glob pattern (``ckpt-*``; ``fnmatch`` rules, case-sensitive) and
  how many versions of each to keep (``keepVersions``, at least 1). The first rule whose
  pattern matches the artifact's name applies; an artifact no rule matches keeps every
  version (retention is off by default).
- A version is kept when it is one of the newest ``keep`` versions (by commit), when a tag
  points at it, or when it is ``latest``. Every other version is let go.
- A version being deleted already (a mark left by a retention pass that stopped between
  its steps) is finished, unless a tag points at it: then it is restored.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

#: A rule's pattern: what an artifact name may hold, plus the glob's ``*``, ``?`` and
#: ``[...]``.
PATTERN = r"^[A-Za-z0-9*?\[\]!._-]{1,200}$"
MAX_RULES = 100
MAX_KEEP = 1_000_000

_PATTERN = re.compile(PATTERN)


@dataclass(frozen=True, slots=True)
class Rule:
    artifacts: str  # a glob over artifact names
    keep: int  # the newest versions kept, at least 1

    def matches(self, artifact: str) -> bool:
        return fnmatch.fnmatchcase(artifact, self.artifacts)


def rules_of(raw: object) -> tuple[Rule, ...]:
    """The rules an Organization's ``spec.retention`` holds; an entry that is not a rule
    (the CRD admits none, but an object can predate it) is left out, so it keeps data
    rather than deleting by a guess."""
    if not isinstance(raw, list):
        return ()
    rules: list[Rule] = []
    for entry in raw[:MAX_RULES]:
        if not isinstance(entry, Mapping):
            continue
        pattern, keep = entry.get("artifacts"), entry.get("keepVersions")
        if not isinstance(pattern, str) or _PATTERN.fullmatch(pattern) is None:
            continue
        if isinstance(keep, bool) or not isinstance(keep, int) or not 1 <= keep <= MAX_KEEP:
            continue
        rules.append(Rule(pattern, keep))
    return tuple(rules)


def keep_for(rules: Iterable[Rule], artifact: str) -> int | None:
    """How many versions of ``artifact`` the first matching rule keeps; None: every one."""
    for rule in rules:
        if rule.matches(artifact):
            return rule.keep
    return None


@dataclass(frozen=True, slots=True)
class Row:
    """One version as the index lists it (newest first)."""

    version: str
    deleting: bool = False  # marked by a retention pass that did not finish


@dataclass(frozen=True, slots=True)
class Decision:
    delete: tuple[str, ...]  # to delete (marked ones to finish, then others), oldest last
    restore: tuple[str, ...]  # marked, but a tag points at them now: unmark
    kept: int  # versions of ``rows`` counted in the newest ``keep``


def choose(rows: Sequence[Row], keep: int, protected: Collection[str], kept: int = 0) -> Decision:
    """What to do with ``rows`` (versions newest first) under a rule keeping ``keep``;
    ``protected``: the versions tags point at, and ``latest``. ``kept``: how many newer
    versions (earlier pages) were counted already.

    A marked row is not counted among the kept: it was let go by an earlier pass, whose
    decision stands unless a tag points at it now (then it is restored, and counted)."""
    delete: list[str] = []
    restore: list[str] = []
    for row in rows:
        if row.version in protected:
            if row.deleting:
                restore.append(row.version)  # an ordinary version again: counted below
            if kept < keep:
                kept += 1
            continue
        if row.deleting:
            delete.append(row.version)
        elif kept < keep:
            kept += 1
        else:
            delete.append(row.version)
    return Decision(tuple(delete), tuple(restore), kept)


def rules_json(rules: Iterable[Rule]) -> list[dict[str, Any]]:
    return [{"artifacts": r.artifacts, "keepVersions": r.keep} for r in rules]
