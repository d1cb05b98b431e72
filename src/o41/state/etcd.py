"""The state store on etcd, through aetcd's gRPC stubs (asyncio).

One gRPC channel per etcd member. Writes and linearizable reads go to the leader when it is
known (a follower would forward them: one more hop); serializable reads ("eventual") go to
the first endpoint listed (list the nearest member first), which answers alone, without a
quorum (so they still answer when etcd has lost its majority). When a member stops
answering, the call moves on to the next member; every call is bounded by ``timeout``
seconds and fails with :class:`StoreUnavailable` past it (etcd without a majority never
hangs a caller).

``https://`` endpoints are spoken to over TLS, with a client certificate when etcd asks
for one (:class:`o41.state.EtcdTls`); all endpoints take one scheme. The files are looked
at again every :data:`RELOAD_CHECK` seconds: a renewed certificate is used without a
restart (new calls open new channels; the old ones close once their calls are done).

A write is retried on another member only when etcd certainly did not take it (no
connection, or "no leader"); any other failure of a write is reported as
:class:`StoreUnavailable`, and the write may or may not have been applied.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
import urllib.parse
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

# gRPC's fork handlers can crash a child forked while gRPC calls are in flight (a subprocess
# started with a preexec_fn: SIGSEGV before exec); this store never uses gRPC across a fork
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "0")

import grpc  # type: ignore[import-untyped]
import grpc.aio  # type: ignore[import-untyped]
from aetcd import rpc

from o41.state.base import (
    Compare,
    Consistency,
    Delete,
    EtcdTls,
    Get,
    KeyValue,
    LeaseNotFound,
    Op,
    Put,
    StoreFull,
    StoreUnavailable,
    TxnResult,
    WatchEvent,
    prefix_end,
)

log = logging.getLogger(__name__)

_TARGETS = {
    "value": rpc.Compare.VALUE,
    "version": rpc.Compare.VERSION,
    "create": rpc.Compare.CREATE,
    "mod": rpc.Compare.MOD,
}
_RESULTS = {
    "==": rpc.Compare.EQUAL,
    "!=": rpc.Compare.NOT_EQUAL,
    "<": rpc.Compare.LESS,
    ">": rpc.Compare.GREATER,
}
# failures after which etcd certainly did not apply a write: safe to retry elsewhere
_NOT_SENT = ("failed to connect", "connection refused", "no leader", "connect failed")
_CHANNEL_OPTIONS = [
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1_000),
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
]
LEADER_CHECK = 10.0  # seconds between looks for the leader while all is well
# seconds one member is given to answer a call (then the next, if safe): short, so a dead
# leader stalls strong writes about this long; raise it (O41_ETCD_ATTEMPT_SECONDS) where
# etcd's disk is slow enough that a healthy commit can take longer
ATTEMPT = float(os.environ.get("O41_ETCD_ATTEMPT_SECONDS", "1.0"))
PROBE_EVERY = 0.1  # seconds between probes for a majority while etcd has none
ELECTION = 1.0  # seconds a probe allows for an election before it says "no majority"
# a member without a leader refuses at once ("no leader") instead of holding the call
_HAS_LEADER = (("hasleader", "true"),)
_NOT_APPLIED = "; it was not applied"
_MAYBE_APPLIED = "; the write may or may not have been applied"
RELOAD_CHECK = 10.0  # seconds between looks at the TLS files (a renewed certificate)
TLS_SETTINGS = "O41_ETCD_CA_FILE, O41_ETCD_CERT_FILE and O41_ETCD_KEY_FILE"


def _target(endpoint: str) -> tuple[str, bool]:
    """``http://127.0.0.1:2379`` (or ``127.0.0.1:2379``) -> ``127.0.0.1:2379``, and whether
    it is spoken to over TLS (``https://``)."""
    parts = urllib.parse.urlsplit(endpoint if "://" in endpoint else f"http://{endpoint}")
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"not an etcd client URL (http(s)://host:port): {endpoint!r}")
    return f"{parts.hostname}:{parts.port or 2379}", parts.scheme == "https"


