"""When a call to the placement service is sent again: the hub may blink, the training
step must not.

Every call to the service (the artifacts calls through ``Connection.request``, every
collection operation through ``HttpTransport.call``, the WebSocket's reconnect) goes
through :class:`Retries`: a failure that waiting can cure is tried again, with
exponential backoff and full jitter (a wait drawn between 0 and ``FIRST_WAIT * 2**n``,
at most ``LONGEST_WAIT``), or after what the service's ``Retry-After`` said, until the
deadline (``O41_ARTIFACTS_RETRY_DEADLINE`` seconds, default ``DEFAULT_DEADLINE``; 0: no
retries), with one warning on the ``o41`` logger per retry naming the call, what failed,
the wait and the attempt.

What is tried again (:func:`retryable`), by whether the call is **idempotent** (sending
it twice does what sending it once does: every GET, a write's begin, which makes a new
pending write (a duplicate is one nobody commits: its lease expires and the sweeper
aborts its upload), a part's URLs signed again, an unconditional tag move, and the
collections' operations that say so):

================================================  ===========  ==================
what happened                                     idempotent   any other call
================================================  ===========  ==================
not reached (refused, no such host, connect or
TLS handshake failed or timed out, a proxy's
tunnel refused): :class:`ConnectError`            yes          yes
reached, no answer (reset, read timed out)        yes          no: it may have
                                                               been applied
429 with ``Retry-After`` (a token's rate)         yes          yes (refused
                                                               before acting)
503 with ``Retry-After`` (a token the service
cannot check now: refused before acting)          yes          yes
503 without it (etcd without a majority), 502,
504 (a gateway's)                                 yes          no
503 naming a ``location`` (its bucket failed)     no: the write begins again without it
any other 4xx (a 429 without ``Retry-After`` is
a quota: waiting does not free it), other 5xx     no           no
a certificate this pod does not trust             no           no
================================================  ===========  ==================

What is not idempotent by itself is made so by the service (issue 39, point 2): a
commit (file or directory) is keyed by its write id and a repeat answers the first
answer; a tag's compare-and-set repeated after it moved answers success; and a
collection operation that is not idempotent (a counter's add, a queue's offer and poll,
a dict's or registry's delete and pop) carries an operation id (:func:`operation_id`)
in its arguments (:data:`OPERATION_FIELD`), whose first answer the service keeps with
the effect, in etcd, for ten minutes. Those are retried as an idempotent call is. What
is left (a tag's delete) is sent again only when it provably never reached the service.

Standard library only, imported by ``o41.client.connection`` at a pod's start-up.
"""

from __future__ import annotations

import logging
import os
import random
import time
import uuid
from collections.abc import Callable

from o41.client.errors import ConfigError, O41Error, ServiceError, TransportError

log = logging.getLogger("o41")

ENV_DEADLINE = "O41_ARTIFACTS_RETRY_DEADLINE"
DEFAULT_DEADLINE = 300.0  # seconds a call is tried for: a rollout, an election, a restart
FIRST_WAIT = 0.25  # the first wait's ceiling (seconds); each next one's doubles
LONGEST_WAIT = 15.0  # no backoff waits longer (a Retry-After may)
CONNECT_TIMEOUT = 10.0  # seconds to connect (a proxy's tunnel, the TLS handshake too)

#: Whether the collections' operations that are not idempotent carry an operation id
#: (and are then retried as idempotent ones are): the service remembers them (issue 39,
#: point 2). ``Connection.operation_ids`` turns it off for one connection (a service
#: older than the ids, which would refuse the argument).
OPERATION_IDS = True
OPERATION_FIELD = "operation"

__all__ = [
    "CONNECT_TIMEOUT",
    "DEFAULT_DEADLINE",
    "ENV_DEADLINE",
    "OPERATION_FIELD",
    "OPERATION_IDS",
    "Retries",
    "deadline_of",
    "operation_id",
    "retryable",
]


