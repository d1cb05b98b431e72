"""The placement service as this process reaches it: one :class:`Connection`.

Where (the endpoint), as whom (a token, or a token file read again as the kubelet rotates
it), trusting which CA (an ``https://`` endpoint), from which place, and how long to wait
for an answer. A connection reads its arguments and the environment once, when it is made;
the artifacts client (``o41.client.artifacts.Artifacts``, and the SDK's ``Client`` on it)
sends its calls through :meth:`Connection.request`, and the collections' transport
(``o41.client.transport.HttpTransport``) opens its sockets with the connection's endpoint,
token and TLS context, so one connection serves both sides with the same settings and
both say the same errors (``o41.client.errors``). What is said of the service as a whole
belongs here too: every call is tried again within the retry deadline when the service
blinks (``o41.client.backoff`` says what is retried), each attempt with a connect and a
read timeout, through the proxy the environment names (``o41.client.transfers.proxy_for``).

The environment, read by :class:`Connection` alone:

========================== ==============================================================
``O41_ARTIFACTS_ENDPOINT``  the service's URL, when no endpoint is given
``O41_ARTIFACTS_TOKEN``     the token itself (a VM's service token), unless a token or a
                            token file is given
``O41_ARTIFACTS_TOKEN_FILE`` the token's file, else the pod's ServiceAccount token
``O41_ARTIFACTS_CA_FILE``   the CA bundle of an ``https://`` service, when none is given
``O41_ARTIFACTS_RETRY_DEADLINE`` seconds a call is tried for when the service blinks
                            (default 300; 0: no retries), when no ``retry_deadline``
``O41_COLLECTIONS_ENDPOINT``, this cluster's collections tier, its CA and token file: where
``..._CA_FILE``, ``..._TOKEN_FILE`` ``sky.*`` goes (``o41.client.endpoints`` chooses)
``HTTPS_PROXY``, ...        the proxy (``HTTP_PROXY``, ``NO_PROXY``, lowercase too), as
                            requests reads them
========================== ==============================================================

Standard library only; pods import it at start-up, so what only the artifacts' calls
need (``http.client``, through ``o41.client.transfers``) is imported on their first call:
``import o41.sky`` costs no more for it.
"""

from __future__ import annotations

import json
import os
import ssl
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from o41.client import backoff
from o41.client.backoff import ENV_DEADLINE, Retries, deadline_of
from o41.client.errors import (
    ConfigError,
    ConnectError,
    O41Error,
    TransportError,
    Unauthorized,
    service_error,
)
from o41.client.tls import ENV_CA_FILE, ca_file_of, service_context, untrusted

if TYPE_CHECKING:
    from o41.core.places import Place

ENV_ENDPOINT = "O41_ARTIFACTS_ENDPOINT"
ENV_TOKEN_FILE = "O41_ARTIFACTS_TOKEN_FILE"  # noqa: S105 - a variable name
# the token itself (a VM's service token, passed as a secret env var), before any file
ENV_TOKEN = "O41_ARTIFACTS_TOKEN"  # noqa: S105 - a variable name
SA_TOKEN = "/var/run/secrets/kubernetes.io/serviceaccount/token"  # noqa: S105 - a path
DEFAULT_TIMEOUT = 60.0  # seconds to wait for an answer
IDEMPOTENT_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})

__all__ = [
    "DEFAULT_TIMEOUT",
    "ENV_CA_FILE",
    "ENV_DEADLINE",
    "ENV_ENDPOINT",
    "ENV_TOKEN",
    "ENV_TOKEN_FILE",
    "SA_TOKEN",
    "Connection",
    "connection_of",
]