def _credentials(tls: EtcdTls) -> Any:
    """gRPC's channel credentials for ``tls``. A file that cannot be read is a mistake in
    the configuration, said at start-up rather than as etcd failing at the first call."""
    if (tls.cert_file is None) != (tls.key_file is None):
        raise ValueError(
            "etcd TLS: a client certificate needs its key, and a key its certificate "
            "(O41_ETCD_CERT_FILE and O41_ETCD_KEY_FILE go together)"
        )

    def read(path: str | None, what: str) -> bytes | None:
        if path is None:
            return None
        try:
            return Path(path).read_bytes()
        except OSError as e:
            raise ValueError(f"etcd TLS: cannot read the {what} {path}: {e.strerror}") from None

    return grpc.ssl_channel_credentials(
        root_certificates=read(tls.ca_file, "CA certificate"),
        private_key=read(tls.key_file, "client key"),
        certificate_chain=read(tls.cert_file, "client certificate"),
    )


def _kv(kv: Any) -> KeyValue:
    return KeyValue(
        key=kv.key,
        value=kv.value,
        create_revision=kv.create_revision,
        mod_revision=kv.mod_revision,
        version=kv.version,
        lease=kv.lease,
    )


def _compare(c: Compare) -> Any:
    message = rpc.Compare(key=c.key, target=_TARGETS[c.target], result=_RESULTS[c.op])
    if c.prefix:
        end = prefix_end(c.key)
        message.range_end = c.end if c.end and (end == b"\0" or c.end < end) else end
    if c.target == "value":
        if not isinstance(c.value, bytes):
            raise TypeError(f"a value compare takes bytes, not {type(c.value).__name__}")
        message.value = c.value
    else:
        if not isinstance(c.value, int):
            raise TypeError(f"a {c.target} compare takes an int, not {type(c.value).__name__}")
        setattr(
            message,
            {"version": "version", "create": "create_revision"}.get(c.target, "mod_revision"),
            c.value,
        )
    return message


def _request_op(op: Op) -> Any:
    if isinstance(op, Put):
        return rpc.RequestOp(request_put=rpc.PutRequest(key=op.key, value=op.value, lease=op.lease))
    if isinstance(op, Delete):
        end = prefix_end(op.key) if op.prefix else b""
        return rpc.RequestOp(
            request_delete_range=rpc.DeleteRangeRequest(key=op.key, range_end=end, prev_kv=True)
        )
    end = prefix_end(op.key) if op.prefix else b""
    return rpc.RequestOp(request_range=rpc.RangeRequest(key=op.key, range_end=end, limit=op.limit))


def _stamp(tls: EtcdTls | None) -> tuple[tuple[int, int, int], ...]:
    """What changes when a TLS file is replaced (kubelet swaps a Secret's files at once)."""
    if tls is None:
        return ()
    found = []
    for path in (tls.ca_file, tls.cert_file, tls.key_file):
        if path is not None:
            try:
                s = os.stat(path)
            except OSError:
                found.append((0, 0, 0))
            else:
                found.append((s.st_ino, s.st_mtime_ns, s.st_size))
    return tuple(found)


def connection_settings(endpoints: list[str], tls: EtcdTls | None) -> tuple[list[str], Any]:
    """gRPC's targets for ``endpoints``, and the channel credentials (None: plain HTTP/2).
    Raises ValueError, saying what to fix, for settings that cannot work."""
    if not endpoints:
        raise ValueError("the etcd store needs at least one endpoint")
    targets = [_target(e) for e in endpoints]
    schemes = {secure for _, secure in targets}
    if len(schemes) > 1:
        raise ValueError("the etcd endpoints mix http:// and https://: give them one scheme")
    if schemes == {True}:
        return [target for target, _ in targets], _credentials(tls or EtcdTls())
    if tls is not None:
        raise ValueError(
            f"etcd TLS files are given ({TLS_SETTINGS}) but the etcd endpoints are http://: "
            "give https:// endpoints, or unset them"
        )
    return [target for target, _ in targets], None


