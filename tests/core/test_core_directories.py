"""The pure rules of directory versions: paths, the manifest and its bounds (examples and
properties)."""

from __future__ import annotations

import posixpath

import pytest
from hypothesis import given
from hypothesis import strategies as st

from o41.core.directories import (
    MAX_FILES,
    MAX_MANIFEST_BYTES,
    MAX_NAME_BYTES,
    MAX_PATH_BYTES,
    DirectoryRefused,
    FileEntry,
    check_manifest,
    children,
    dump_manifest,
    find,
    is_folder,
    load_manifest,
    path_problem,
)
from o41.core.writes import WriteRefused

MD5 = "d41d8cd98f00b204e9800998ecf8427e"

# names as file systems make them: any text but '/' and NUL (the rules refuse some)
names = st.text(st.characters(blacklist_characters="/\x00"), min_size=1, max_size=20)
paths = st.lists(names, min_size=1, max_size=5).map("/".join)
good_names = st.text("abcXYZ019_. -é", min_size=1, max_size=12).filter(
    lambda n: n not in (".", "..")
)
good_paths = st.lists(good_names, min_size=1, max_size=4).map("/".join)


@given(paths)
def test_an_accepted_path_stays_inside_the_directory(path: str) -> None:
    """Whatever the rules accept, joined to a root, normalizes to a place under it: no
    accepted path can climb out, be absolute, or name the root itself."""
    if path_problem(path) is None:
        joined = posixpath.normpath(posixpath.join("/root/out", path))
        assert joined.startswith("/root/out/")
        assert joined == "/root/out/" + path  # nothing to normalize: '.', '..', '//' refused


@given(st.lists(names, min_size=0, max_size=3), st.lists(names, min_size=0, max_size=3))
def test_a_dot_dot_anywhere_is_refused(before: list[str], after: list[str]) -> None:
    why = path_problem("/".join([*before, "..", *after]))
    assert why is not None


@pytest.mark.parametrize(
    ("path", "says"),
    [
        ("", "empty"),
        ("/abs", "absolute"),
        ("a/", "empty name"),
        ("a\\b", "backslash"),
        ("a\tb", "control"),
        ("\ud800", "UTF-8"),
        ("x" * (MAX_PATH_BYTES + 1), "bytes"),
        ("y" * (MAX_NAME_BYTES + 1), "name over"),
        ("é" * (MAX_PATH_BYTES // 2 + 1), "bytes"),  # counted in UTF-8 bytes, not characters
    ],
)
def test_bad_paths_say_why(path: str, says: str) -> None:
    why = path_problem(path)
    assert why is not None and says in why


def test_good_paths() -> None:
    for path in ("a", "a/b/c.safetensors", "name with spaces é.txt", ".hidden", "a..b", "…"):
        assert path_problem(path) is None, path


@given(st.lists(st.tuples(good_paths, st.integers(0, 10**9)), min_size=1, max_size=30))
def test_a_manifest_is_sorted_checked_and_round_trips(rows: list[tuple[str, int]]) -> None:
    entries = [FileEntry(p, s, MD5) for p, s in rows]
    paths_ = [e.path for e in entries]
    clash = len(set(paths_)) != len(paths_) or any(
        q.startswith(p + "/") for p in paths_ for q in paths_
    )
    if clash:
        with pytest.raises(DirectoryRefused):
            check_manifest(entries)
        return
    checked = check_manifest(entries)
    assert [e.path for e in checked] == sorted(paths_)
    assert load_manifest(dump_manifest(checked)) == checked
    for e in checked:
        assert find(checked, e.path) == e
        parent = e.path.rpartition("/")[0]
        assert is_folder(checked, parent)
        files, _ = children(checked, parent)
        assert e in files
    assert find(checked, "no such file at all") is None


def test_the_bounds() -> None:
    assert issubclass(DirectoryRefused, WriteRefused)  # a 400 at the service
    with pytest.raises(DirectoryRefused, match="no files"):
        check_manifest([])
    with pytest.raises(DirectoryRefused, match=f"at most {MAX_FILES}"):
        check_manifest(FileEntry(f"f{i}", 0, MD5) for i in range(MAX_FILES + 1))
    check_manifest(FileEntry(f"f{i}", 0, MD5) for i in range(MAX_FILES))  # the most taken
    long = [FileEntry(f"{i:05d}/" + "p" * 200, 0, MD5) for i in range(MAX_FILES)]
    with pytest.raises(DirectoryRefused, match=f"at most {MAX_MANIFEST_BYTES}"):
        check_manifest(long)
    with pytest.raises(DirectoryRefused, match="a file and a folder"):
        check_manifest([FileEntry("a", 1, MD5), FileEntry("a b", 1, MD5), FileEntry("a/b", 1, MD5)])
    with pytest.raises(DirectoryRefused, match="md5"):
        check_manifest([FileEntry("a", 1, "XYZ")])
    with pytest.raises(DirectoryRefused, match="bytes"):
        check_manifest([FileEntry("a", -1, MD5)])


def test_children_of_the_top_and_a_folder() -> None:
    entries = check_manifest(
        FileEntry(p, 1, MD5) for p in ("README", "train/a", "train/b", "train/deep/c", "val/d")
    )
    files, folders = children(entries, "")
    assert ([f.path for f in files], folders) == (["README"], ["train", "val"])
    files, folders = children(entries, "train")
    assert ([f.path for f in files], folders) == (["train/a", "train/b"], ["train/deep"])
    assert is_folder(entries, "train/deep") and not is_folder(entries, "trai")
