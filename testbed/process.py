"""Start a server process, wait until it answers, and stop it by its pid: never leak one."""

from __future__ import annotations

import contextlib
import functools
import os
import random
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

LOOPBACK = "127.0.0.1"


_EPHEMERAL = Path("/proc/sys/net/ipv4/ip_local_port_range")
_handed_out: set[int] = set()
_handing = threading.Lock()


@functools.cache
def _listening_ports() -> range:
    """Ports below the kernel's ephemeral range. A port the kernel picked (bind to port 0)
    is one it may also give, a moment later, to any outgoing connection as its local port;
    a server started on it then fails with "address already in use" (seen with etcd)."""
    try:
        low = int(_EPHEMERAL.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    ports = range(10000, low) if low > 11000 else range(61000, 65536)
    # a test run split over pytest-xdist's workers: each its own share, so two workers
    # never hand out one port (each knows only its own); servers they start inherit it
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 1)
    if worker.startswith("gw") and worker[2:].isdigit() and count > 1:
        index = int(worker[2:]) % count
        ports = range(ports.start + (index - ports.start) % count, ports.stop, count)
    return ports


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now, outside the ephemeral
    range, and never the same twice in this process."""
    ports = _listening_ports()
    with _handing:
        for _ in range(200):
            port = random.choice(ports)  # noqa: S311 - spreading, not secrecy
            if port in _handed_out:
                continue
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                try:
                    s.bind((LOOPBACK, port))
                except OSError:
                    continue
            _handed_out.add(port)
            return port
    raise OSError(f"no free port on {LOOPBACK} in {ports.start}-{ports.stop - 1}")


def port_open(port: int, host: str = LOOPBACK) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.2)
        return s.connect_ex((host, port)) == 0


def plain_websocket(port: int) -> socket.socket:
    """A WebSocket to ``/`` of a server on loopback, on a plain socket (no client
    library): the least a client can cost, the benchmarks' floor. The caller builds the
    frames (masked with zeros)."""
    sock = socket.create_connection((LOOPBACK, port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.sendall(
        b"GET / HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        b"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
    )
    head = b""
    while b"\r\n\r\n" not in head:
        data = sock.recv(4096)
        if not data:
            sock.close()
            raise ConnectionResetError(f"the server on port {port} closed before upgrading")
        head += data
    return sock


_detached = False


def detach() -> None:
    """Servers started from now on outlive this process (``make dev-up``); by default a
    server dies with the process that started it, so a killed test run leaves no strays."""
    global _detached
    _detached = True


class GaveUp(Exception):
    """Raised by a check to stop waiting at once (the process it waits for has died)."""


def wait_until(
    check: Callable[[], bool], *, timeout: float, what: str, interval: float = 0.05
) -> None:
    """Poll ``check`` until it is true; raise TimeoutError naming ``what`` otherwise.

    A check that raises counts as "not yet", except ``GaveUp``, which ends the wait.
    """
    deadline = time.monotonic() + timeout
    while True:
        try:
            if check():
                return
        except GaveUp:
            raise
        except Exception:  # noqa: S110 - not up yet (connection refused, 503...)
            pass
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


@dataclass
class Server:
    """A child process with its log file. ``stop`` is idempotent."""

    name: str
    argv: Sequence[str]
    log: Path
    env: dict[str, str] | None = None
    cwd: Path | None = None
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    def start(self) -> Server:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as out:
            self.proc = _popen(
                [*_die_with_parent(), *self.argv],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **(self.env or {})},
                cwd=self.cwd,
                start_new_session=True,  # its own process group: we stop its children too
            )
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None, f"{self.name} was never started"
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait_ready(self, check: Callable[[], bool], timeout: float = 60.0) -> Server:
        def ready() -> bool:
            if not self.alive():
                raise GaveUp(f"{self.name} exited early; last lines:\n{self.tail()}")
            return check()

        try:
            wait_until(ready, timeout=timeout, what=f"{self.name} to answer")
        except TimeoutError as e:
            raise TimeoutError(f"{e}; last lines of {self.log}:\n{self.tail()}") from None
        return self

    def tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def kill(self) -> None:
        """SIGKILL the process group at once, as a crash would."""
        if self.alive():
            assert self.proc is not None
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM the process group, then SIGKILL after ``timeout`` seconds."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        # children left in the group (a shell's, node's workers) go too
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)


#: The thread every server not started from the main thread is forked from.
_spawner = ThreadPoolExecutor(1, thread_name_prefix="testbed-spawner")


def _popen(argv: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
    """``subprocess.Popen`` from a thread that lives as long as this process. The
    kernel's parent-death signal (:func:`_die_with_parent`) fires when the *thread* that
    forked the child ends, not the process: a server restarted by a test's short-lived
    fault thread was SIGKILLed the moment that thread returned."""
    if threading.current_thread() is threading.main_thread():
        return subprocess.Popen(argv, **kwargs)
    started: subprocess.Popen[bytes] = _spawner.submit(
        lambda: subprocess.Popen(argv, **kwargs)
    ).result()
    return started


def _die_with_parent() -> list[str]:
    """A prefix that makes the server die (SIGKILL) when the process that started it dies,
    even by SIGKILL, so a killed test run leaves no strays. util-linux's setpriv sets it
    and execs the server; no preexec_fn, whose real fork() crashes a child of a process
    that uses gRPC."""
    if _detached:
        return []
    setpriv = shutil.which("setpriv")
    return [setpriv, "--pdeathsig", "KILL", "--"] if setpriv else []


def cache_dir() -> Path:
    """Where built binaries and installed tools live, outside the work tree."""
    return Path(os.environ.get("O41_CACHE", Path.home() / ".cache" / "o41"))