class Connection:
    """The placement service at ``endpoint`` (default ``$O41_ARTIFACTS_ENDPOINT``; None
    when neither: :attr:`url` says what to set).

    ``token``: the bearer token itself (default ``$O41_ARTIFACTS_TOKEN``, unless a
    ``token_file`` is given); else ``token_file`` (default ``$O41_ARTIFACTS_TOKEN_FILE``,
    else the pod's ServiceAccount token), read again as it rotates. ``ca_file``: the CA
    bundle that checks an ``https://`` service (default ``$O41_ARTIFACTS_CA_FILE``;
    neither: the system's roots). ``place``: this pod's place (default: detected once per
    process, on first use). ``timeout``: seconds to wait for an answer (default 60; a
    call that waits on the service, a barrier's or a lock's, gets its wait on top).
    ``connect_timeout``: seconds to connect (default 10). ``retry_deadline``: seconds a
    call is tried for while the service cannot answer (default
    ``$O41_ARTIFACTS_RETRY_DEADLINE``, else 300; 0: no retries; ``o41.client.backoff``).

    :attr:`operation_ids` (``backoff.OPERATION_IDS``): whether the collection operations
    that are not idempotent send an operation id, and so may be retried.
    """

    #: Whether a collection operation that is not idempotent sends an operation id (and
    #: is then retried as an idempotent one is): the service remembers them.
    operation_ids: bool = backoff.OPERATION_IDS
    #: What an error calls the service, and the variable it says to check (a collections
    #: tier's connection, ``o41.client.endpoints.TierConnection``, says its own).
    service: str = "the placement service"
    named_by: str = ENV_ENDPOINT

    def __init__(
        self,
        endpoint: str | None = None,
        *,
        token: str | None = None,
        token_file: str | None = None,
        ca_file: str | None = None,
        place: Place | None = None,
        timeout: float | None = None,
        connect_timeout: float | None = None,
        retry_deadline: float | None = None,
    ) -> None:
        endpoint = endpoint or os.environ.get(ENV_ENDPOINT)
        self.endpoint: str | None = endpoint.rstrip("/") if endpoint else None
        named = token_file or os.environ.get(ENV_TOKEN_FILE)
        self.token_file: str = named or SA_TOKEN
        self._named_file = bool(named)  # a file the user named: it must be there
        if not token and not token_file:
            token = os.environ.get(ENV_TOKEN, "").strip()
        self._token = token or None
        self._read = (float("-inf"), "")  # when the token file was last read, and what
        self._missing: str | None = None  # why the token file gave no token, if it did not
        self.ca_file: str | None = ca_file_of(ca_file)
        self.timeout: float = DEFAULT_TIMEOUT if timeout is None else timeout
        self.connect_timeout: float = (
            backoff.CONNECT_TIMEOUT if connect_timeout is None else connect_timeout
        )
        self.retry_deadline: float = deadline_of(retry_deadline)
        self._place = place

    def __repr__(self) -> str:
        return (
            f"Connection({self.endpoint!r}, token_file={self.token_file!r}, "
            f"ca_file={self.ca_file!r}, timeout={self.timeout!r}, "
            f"retry_deadline={self.retry_deadline!r})"
        )

    @property
    def url(self) -> str:
        """The endpoint; :class:`~o41.client.errors.ConfigError` when there is none."""
        if not self.endpoint:
            raise ConfigError(
                f"no placement service endpoint: set {ENV_ENDPOINT} or pass --endpoint"
            )
        return self.endpoint

    @property
    def place(self) -> Place:
        """This pod's place: the one given, else detected once per process (env,
        SkyPilot, cloud metadata, none)."""
        if self._place is None:
            from o41.client.place import detect_place

            self._place = detect_place()
        return self._place

    def bearer(self, max_age: float = 0.0) -> str:
        """The token to send ("" for none): the one given, else the token file's, read
        again when the last read is older than ``max_age`` seconds (projected tokens
        rotate)."""
        if self._token is not None:
            return self._token
        read_at, token = self._read
        if time.monotonic() - read_at >= max_age:
            try:
                with open(self.token_file) as f:
                    token = f.read().strip()
                self._missing = None if token else f"the token file {self.token_file} is empty"
            except OSError as e:
                why = e.strerror or type(e).__name__
                if self._named_file:  # named by the user: said now, naming it
                    raise ConfigError(
                        f"cannot read the token file {self.token_file}: {why}; fix "
                        f"--token-file or {ENV_TOKEN_FILE}, or set {ENV_TOKEN}"
                    ) from None
                token = ""  # not in a pod: no token, and a 401 says which file was missing
                self._missing = (
                    f"no token was sent: {self.token_file} (the pod's ServiceAccount token) "
                    f"cannot be read ({why}); outside a pod set {ENV_TOKEN} or "
                    f"{ENV_TOKEN_FILE}"
                )
            self._read = (time.monotonic(), token)
        return token

    def unauthorized(self, error: O41Error) -> O41Error:
        """``error`` (a 401), its message saying why no token was sent, when none was."""
        if isinstance(error, Unauthorized) and self._token is None and self._missing:
            error.args = (f"{error}; {self._missing}", *error.args[1:])
        return error

    def forget_token(self) -> None:
        """Read the token file again on the next :meth:`bearer` (the service said the
        token is no longer good)."""
        self._read = (float("-inf"), "")

    def tls(self) -> ssl.SSLContext | None:
        """The TLS context for the service (None: a plain ``http://`` endpoint);
        :class:`~o41.client.errors.CaFileError`, naming the file and the fix, when the CA
        bundle cannot be used."""
        return service_context(self.ca_file) if self.url.startswith("https:") else None

    def untrusted(self, error: BaseException, shown: str | None = None) -> str | None:
        """What to say when ``error`` is the service's certificate failing the check (None
        for any other error); ``shown``: the endpoint as the message names it."""
        return untrusted(error, shown or self.url, self.ca_file)

    def request(
        self,
        method: str,
        path: str,
        body: Mapping[str, Any] | None = None,
        *,
        idempotent: bool | None = None,
        wait: float = 0.0,
    ) -> Any:
        """One JSON call to the service (``path`` from the root, with its query): its JSON
        answer; an answer of 400 or more raises its :func:`~o41.client.errors.service_error`,
        no answer :class:`~o41.client.errors.TransportError`. Tried again within
        :attr:`retry_deadline` when the service blinks, as ``o41.client.backoff`` says:
        ``idempotent`` (default: a GET or HEAD) says whether sending it twice does what
        sending it once does. ``wait``: seconds the service may wait before it answers (a
        long poll), on top of the read timeout."""
        if idempotent is None:
            idempotent = method in IDEMPOTENT_METHODS
        retries = Retries(self.retry_deadline, f"{method} {path.partition('?')[0]}")
        while True:
            try:
                return self._send(method, path, body, wait)
            except O41Error as e:
                if not retries.again(e, idempotent):
                    if isinstance(e, TransportError) and e.sent and not idempotent:
                        e.args = (f"{e}; the request may or may not have been applied",)
                    raise

    def _send(
        self,
        method: str,
        path: str,
        body: Mapping[str, Any] | None,
        wait: float,
    ) -> Any:
        """One attempt of :meth:`request`."""
        import http.client

        from o41.client.transfers import connection as http_connection  # the artifacts' alone

        endpoint = self.url
        read_timeout = self.timeout + wait
        conn, target = http_connection(endpoint + path, read_timeout, self.tls())
        headers = {"Accept": "application/json"}
        token = self.bearer()
        if token:
            headers["Authorization"] = f"Bearer {token}"
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        try:
            conn.timeout = self.connect_timeout  # the connection, a tunnel, TLS: this long
            try:
                conn.connect()
            except OSError as e:
                raise self.unreached(e) from None
            assert conn.sock is not None
            conn.sock.settimeout(read_timeout)
            try:
                conn.request(method, target, body=data, headers=headers)
                resp = conn.getresponse()
                raw = resp.read()
            except (OSError, http.client.HTTPException) as e:
                raise TransportError(
                    f"{self.service} at {endpoint} did not answer: "
                    f"{_why(e, read_timeout)}; check {self.named_by} and that the service "
                    "runs, then retry"
                ) from None
        finally:
            conn.close()
        try:
            answer = json.loads(raw) if raw else {}
        except ValueError:
            answer = {"error": raw[:200].decode(errors="replace")}
        if resp.status >= 400:
            message = answer.get("error") if isinstance(answer, dict) else None
            found = answer if isinstance(answer, dict) else {}
            error = service_error(
                resp.status,
                str(message or f"HTTP {resp.status}"),
                found,
                resp.getheader("Retry-After"),
            )
            raise self.unauthorized(error)
        return answer

    def unreached(self, e: OSError, shown: str | None = None) -> TransportError:
        """The error of a connection to the service (``shown``: the endpoint as the message
        names it) that failed before anything was sent: :class:`ConnectError`, which is
        safe to retry, or a :class:`TransportError` that is not retried (a certificate
        this pod does not trust)."""
        where = shown or self.url
        refused = self.untrusted(e, shown)
        if refused is not None:
            error = TransportError(refused)
            error.retryable = False
            return error
        return ConnectError(
            f"cannot reach {self.service} at {where}: {_why(e, self.connect_timeout)}; "
            f"check {self.named_by} and that the service runs, then retry"
        )


def _why(e: BaseException, timeout: float) -> str:
    """What a failed exchange says: a timeout names its seconds."""
    if isinstance(e, TimeoutError):  # socket.timeout too
        return f"no answer within {timeout:g} s (timed out)"
    return str(e) or type(e).__name__


def connection_of(connection: Connection | None, **settings: Any) -> Connection:
    """``connection``, or one made of ``settings`` (:class:`Connection`'s arguments; None:
    not given). Both: :class:`TypeError`, since the settings would not be used."""
    if connection is None:
        return Connection(**settings)
    given = sorted(name for name, value in settings.items() if value is not None)
    if given:
        raise TypeError(f"give a connection or its settings ({', '.join(given)}), not both")
    return connection
