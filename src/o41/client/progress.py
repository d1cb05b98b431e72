"""How a transfer says how far it is: a tqdm bar, and/or a callback the caller gave.

- **A bar** (tqdm, ``tqdm.auto``): on a terminal, the usual bar on stderr; in Jupyter, the
  notebook's widget; anywhere else (a pod's log, a file) no bar at all but a line of text,
  the first after LOG_DELAY seconds (a transfer shorter than that prints nothing) and then
  at most one every LOG_EVERY seconds, and a last one when it ends. Off with
  ``O41_ARTIFACTS_PROGRESS=0`` (also ``off``, ``false``, ``no``), or tqdm's own
  ``TQDM_DISABLE=1``.
- **A callback**: ``callback=`` on ``write``, ``read``, ``read_bytes``, ``read_file`` and
  ``o41://``'s ``get_file``/``put_file``: an ``fsspec.callbacks.Callback`` (or anything with
  ``set_size(n)`` and ``relative_update(n)``), told the size once, then each count of
  bytes as it goes (they add up to the size). A call given a callback shows no bar: code
  that shows its own progress is not drawn over.

The bar is made only when a transfer starts, and tqdm imported then: ``import o41.sky``
costs nothing for it.
"""

from __future__ import annotations

import os
import sys
import threading
from typing import TYPE_CHECKING, Any, Protocol, TextIO

if TYPE_CHECKING:
    from tqdm import tqdm

ENV_PROGRESS = "O41_ARTIFACTS_PROGRESS"
OFF = frozenset({"0", "off", "false", "no"})
#: Not on a terminal or in a notebook: the first line after this many seconds, then at
#: most one every LOG_EVERY.
LOG_DELAY = 10.0
LOG_EVERY = 30.0


class Callback(Protocol):
    """What a transfer tells a caller's callback (``fsspec.callbacks.Callback`` has it)."""

    def set_size(self, size: int) -> Any: ...

    def relative_update(self, inc: int = 1) -> Any: ...


def enabled() -> bool:
    """Whether bars are shown (``O41_ARTIFACTS_PROGRESS``; default yes)."""
    return os.environ.get(ENV_PROGRESS, "").strip().lower() not in OFF


class _Lines:
    """A stream for tqdm that is no terminal: each refresh of the bar becomes one line
    (tqdm's carriage returns would make one endless line of a pod's log)."""

    def __init__(self, out: TextIO) -> None:
        self._out = out

    def write(self, text: str) -> None:
        line = text.replace("\r", "").rstrip()
        if line:
            self._out.write(line + "\n")

    def flush(self) -> None:
        self._out.flush()


def _bar(total: int, label: str) -> tqdm[Any]:
    from tqdm import std
    from tqdm.auto import tqdm as auto
    from tqdm.autonotebook import tqdm as notebook  # std.tqdm outside a notebook

    common: dict[str, Any] = {
        "total": total,
        "desc": label,
        "unit": "B",
        "unit_scale": True,
        "unit_divisor": 1024,
    }
    if notebook is not std.tqdm or sys.stderr.isatty():  # a notebook's widget, or a terminal
        return auto(**common, leave=False, dynamic_ncols=True)
    return std.tqdm(
        **common,
        file=_Lines(sys.stderr),
        ascii=True,
        ncols=100,
        delay=LOG_DELAY,
        mininterval=LOG_EVERY,
        maxinterval=LOG_EVERY * 4,
    )


class Progress:
    """A transfer of ``total`` bytes (``label``: "download from LOCATION"), told each count
    of bytes as they go (``progress(n)``, from any thread): a bar (see the module) unless
    ``show`` is False, progress is turned off or a ``callback`` is given; the callback's
    ``set_size(total)`` now, its ``relative_update(n)`` with each count."""

    def __init__(
        self,
        total: int,
        label: str,
        callback: Callback | None = None,
        *,
        show: bool | None = None,
    ) -> None:
        self.total, self.label, self.done = total, label, 0
        self._callback = callback
        self._lock = threading.Lock()
        self._bar: tqdm[Any] | None = None
        if callback is not None:
            callback.set_size(total)
        if show is None:
            show = callback is None and enabled()
        if show and total > 0:
            self._bar = _bar(total, label)

    def __call__(self, n: int) -> None:
        if not n:
            return
        with self._lock:
            self.done += n
            if self._callback is not None:
                self._callback.relative_update(n)
            if self._bar is not None:
                self._bar.update(n)

    def close(self) -> None:
        with self._lock:
            if self._bar is not None:
                self._bar.close()
                self._bar = None

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
