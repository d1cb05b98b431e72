"""A TCP relay on loopback that adds a fixed delay each way: the WAN between a workload
cluster and the hub, on one machine (issue 40).

Every byte read from one side is written to the other ``delay`` seconds later (per
direction, ``up`` towards the upstream, ``down`` back), in order, without holding the
next bytes behind it: a link with that latency, not a slow server. A request and its
answer so pay ``up + down`` once, as across a region would. Both sides' sockets have
``TCP_NODELAY`` (asyncio's default), so nothing waits on Nagle.

It forwards to a loopback upstream alone and listens on 127.0.0.1; the delays may be
changed while it runs (new bytes take the new delay). Used by the tests (a hub "far
away") and by the bench (bench/ copies nothing: it imports this module)::

    with Relay("http://127.0.0.1:8080", delay=0.02) as relay:
        call(relay.url)   # each round trip now takes 40 ms more

``python -m testbed.relay --upstream 127.0.0.1:8080 --delay 0.02`` runs one until
interrupted and prints its URL.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import sys
import threading
import urllib.parse
from collections.abc import Callable
from types import TracebackType

from testbed.process import LOOPBACK, free_port

__all__ = ["Relay"]

CHUNK = 64 * 1024
WINDOW = 256  # chunks in flight per direction


def _upstream(target: str) -> tuple[str, int]:
    """``http://host:port``, ``https://host:port`` or ``host:port``, checked to be loopback."""
    parts = urllib.parse.urlsplit(target if "//" in target else f"tcp://{target}")
    if parts.hostname is None or parts.port is None:
        raise ValueError(f"the relay's upstream must name a host and a port, not {target!r}")
    host = "127.0.0.1" if parts.hostname == "localhost" else parts.hostname
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        raise ValueError(f"the relay forwards to loopback only, not {host!r}")
    return host, parts.port


class Relay:
    """``127.0.0.1:<port>`` relaying to ``upstream`` with ``delay`` seconds added each way
    (``up`` and ``down`` override it per direction). :attr:`url` keeps the upstream's
    scheme, so ``https://`` stays TLS end to end (the relay sees bytes only)."""

    def __init__(
        self,
        upstream: str,
        delay: float = 0.0,
        *,
        up: float | None = None,
        down: float | None = None,
        port: int | None = None,
    ) -> None:
        self.host, self.upstream_port = _upstream(upstream)
        self.scheme = urllib.parse.urlsplit(upstream).scheme if "//" in upstream else "http"
        self.up = delay if up is None else up
        self.down = delay if down is None else down
        if self.up < 0 or self.down < 0:
            raise ValueError("a relay's delays are seconds, 0 or more")
        self.port = port or free_port()
        self.connections = 0  # accepted so far
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._ready = threading.Event()
        self._failed: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="relay", daemon=True)

    @property
    def url(self) -> str:
        return f"{self.scheme}://{LOOPBACK}:{self.port}"

    @property
    def address(self) -> tuple[str, int]:
        return LOOPBACK, self.port

    def start(self) -> Relay:
        self._thread.start()
        self._ready.wait(10)
        if self._failed is not None:
            raise self._failed
        if self._server is None:
            raise TimeoutError(f"the relay on port {self.port} did not start within 10 s")
        return self

    def stop(self) -> None:
        """Close the listener and every relayed connection; idempotent."""
        if not self._thread.is_alive():
            return
        future = asyncio.run_coroutine_threadsafe(self._close(), self._loop)
        with contextlib.suppress(Exception):
            future.result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def __enter__(self) -> Relay:
        return self.start()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.stop()

    # the loop's side

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._server = self._loop.run_until_complete(
                asyncio.start_server(self._accept, LOOPBACK, self.port)
            )
        except BaseException as e:  # handed to start(), which raises it
            self._failed = e
            self._ready.set()
            return
        self._ready.set()
        try:
            self._loop.run_forever()
        finally:
            self._loop.close()

    async def _close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._server.wait_closed(), 5)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            try:
                up_reader, up_writer = await asyncio.open_connection(self.host, self.upstream_port)
            except OSError:
                writer.close()  # the upstream is down: the client sees the connection close
                return
            try:
                await asyncio.gather(
                    self._pump(reader, up_writer, lambda: self.up),
                    self._pump(up_reader, writer, lambda: self.down),
                    return_exceptions=True,
                )
            finally:  # cancelled by stop() too: the sockets close either way
                for w in (writer, up_writer):
                    w.close()
        finally:
            self._tasks.discard(task)

    async def _pump(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        delay: Callable[[], float],
    ) -> None:
        """Bytes from ``reader`` to ``writer``, each chunk ``delay()`` seconds after it was
        read; end of stream passed on the same way (a half close)."""
        loop = asyncio.get_running_loop()
        # bounded: a reader far ahead of a slow writer waits (a link's window, not RAM)
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue(WINDOW)

        async def read() -> None:
            while True:
                try:
                    data = await reader.read(CHUNK)
                except OSError:
                    data = b""
                await queue.put((loop.time() + delay(), data))
                if not data:
                    return

        reading = asyncio.create_task(read())
        try:
            while True:
                due, data = await queue.get()
                wait = due - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                if not data:
                    if writer.can_write_eof():
                        with contextlib.suppress(OSError):
                            writer.write_eof()
                    return
                writer.write(data)
                try:
                    await writer.drain()
                except OSError:
                    return  # the other side went away: nothing more to pass on
        finally:
            reading.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reading


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m testbed.relay", description=__doc__)
    parser.add_argument("--upstream", required=True, help="host:port or URL, on loopback")
    parser.add_argument("--delay", type=float, default=0.0, help="seconds added each way")
    parser.add_argument("--port", type=int, default=0, help="0: a free port")
    args = parser.parse_args(argv)
    try:
        relay = Relay(args.upstream, args.delay, port=args.port or None).start()
    except ValueError as e:
        parser.error(str(e))
    print(relay.url, flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        relay.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
