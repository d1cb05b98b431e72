"""Small helpers shared by the tests."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

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
