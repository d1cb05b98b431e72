"""What the directory versions' routes answer: each answer's one description, built by
the views and made the document's schemas by ``o41.webhook.openapi``. A directory's begin
and commit answer what a file's do (``o41.webhook.writes.answers``), with its files."""

from __future__ import annotations

from typing import Annotated, NotRequired

from pydantic import Field
from typing_extensions import TypedDict

from o41.webhook.buckets import Signed
from o41.webhook.writes.answers import CommitOut, Located, PlacedOut, UploadsLast


class SignedFile(Signed):
    path: str


class DirectoryBeginOut(PlacedOut):
    files: Annotated[
        list[SignedFile], Field(description="One PUT per file, in the manifest's order.")
    ]
    expiresIn: UploadsLast


class DirectoryCommitOut(CommitOut):
    files: Annotated[int, Field(description="How many files it has.")]


class FileOut(TypedDict):
    path: str
    size: int
    md5: str
    download: NotRequired[Annotated[Signed, Field(description="With download=true.")]]


class FilesOut(Located):
    """A directory version's files, sorted by path, and where they live."""

    files: list[FileOut]


class FileReadOut(Located):
    """One file of a directory version (its size and MD5 are the file's), and its
    download."""

    path: str
    download: Signed
