"""Small helpers shared by the tests."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import yaml

T = TypeVar("T")


def wait_for(check: Callable[[], T | None], timeout: float, what: str, interval: float = 0.2) -> T:
    """Poll ``check`` until it returns something truthy, and return that; fail with the
    last value seen after ``timeout`` seconds. Never a fixed sleep."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}; last: {last!r}")


async def wait_for_async(
    check: Callable[[], Awaitable[T | None]], seconds: float, what: str, interval: float = 0.2
) -> T:
    """``wait_for`` for a check that is a coroutine: it never blocks the event loop."""
    deadline = time.monotonic() + seconds
    last: T | None = None
    while time.monotonic() < deadline:
        last = await check()
        if last:
            return last
        await asyncio.sleep(interval)
    raise AssertionError(f"timed out after {seconds} s waiting for {what}; last: {last!r}")


def token_kubeconfig(admin: Path, token: str, user: str, path: Path) -> Path:
    """A kubeconfig that is ``user`` by ``token``, on the cluster (server, CA) of the
    ``admin`` kubeconfig: to act as a ServiceAccount with kubectl."""
    cluster = yaml.safe_load(admin.read_text())["clusters"][0]["cluster"]
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": cluster}],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": user}}],
        "current-context": "c",
    }
    path.write_text(json.dumps(config))
    return path
