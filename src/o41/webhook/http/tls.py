"""HTTPS on the service's own port: pods of other clusters and VMs reach the hub over
networks we do not own, with bearer tokens in every request.

The certificate and key are files (the chart mounts a Secret: cert-manager's, or one it
generated) named by ``O41_TLS_CERT_FILE`` and ``O41_TLS_KEY_FILE``. Renewed files are
taken without a restart: each new connection's handshake looks at the files' mtimes (two
``stat`` calls, at most once every ``check_every`` seconds) and, when they changed, loads
them into a new context that this and later connections use. Connections already open
keep the certificate they began with. A pair that does not load (the kubelet swapping the
files, a key that does not match) keeps the old one serving, with a warning, and is
tried again at the next check.
"""

from __future__ import annotations

import logging
import os
import ssl
import time
from collections.abc import Mapping
from dataclasses import dataclass

log = logging.getLogger("o41.webhook.tls")

ENV_CERT_FILE = "O41_TLS_CERT_FILE"
ENV_KEY_FILE = "O41_TLS_KEY_FILE"
CHECK_EVERY = 10.0  # seconds between looks at the files (kubelet updates a Secret ~1 min late)


@dataclass(frozen=True)
class ServingTls:
    """The serving certificate (chain first) and its key: paths to PEM files."""

    cert_file: str
    key_file: str

    @classmethod
    def from_environment(cls, env: Mapping[str, str]) -> ServingTls | None:
        """From ``O41_TLS_CERT_FILE`` and ``O41_TLS_KEY_FILE``; None when neither is set.
        ValueError, saying what to fix, when only one is or they do not load."""
        cert, key = env.get(ENV_CERT_FILE) or "", env.get(ENV_KEY_FILE) or ""
        if not cert and not key:
            return None
        if not cert or not key:
            given, missing = (
                (ENV_CERT_FILE, ENV_KEY_FILE) if cert else (ENV_KEY_FILE, ENV_CERT_FILE)
            )
            raise ValueError(
                f"{given} is set but {missing} is not: give both (the certificate and its "
                "key) to serve HTTPS, or neither to serve plain HTTP"
            )
        found = cls(cert, key)
        found.context()  # a mistake stops the service at start, in one line
        return found

    def context(self) -> ssl.SSLContext:
        """A server context with these files, TLS 1.2 or later; ValueError naming the
        files and what to fix when they do not load."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        try:
            context.load_cert_chain(self.cert_file, self.key_file)
        except ssl.SSLError as e:  # an OSError too: first
            raise ValueError(
                f"the serving certificate {self.cert_file} and key {self.key_file} do not "
                f"load ({e.reason or e}): give a PEM certificate (chain first) and the PEM "
                "key it was issued for"
            ) from None
        except OSError as e:
            raise ValueError(
                f"cannot read the serving certificate {self.cert_file} or its key "
                f"{self.key_file} ({e.strerror or e}): check {ENV_CERT_FILE} and {ENV_KEY_FILE}"
            ) from None
        return context

    def stamp(self) -> tuple[int, ...]:
        """What changes when either file is replaced (mtime and size; -1 if unreadable)."""
        found: list[int] = []
        for path in (self.cert_file, self.key_file):
            try:
                st = os.stat(path)
            except OSError:
                found += [-1, -1]
            else:
                found += [st.st_mtime_ns, st.st_size]
        return tuple(found)


class Reloading:
    """The context to give the listener: it serves ``tls``'s files and moves each new
    connection to a fresh context once the files changed (``sni_callback``, which OpenSSL
    calls on every handshake, SNI or not)."""

    def __init__(self, tls: ServingTls, check_every: float = CHECK_EVERY) -> None:
        self.tls = tls
        self.check_every = check_every
        self._stamp = tls.stamp()
        self.current = tls.context()
        self.base = tls.context()  # the listener's; only its callback matters after start
        self.base.sni_callback = self._handshake
        self._checked = time.monotonic()
        self.reloads = 0

    def _handshake(
        self, conn: ssl.SSLObject | ssl.SSLSocket, server_name: str | None, _: ssl.SSLContext
    ) -> None:
        self.refresh()
        conn.context = self.current

    def refresh(self) -> None:
        """Load the files again if a check is due and they changed."""
        now = time.monotonic()
        if now - self._checked < self.check_every:
            return
        self._checked = now
        stamp = self.tls.stamp()
        if stamp == self._stamp:
            return
        try:
            fresh = self.tls.context()
        except ValueError as e:
            log.warning("serving certificate not renewed, the old one still serves: %s", e)
            return
        self.current, self._stamp = fresh, stamp
        self.reloads += 1
        log.info("serving certificate %s loaded again (renewed)", self.tls.cert_file)