class EtcdStore:
    """The :class:`o41.state.Store` on an etcd cluster; see the module docstring."""

    def __init__(
        self,
        endpoints: list[str],
        timeout: float = 5.0,
        tls: EtcdTls | None = None,
        reload_every: float = RELOAD_CHECK,
    ) -> None:
        self._targets, self._credentials = connection_settings(endpoints, tls)
        self._timeout = timeout
        self._tls = tls if self._credentials is not None else None  # files to look at again
        self._tls_stamp = _stamp(self._tls)
        self._tls_checked = time.monotonic()
        self._reload_every = reload_every
        self._retiring: dict[grpc.aio.Channel, asyncio.Task[None]] = {}  # of the files before
        self._channels: list[grpc.aio.Channel | None] = [None] * len(self._targets)
        self._stubs: dict[tuple[int, str], Any] = {}
        self._current = 0  # the member calls go to: the leader when known
        self._nearest = 0  # serializable reads: the first endpoint listed (list it nearest)
        self._checked = 0.0  # when the leader was last looked for
        self._checking: asyncio.Task[None] | None = None
        self._attempt = min(ATTEMPT, timeout)
        self._no_majority: str | None = None  # the error every strong call gets meanwhile
        self._probing: asyncio.Task[None] | None = None
        self._verdict: asyncio.Event | None = None  # set once the probe's first round ended
        self._closed = False

    # plumbing

    def _channel(self, index: int) -> grpc.aio.Channel:
        channel = self._channels[index]
        if channel is None:
            target = self._targets[index]
            if self._credentials is None:
                channel = grpc.aio.insecure_channel(target, options=_CHANNEL_OPTIONS)
            else:
                channel = grpc.aio.secure_channel(
                    target, self._credentials, options=_CHANNEL_OPTIONS
                )
            self._channels[index] = channel
        return channel

    def _stub(self, index: int, service: str) -> Any:
        """A stub per member and service (making one builds every method: not per call).
        Every call starts here, so here the TLS files are looked at again."""
        if self._tls is not None and time.monotonic() - self._tls_checked >= self._reload_every:
            self._reload_tls()
        stub = self._stubs.get((index, service))
        if stub is None:
            stub = getattr(rpc, f"{service}Stub")(self._channel(index))
            self._stubs[(index, service)] = stub
        return stub

    def _reload_tls(self) -> None:
        """Read the TLS files again if they changed: calls from now on go over new
        channels; the old ones close once their calls are done (a watch on one resumes on
        a new channel). Files that cannot be read now keep the old credentials."""
        assert self._tls is not None
        self._tls_checked = time.monotonic()
        stamp = _stamp(self._tls)
        if stamp == self._tls_stamp:
            return
        try:
            credentials = _credentials(self._tls)
        except ValueError as e:
            log.warning("etcd TLS files changed but %s; the old ones stay in use", e)
            return
        self._tls_stamp, self._credentials = stamp, credentials
        old = [c for c in self._channels if c is not None]
        self._channels = [None] * len(self._targets)
        self._stubs.clear()
        log.info("etcd TLS files changed: new calls use them")
        loop = asyncio.get_running_loop()
        for channel in old:
            self._retiring[channel] = loop.create_task(self._retire(channel))

    async def _retire(self, channel: grpc.aio.Channel) -> None:
        try:
            await channel.close(grace=self._timeout)
        finally:
            self._retiring.pop(channel, None)

    async def _call(
        self,
        service: str,
        method: str,
        request: Any,
        *,
        write: bool,
        what: str,
        nearest: bool = False,
    ) -> Any:
        """One unary call, moved on to the next member while the failure allows it.
        ``nearest``: a serializable read, which any member answers alone.

        Each member is given :data:`ATTEMPT` seconds; a read that timed out moves on to
        the next member (safe to repeat), a write fails then (it may have been applied:
        said in the error). When etcd did not answer in time, strong calls fail at once
        with that same error (:meth:`_lost_majority`) until a probe sees a majority."""
        if self._closed:
            raise StoreUnavailable("the etcd store is closed")
        if not nearest:
            await self._wait_for_verdict()
        failing = None if nearest else self._no_majority
        if failing is not None:
            await asyncio.sleep(0)  # a caller retrying in a loop still lets the probe run
            raise StoreUnavailable(failing + (_NOT_APPLIED if write else ""))
        self._maybe_check_leader()
        started = time.monotonic()
        deadline = started + self._timeout
        index = self._nearest if nearest else self._current
        tried = 0
        last = ""  # the last member's refusal, said when the time is up
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                message = (
                    f"etcd did not answer {what} within {self._timeout:g} s "
                    f"(members {', '.join(self._targets)}){last}"
                )
                if not nearest:
                    self._lost_majority(message)
                    await self._wait_for_verdict()
                raise StoreUnavailable(message + (_NOT_APPLIED if write else ""))
            attempt = min(remaining, self._attempt)
            try:
                return await getattr(self._stub(index, service), method)(
                    request, timeout=attempt, metadata=() if nearest else _HAS_LEADER
                )
            except grpc.aio.AioRpcError as e:
                code, details = e.code(), e.details() or ""
                if code == grpc.StatusCode.NOT_FOUND and "lease" in details:
                    raise LeaseNotFound(details) from None
                if code == grpc.StatusCode.INVALID_ARGUMENT:
                    raise ValueError(f"etcd refused {what}: {details}") from None
                if code == grpc.StatusCode.DEADLINE_EXCEEDED:
                    last = f"; {self._targets[index]} did not answer within {attempt:g} s"
                    if not write and deadline - time.monotonic() > 0:
                        tried += 1
                        index = self._next(index, nearest)
                        continue  # a read is safe to repeat on another member
                    message = (
                        f"etcd did not answer {what} within {attempt:g} s ({details}); "
                        "has it lost its majority?"
                    )
                    if not nearest:
                        self._lost_majority(message)
                        await self._wait_for_verdict()
                    raise StoreUnavailable(message + (_MAYBE_APPLIED if write else "")) from None
                if code == grpc.StatusCode.RESOURCE_EXHAUSTED and "space" in details:
                    raise StoreFull(
                        f"the state store is full (etcd: {details}; its NOSPACE alarm is "
                        "raised): it refuses every write until an administrator frees space "
                        "(docs/capacity.md: compact, defragment, disarm the alarm); reads "
                        "still work" + (_NOT_APPLIED if write else "")
                    ) from None
                retry = code == grpc.StatusCode.UNAVAILABLE and (
                    not write or any(s in details.lower() for s in _NOT_SENT)
                )
                if not retry:
                    message = f"etcd failed {what}: {code.name} {details}"
                    if code == grpc.StatusCode.UNAVAILABLE and not nearest:
                        # a member without a working leader ("leader changed" on a write
                        # in flight when its majority went): look for one, so the calls
                        # that follow fail at once if there is none, not after a timeout
                        self._lost_majority(message)
                    raise StoreUnavailable(message + (_MAYBE_APPLIED if write else "")) from None
                tried += 1
                last = f"; the last refusal: {details}"
                if self._credentials is not None and "failed to connect" in details.lower():
                    last += f"; over TLS: check {TLS_SETTINGS}"  # a handshake fails here
                index = self._next(index, nearest)
                if tried % len(self._targets) == 0:  # every member refused: breathe
                    await asyncio.sleep(min(0.05 * tried, 0.5, max(0.0, remaining)))
            except grpc.aio.UsageError as e:
                raise StoreUnavailable(f"etcd store: {e}") from None

    def _next(self, index: int, nearest: bool) -> int:
        """The member after ``index``, for the calls that follow too."""
        index = (index + 1) % len(self._targets)
        if nearest:
            self._nearest = index
        else:
            self._current = index
            self._checked = 0.0  # look for the leader again
        return index

    def _lost_majority(self, message: str) -> None:
        """etcd did not answer a strong call in time: probe for a majority (one
        linearizable read of each member in turn). Calls wait for the probe's first round;
        if no member answered it, strong calls fail at once with one error until a later
        probe gets an answer (every :data:`PROBE_EVERY` seconds)."""
        if self._probing is not None and not self._probing.done():
            return
        self._verdict = asyncio.Event()
        self._probing = asyncio.get_running_loop().create_task(self._probe(message))

    async def _wait_for_verdict(self) -> None:
        """While a probe looks for a majority (at most :data:`ELECTION` and a round), wait
        for what it finds: calls then fail at once, or go on."""
        if self._verdict is not None and not self._verdict.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._verdict.wait(), self._timeout)

    async def _probe(self, message: str) -> None:
        assert self._verdict is not None
        request = rpc.RangeRequest(key=b"\0o41-probe")
        index = self._current
        started = time.monotonic()
        try:
            while not self._closed:
                for _ in range(len(self._targets)):
                    try:
                        await self._stub(index, "KV").Range(
                            request, timeout=self._attempt, metadata=_HAS_LEADER
                        )
                    except grpc.aio.AioRpcError:
                        index = (index + 1) % len(self._targets)
                        continue
                    if self._no_majority is not None:
                        log.info("etcd answers again: strong calls go on")
                    self._no_majority = None
                    self._current, self._checked = index, 0.0
                    return
                if time.monotonic() - started < ELECTION:
                    await asyncio.sleep(PROBE_EVERY)  # perhaps an election: look again
                    continue
                if self._no_majority is None:
                    since = time.strftime("%H:%M:%S", time.gmtime())
                    self._no_majority = (
                        f"etcd did not answer with a majority since {since} UTC (members "
                        f"{', '.join(self._targets)}): strong calls fail at once until it "
                        "does again"
                    )
                    log.warning("%s: %s", self._no_majority, message)
                self._verdict.set()
                await asyncio.sleep(PROBE_EVERY)
        except grpc.aio.UsageError:
            return  # the store closed
        finally:
            self._verdict.set()

    def _maybe_check_leader(self) -> None:
        if len(self._targets) == 1 or time.monotonic() - self._checked < LEADER_CHECK:
            return
        if self._checking is None or self._checking.done():
            self._checked = time.monotonic()
            self._checking = asyncio.get_running_loop().create_task(self._find_leader())

    async def _find_leader(self) -> None:
        """Point calls at the leader (each member says who it is and who leads)."""

        async def status(index: int) -> tuple[int, int, int]:
            stub = self._stub(index, "Maintenance")
            answer = await stub.Status(rpc.StatusRequest(), timeout=min(1.0, self._timeout))
            return index, answer.header.member_id, answer.leader

        answers = await asyncio.gather(
            *(status(i) for i in range(len(self._targets))), return_exceptions=True
        )
        members = {a[1]: a[0] for a in answers if isinstance(a, tuple)}
        leaders = [a[2] for a in answers if isinstance(a, tuple) and a[2]]
        if leaders and leaders[0] in members:
            self._current = members[leaders[0]]
        elif members and self._current not in members.values():
            self._current = next(iter(members.values()))

    async def leader_known(self) -> None:
        """Look for the leader now (the first calls then go straight to it)."""
        self._checked = time.monotonic()
        with contextlib.suppress(Exception):
            await self._find_leader()

    # reads

    async def get(self, key: bytes, *, consistency: Consistency = "strong") -> KeyValue | None:
        eventual = consistency == "eventual"
        request = rpc.RangeRequest(key=key, serializable=eventual)
        answer = await self._call(
            "KV", "Range", request, write=False, what=f"get {key!r}", nearest=eventual
        )
        return _kv(answer.kvs[0]) if answer.kvs else None

    async def range(
        self,
        prefix: bytes,
        *,
        limit: int = 0,
        consistency: Consistency = "strong",
        start: bytes = b"",
        end: bytes = b"",
    ) -> list[KeyValue]:
        range_end = prefix_end(prefix)
        if end and (range_end == b"\0" or end < range_end):
            range_end = end
        request = rpc.RangeRequest(
            key=max(prefix, start),
            range_end=range_end,
            limit=limit,
            serializable=consistency == "eventual",
        )
        answer = await self._call(
            "KV",
            "Range",
            request,
            write=False,
            what=f"range {prefix!r}",
            nearest=consistency == "eventual",
        )
        return [_kv(kv) for kv in answer.kvs]

    # writes

    async def put(self, key: bytes, value: bytes, *, lease: int = 0) -> int:
        request = rpc.PutRequest(key=key, value=value, lease=lease)
        answer = await self._call("KV", "Put", request, write=True, what=f"put {key!r}")
        return int(answer.header.revision)

    async def delete(self, key: bytes, *, prefix: bool = False) -> int:
        request = rpc.DeleteRangeRequest(key=key, range_end=prefix_end(key) if prefix else b"")
        answer = await self._call("KV", "DeleteRange", request, write=True, what=f"delete {key!r}")
        return int(answer.deleted)

    async def take(self, start: bytes, end: bytes) -> list[KeyValue]:
        request = rpc.DeleteRangeRequest(key=start, range_end=end, prev_kv=True)
        answer = await self._call("KV", "DeleteRange", request, write=True, what=f"take {start!r}")
        return [_kv(kv) for kv in answer.prev_kvs]

    async def txn(
        self, compare: Sequence[Compare], success: Sequence[Op], failure: Sequence[Op] = ()
    ) -> TxnResult:
        request = rpc.TxnRequest(
            compare=[_compare(c) for c in compare],
            success=[_request_op(op) for op in success],
            failure=[_request_op(op) for op in failure],
        )
        write = any(not isinstance(op, Get) for op in (*success, *failure))
        answer = await self._call("KV", "Txn", request, write=write, what="a transaction")
        results: list[tuple[KeyValue, ...]] = []
        for response in answer.responses:
            which = response.WhichOneof("response")
            if which == "response_range":
                results.append(tuple(_kv(kv) for kv in response.response_range.kvs))
            elif which == "response_delete_range":
                results.append(tuple(_kv(kv) for kv in response.response_delete_range.prev_kvs))
            else:
                results.append(())
        return TxnResult(bool(answer.succeeded), int(answer.header.revision), tuple(results))

    # leases

    async def lease_grant(self, ttl: int) -> int:
        request = rpc.LeaseGrantRequest(TTL=ttl, ID=0)
        answer = await self._call("Lease", "LeaseGrant", request, write=True, what="lease grant")
        if answer.error:
            raise StoreUnavailable(f"etcd refused a lease: {answer.error}")
        return int(answer.ID)

    async def lease_keepalive(self, lease: int) -> int:
        """Refresh ``lease``; its TTL in seconds, 0 when it has already expired."""
        if self._closed:
            raise StoreUnavailable("the etcd store is closed")
        failing = self._no_majority
        if failing is not None:
            await asyncio.sleep(0)
            raise StoreUnavailable(failing)
        deadline = time.monotonic() + self._timeout
        index = self._current
        for tried in range(1, 1000):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            call = self._stub(index, "Lease").LeaseKeepAlive(
                iter([rpc.LeaseKeepAliveRequest(ID=lease)]), timeout=remaining, metadata=_HAS_LEADER
            )
            try:
                answer = await call.read()
            except grpc.aio.AioRpcError as e:
                if e.code() != grpc.StatusCode.UNAVAILABLE:
                    raise StoreUnavailable(
                        f"etcd failed a lease keep-alive: {e.code().name} {e.details()}"
                    ) from None
                index = (index + 1) % len(self._targets)
                if tried % len(self._targets) == 0:
                    await asyncio.sleep(min(0.05 * tried, 0.5, max(0.0, remaining)))
            else:
                return 0 if answer is grpc.aio.EOF else int(answer.TTL)
            finally:
                call.cancel()
        raise StoreUnavailable(f"etcd did not refresh lease {lease:x} within {self._timeout:g} s")

    async def lease_revoke(self, lease: int) -> None:
        request = rpc.LeaseRevokeRequest(ID=lease)
        with contextlib.suppress(LeaseNotFound):
            await self._call("Lease", "LeaseRevoke", request, write=True, what="lease revoke")

    # watch

    async def watch(
        self,
        prefix: bytes,
        *,
        start_revision: int = 0,
        prev_kv: bool = False,
        deletes_only: bool = False,
    ) -> AsyncIterator[WatchEvent]:
        """Events under ``prefix`` from ``start_revision`` (0: from now), in revision order;
        with ``prev_kv``, each with the key as it was before.

        A broken stream resumes on another member after the last revision seen; past
        ``timeout`` without any member answering, :class:`StoreUnavailable`.
        """
        next_revision = start_revision
        index = self._current
        failing_since: float | None = None
        while True:
            if self._closed:
                return
            call = self._stub(index, "Watch").Watch()
            try:
                create = rpc.WatchCreateRequest(
                    key=prefix,
                    range_end=prefix_end(prefix),
                    start_revision=next_revision,
                    prev_kv=prev_kv,
                    filters=[rpc.WatchCreateRequest.NOPUT] if deletes_only else [],
                )
                await call.write(rpc.WatchRequest(create_request=create))
                while True:
                    answer = await call.read()
                    if answer is grpc.aio.EOF:
                        raise StoreUnavailable("etcd closed the watch stream")
                    failing_since = None
                    if answer.compact_revision:
                        raise StoreUnavailable(
                            f"cannot watch {prefix!r} from revision {next_revision}: "
                            f"compacted up to {answer.compact_revision}"
                        )
                    if answer.canceled:
                        raise StoreUnavailable(f"etcd cancelled a watch: {answer.cancel_reason}")
                    if answer.created and not next_revision:
                        next_revision = answer.header.revision + 1
                    for event in answer.events:
                        next_revision = event.kv.mod_revision + 1
                        prev = _kv(event.prev_kv) if event.HasField("prev_kv") else None
                        if event.type == rpc.Event.DELETE:
                            yield WatchEvent("delete", _kv(event.kv), prev)
                        else:
                            yield WatchEvent("put", _kv(event.kv), prev)
            except asyncio.CancelledError:
                # gRPC cancels a stream whose channel closes: a channel retired for renewed
                # TLS files, then the watch goes on over a new one. Not so when this task
                # itself is being cancelled, or the store closed.
                task = asyncio.current_task()
                if self._closed or task is None or task.cancelling():
                    raise
                log.info("a watch on %r moves to a new channel", prefix)
            except grpc.aio.AioRpcError as e:
                if e.code() == grpc.StatusCode.CANCELLED and self._closed:
                    return
                now = time.monotonic()
                failing_since = failing_since or now
                if now - failing_since > self._timeout:
                    raise StoreUnavailable(
                        f"no etcd member kept a watch on {prefix!r} for {self._timeout:g} s: "
                        f"{e.code().name} {e.details()}"
                    ) from None
                index = (index + 1) % len(self._targets)
                await asyncio.sleep(0.05)
            finally:
                call.cancel()

    async def close(self) -> None:
        self._closed = True
        for task in (self._checking, self._probing):
            if task is not None:
                task.cancel()
        for i, channel in enumerate(self._channels):
            if channel is not None:
                await channel.close()
            self._channels[i] = None
        self._stubs.clear()
        for channel, task in list(self._retiring.items()):
            task.cancel()
            await channel.close()
        self._retiring.clear()
