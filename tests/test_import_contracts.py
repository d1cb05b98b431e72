"""The import-linter contracts of pyproject.toml (run by `make lint`) cover every top-level
module of o41: a new one is placed in a layer, and kept out of the core, by decision."""

from __future__ import annotations

import pkgutil
import tomllib
from pathlib import Path
from typing import Any

import o41

ROOT = Path(__file__).resolve().parent.parent


def contracts() -> dict[str, dict[str, Any]]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    return {c["type"]: c for c in config["contracts"]}


def top_level() -> set[str]:
    return {m.name for m in pkgutil.iter_modules(o41.__path__)}


def test_every_top_level_module_is_in_a_layer() -> None:
    layers = contracts()["layers"]["layers"]
    named = {part.strip() for layer in layers for part in layer.replace(":", "|").split("|")}
    assert named == top_level()


def test_the_core_may_import_no_other_top_level_module() -> None:
    forbidden = set(contracts()["forbidden"]["forbidden_modules"])
    assert forbidden == {f"o41.{m}" for m in top_level() - {"core"}}