def deadline_of(given: float | None) -> float:
    """The retry deadline in seconds: ``given``, else ``$O41_ARTIFACTS_RETRY_DEADLINE``,
    else ``DEFAULT_DEADLINE``; :class:`ConfigError` for a value that is not a number of
    seconds (0 or more)."""
    if given is None:
        text = os.environ.get(ENV_DEADLINE, "").strip()
        if not text:
            return DEFAULT_DEADLINE
        try:
            given = float(text)
        except ValueError:
            raise ConfigError(
                f"{ENV_DEADLINE}={text[:40]!r} is not a number of seconds: set it to how long "
                f"a call to the service is tried (default {DEFAULT_DEADLINE:g}; 0: no retries)"
            ) from None
    if not given >= 0 or given == float("inf"):  # NaN too
        raise ConfigError(f"the retry deadline must be 0 or more seconds, not {given!r}")
    return float(given)


def operation_id() -> str:
    """A new operation id: what a collection operation that is not idempotent carries
    (:data:`OPERATION_IDS`), 32 lowercase hex digits, as the service checks."""
    return uuid.uuid4().hex


def retryable(error: BaseException, idempotent: bool) -> bool:
    """Whether ``error`` ends a call that may be sent again (``idempotent``: sending it
    twice does what sending it once does); the table in this module's docstring."""
    if isinstance(error, TransportError):
        return error.retryable and (idempotent or not error.sent)
    if not isinstance(error, ServiceError):
        return False
    said = error.retry_after is not None
    if error.status == 429:
        return said  # a rate, refused before acting; without it, a quota: waiting won't do
    if error.status == 503:
        if error.body.get("location"):
            return False  # a location's bucket failed: the write begins again without it
        return idempotent or said
    return error.status in (502, 504) and idempotent


class Retries:
    """The attempts of one call (``what``: its name in the log, ``GET /v1/...``), within
    ``deadline`` seconds of its first attempt::

        retries = Retries(deadline, "POST /v1/writes")
        while True:
            try:
                return send()
            except O41Error as e:
                if not retries.again(e, idempotent):
                    raise
    """

    def __init__(
        self,
        deadline: float,
        what: str,
        *,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
        draw: Callable[[], float] = random.random,
    ) -> None:
        self.deadline, self.what = deadline, what
        self._sleep, self._clock, self._draw = sleep, clock, draw
        self.started = clock()
        self.attempt = 1  # the one under way
        self.waited = 0.0

    def again(self, error: O41Error, idempotent: bool) -> bool:
        """After a failed attempt: True once this call waited what it should before the next
        (logged); False when ``error`` is to be raised (not retryable, or past the
        deadline, which its message then says)."""
        if self.deadline <= 0:
            return False  # retries are off: the error as it was
        if not retryable(error, idempotent):
            if self.attempt > 1:
                self._say(error, f"gave up at attempt {self.attempt}: this failure is not retried")
            return False
        backoff = self._draw() * min(LONGEST_WAIT, FIRST_WAIT * 2 ** (self.attempt - 1))
        asked = error.retry_after if isinstance(error, ServiceError) else None
        wait = backoff if asked is None else max(float(asked), backoff)
        elapsed = self._clock() - self.started
        left = self.deadline - elapsed
        if asked is not None and asked > left:
            self._say(
                error,
                f"gave up after {self.attempt} attempts in {elapsed:.1f} s: the service asked "
                f"to wait {asked:g} s, past the retry deadline of {self.deadline:g} s "
                f"({ENV_DEADLINE})",
            )
            return False
        if left <= 0:
            self._say(
                error,
                f"gave up after {self.attempt} attempts in {elapsed:.1f} s, at the retry "
                f"deadline of {self.deadline:g} s ({ENV_DEADLINE})",
            )
            return False
        wait = min(wait, left)  # the last attempt at the deadline
        self.attempt += 1
        log.warning(
            "%s: %s; attempt %d in %.1f s (%s; %.1f s left of the %g s retry deadline)",
            self.what,
            _short(error),
            self.attempt,
            wait,
            f"the service said Retry-After {asked:g} s" if asked is not None else "backoff",
            left - wait,
            self.deadline,
        )
        self._sleep(wait)
        self.waited += wait
        return True

    def _say(self, error: O41Error, how: str) -> None:
        """``error``'s message says how the retries ended (``how``) and what it waited for."""
        if error.args and isinstance(error.args[0], str):
            error.args = (f"{error.args[0]} ({self.what}: {how})", *error.args[1:])


def _short(error: BaseException, limit: int = 300) -> str:
    """What failed, for a retry's log line: the error's message without its advice."""
    text = (str(error) or type(error).__name__).split("; check ", 1)[0]
    return text if len(text) <= limit else text[: limit - 3] + "..."
