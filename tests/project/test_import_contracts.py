"""The import-linter contracts of pyproject.toml (run by `make lint`) cover every top-level
module of o41, every module of the client and of the commands, and every module and package
of the placement service: a new one is placed in a layer, and kept out of the core, by
decision."""

from __future__ import annotations

import pkgutil
import tomllib
from pathlib import Path
from typing import Any

import o41
import o41.cli
import o41.client
import o41.webhook

ROOT = Path(__file__).resolve().parents[2]


def contract(kind: str, **having: Any) -> dict[str, Any]:
    """The one contract of type ``kind`` whose settings include ``having``."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    found: dict[str, Any]
    (found,) = [
        c
        for c in config["contracts"]
        if c["type"] == kind and all(c.get(k) == v for k, v in having.items())
    ]
    return found


def top_level() -> set[str]:
    return {m.name for m in pkgutil.iter_modules(o41.__path__)}


def layered(container: str) -> set[str]:
    layers = contract("layers", containers=[container])["layers"]
    return {part.strip() for layer in layers for part in layer.replace(":", "|").split("|")}


def test_every_top_level_module_is_in_a_layer() -> None:
    assert layered("o41") == top_level()


def test_every_module_of_the_client_is_in_a_layer_of_the_client() -> None:
    assert layered("o41.client") == {m.name for m in pkgutil.iter_modules(o41.client.__path__)}


def test_every_module_of_the_commands_is_in_a_layer_of_them() -> None:
    assert layered("o41.cli") == {m.name for m in pkgutil.iter_modules(o41.cli.__path__)}


def test_every_module_of_the_placement_service_is_in_a_layer_of_it() -> None:
    assert layered("o41.webhook") == {m.name for m in pkgutil.iter_modules(o41.webhook.__path__)}


def test_the_core_may_import_no_other_top_level_module() -> None:
    forbidden = set(contract("forbidden", source_modules=["o41.core"])["forbidden_modules"])
    assert forbidden == {f"o41.{m}" for m in top_level() - {"core"}}
