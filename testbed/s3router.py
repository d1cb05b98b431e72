"""One loopback S3 endpoint for every region, in front of versitygw (the S3 stand-in).

versitygw checks SigV4 like S3 does, and like S3 it serves one region per endpoint: a
request signed for another region is refused (``AuthorizationHeaderMalformed``), a
``LocationConstraint`` must name its region. AWS gives each region its own endpoint
(``s3.<region>.amazonaws.com``); the test bed gives the tests one endpoint, so this router
reads the region each request is signed for (``Credential=<key>/<date>/<region>/s3/...``, in
the Authorization header or the presigned URL's ``X-Amz-Credential``) and passes the request,
unchanged, to that region's gateway, started on first use. Unsigned or unreadable requests go
to the default region's gateway, which refuses them as S3 would.

All gateways serve one posix directory: bucket names are global, as on AWS, and ListBuckets
sees every region's buckets. What that cannot show: GetBucketLocation answers the region the
request was signed for, so a bucket "in another region" does not exist here (docs/storage.md).

The router never signs, checks or rewrites anything: the Host header, path and query reach
versitygw byte for byte, so every signature is checked by versitygw against what the client
signed. Gateways run with an empty environment (no ``VGW_*`` setting can leak in), on
127.0.0.1, in the router's process group (the stand-in's ``stop`` ends them all), and
record their endpoints in ``gateways.json`` for the tests that want one region's own port.

    python -m testbed.s3router --port P --binary versitygw --workdir DIR
    (root keys in O41_S3_ACCESS_KEY / O41_S3_SECRET_KEY)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qsl

from aiohttp import web

from testbed.process import LOOPBACK, free_port, port_open
from testbed.stores import ENV_ACCESS_KEY, ENV_SECRET_KEY, GATEWAYS_FILE

MAX_REGIONS = 16  # more distinct regions than any test uses; beyond, the default answers
_REGION = re.compile(r"[a-z0-9][a-z0-9-]{0,31}")
_CREDENTIAL = re.compile(r"Credential=([^,\s]+)")
# Hop-by-hop headers, and Expect (the router answers 100 Continue itself). Host is kept:
# it is signed.
_HOP = {
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "expect",
}


def signed_region(headers: Mapping[str, str], query_string: str) -> str | None:
    """The region in the request's SigV4 credential scope, or None (unsigned, malformed)."""
    found = _CREDENTIAL.search(headers.get("Authorization", ""))
    credential = found.group(1) if found else None
    if credential is None:
        for key, value in parse_qsl(query_string, keep_blank_values=True):
            if key == "X-Amz-Credential":
                credential = value
                break
    if credential is None:
        return None
    scope = credential.split("/")
    if len(scope) != 5 or not _REGION.fullmatch(scope[2]):
        return None
    return scope[2]


@dataclass
class Gateway:
    region: str
    port: int
    proc: subprocess.Popen[bytes]

    @property
    def endpoint(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"


class Gateways:
    """versitygw processes, one per region, started on first use (one start at a time)."""

    def __init__(self, binary: Path, workdir: Path, access: str, secret: str) -> None:
        self.binary, self.workdir = binary, workdir
        self.data, self.iam = workdir / "data", workdir / "iam"
        for d in (self.data, self.iam):
            d.mkdir(parents=True, exist_ok=True)
        self._env = {
            "PATH": os.defpath,
            "ROOT_ACCESS_KEY_ID": access,
            "ROOT_SECRET_ACCESS_KEY": secret,
        }
        self.running: dict[str, Gateway] = {}
        self._lock = asyncio.Lock()

    async def get(self, region: str) -> Gateway:
        gateway = self.running.get(region)
        if gateway is not None and gateway.proc.poll() is None:
            return gateway
        async with self._lock:
            gateway = self.running.get(region)
            if gateway is None or gateway.proc.poll() is not None:
                gateway = self.running[region] = await self._start(region)
                self._record()
            return gateway

    def full(self) -> bool:
        return len(self.running) >= MAX_REGIONS

    async def _start(self, region: str, attempts: int = 3) -> Gateway:
        log = self.workdir / f"versitygw-{region}.log"
        for _ in range(attempts):
            port = free_port()
            argv = [
                *_die_with_router(),
                str(self.binary),
                "--port", f"{LOOPBACK}:{port}",
                "--region", region,
                "--iam-dir", str(self.iam),  # internal IAM: unknown keys are InvalidAccessKeyId
                "--keep-alive",  # as S3 does (versitygw closes each connection by default)
                "--quiet",
                "posix", str(self.data),
            ]  # fmt: skip
            with log.open("ab") as out:
                proc = subprocess.Popen(  # noqa: ASYNC220 - fork+exec only; pdeathsig needs this thread
                    argv,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    env=self._env,
                    cwd=self.workdir,
                )
            deadline = asyncio.get_running_loop().time() + 15
            while proc.poll() is None and asyncio.get_running_loop().time() < deadline:
                if port_open(port):
                    return Gateway(region, port, proc)
                await asyncio.sleep(0.02)
            _end(proc)  # exited (port taken meanwhile?) or hung: try another port
        raise RuntimeError(f"versitygw for {region} did not start; see {log}")

    def _record(self) -> None:
        table = {r: {"endpoint": g.endpoint, "pid": g.proc.pid} for r, g in self.running.items()}
        tmp = self.workdir / (GATEWAYS_FILE + ".tmp")
        tmp.write_text(json.dumps(table, indent=1, sort_keys=True))
        tmp.replace(self.workdir / GATEWAYS_FILE)

    def stop(self) -> None:
        for gateway in self.running.values():
            with contextlib.suppress(ProcessLookupError):
                gateway.proc.terminate()
        for gateway in self.running.values():
            _end(gateway.proc)


def _end(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
    try:
        proc.wait(5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _die_with_router() -> list[str]:
    """Gateways die with the router even when it is SIGKILLed (see process._die_with_parent)."""
    setpriv = shutil.which("setpriv")
    return [setpriv, "--pdeathsig", "KILL", "--"] if setpriv else []


def _error(status: int, code: str, message: str) -> web.Response:
    body = (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f"<Error><Code>{code}</Code><Message>{message}</Message></Error>"
    )
    return web.Response(status=status, text=body, content_type="application/xml")


class Router:
    """Passes each request to its region's gateway on a connection of its own.

    A plain socket, not an HTTP client library: the request goes out with its own Host,
    path, query and headers, and the gateway's answer is read as soon as it comes, even
    while the body is still being sent. That is how a store refuses a bad upload: versitygw
    answers, reads at most 256 KiB more and resets the connection; a client library (or an
    asyncio transport) that sees the reset on its write side drops the answer it had been
    sent. The rest of a refused body is read and dropped here, so the client always gets
    the store's answer.
    """

    def __init__(self, gateways: Gateways, default_region: str) -> None:
        self.gateways, self.default_region = gateways, default_region

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        region = signed_region(request.headers, request.query_string)
        if region is None or (region not in self.gateways.running and self.gateways.full()):
            region = self.default_region  # it refuses the request as S3 would
        try:
            gateway = await self.gateways.get(region)
        except RuntimeError as e:
            return _error(503, "ServiceUnavailable", f"the test bed's S3 stand-in: {e}")
        if request.headers.get("Expect", "").lower() == "100-continue":
            await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        upstream = _Upstream()
        try:
            await upstream.connect(gateway.port)
            return await self._exchange(request, upstream)
        except (OSError, EOFError, ValueError) as e:
            return _error(502, "BadGateway", f"the test bed's S3 stand-in: {e!r}")
        finally:
            upstream.close()

    async def _exchange(self, request: web.BaseRequest, up: _Upstream) -> web.StreamResponse:
        chunked = "chunked" in request.headers.get("Transfer-Encoding", "").lower()
        lines = [f"{request.method} {request.raw_path} HTTP/1.1"]
        lines += [f"{k}: {v}" for k, v in request.headers.items() if k.lower() not in _HOP]
        if chunked:
            lines.append("Transfer-Encoding: chunked")
        lines.append("Connection: close")
        await up.send(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        pump = asyncio.create_task(_pump(request, up, chunked))
        try:
            status, reason, headers = await _response_head(up)
        finally:
            pump.cancel()  # answered: the gateway wants no more of the body
            with contextlib.suppress(asyncio.CancelledError, OSError):
                await pump
        # whatever the client still sends is read and dropped, so it reads the answer
        while await request.content.readany():
            pass
        response = web.StreamResponse(status=status, reason=reason)
        for k, v in headers:
            if k.lower() not in _HOP:
                response.headers.add(k, v)
        await response.prepare(request)
        if request.method != "HEAD" and status not in (204, 304):
            length = next((v for k, v in headers if k.lower() == "content-length"), None)
            te = next((v for k, v in headers if k.lower() == "transfer-encoding"), "")
            if "chunked" in te.lower():
                while size := int((await up.readuntil(b"\r\n")).split(b";")[0], 16):
                    await _relay(up, response, size)
                    await up.readexactly(2)
                while (await up.readuntil(b"\r\n")) != b"\r\n":  # trailers
                    pass
            elif length is not None:
                await _relay(up, response, int(length))
            else:
                while block := await up.read(1 << 20):
                    await response.write(block)
        await response.write_eof()
        return response

    async def serve(self, port: int) -> None:
        await self.gateways.get(self.default_region)
        server = web.Server(self.handle)
        runner = web.ServerRunner(server, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, LOOPBACK, port)
        await site.start()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        try:
            await stop.wait()
        finally:
            await runner.cleanup()


class _Upstream:
    """A non-blocking socket to a gateway. A failed send leaves what was received readable."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setblocking(False)
        self.buffer = bytearray()
        self.loop = asyncio.get_running_loop()

    async def connect(self, port: int) -> None:
        await self.loop.sock_connect(self.sock, (LOOPBACK, port))

    async def send(self, data: bytes) -> None:
        await self.loop.sock_sendall(self.sock, data)

    async def _fill(self) -> bool:
        block = await self.loop.sock_recv(self.sock, 1 << 20)
        self.buffer += block
        return bool(block)

    async def readuntil(self, separator: bytes) -> bytes:
        while (at := self.buffer.find(separator)) < 0:
            if len(self.buffer) > 1 << 20 or not await self._fill():
                raise EOFError("the gateway closed the connection mid-answer")
        line = bytes(self.buffer[: at + len(separator)])
        del self.buffer[: at + len(separator)]
        return line

    async def read(self, n: int) -> bytes:
        if not self.buffer and not await self._fill():
            return b""
        block = bytes(self.buffer[:n])
        del self.buffer[:n]
        return block

    async def readexactly(self, n: int) -> bytes:
        while len(self.buffer) < n:
            if not await self._fill():
                raise EOFError("the gateway closed the connection mid-answer")
        return await self.read(n)

    def close(self) -> None:
        self.sock.close()


async def _pump(request: web.BaseRequest, up: _Upstream, chunked: bool) -> None:
    """The client's body to the gateway, as it arrives (chunked again if it came chunked)."""
    while block := await request.content.readany():
        await up.send(b"%x\r\n%b\r\n" % (len(block), block) if chunked else block)
    if chunked:
        await up.send(b"0\r\n\r\n")


async def _response_head(up: _Upstream) -> tuple[int, str, list[tuple[str, str]]]:
    """The gateway's final status line and headers (interim 1xx answers are skipped)."""
    while True:
        head = (await up.readuntil(b"\r\n\r\n")).decode("latin-1")
        status_line, *header_lines = head[:-4].split("\r\n")
        _, code, *reason = status_line.split(" ", 2)
        if not code.startswith("1"):
            break
    headers = []
    for line in header_lines:
        name, _, value = line.partition(":")
        headers.append((name.strip(), value.strip()))
    return int(code), (reason[0] if reason else ""), headers


async def _relay(up: _Upstream, response: web.StreamResponse, length: int) -> None:
    while length > 0:
        block = await up.read(min(length, 1 << 20))
        if not block:
            raise EOFError("the gateway closed the connection mid-answer")
        length -= len(block)
        await response.write(block)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m testbed.s3router", description=__doc__)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--binary", type=Path, required=True)
    p.add_argument("--workdir", type=Path, required=True)
    p.add_argument("--default-region", default="us-east-1")
    args = p.parse_args(argv)
    access, secret = os.environ.get(ENV_ACCESS_KEY), os.environ.get(ENV_SECRET_KEY)
    if not access or not secret:
        print(f"{ENV_ACCESS_KEY} and {ENV_SECRET_KEY} must be set", file=sys.stderr)
        return 2
    gateways = Gateways(args.binary, args.workdir, access, secret)
    try:
        asyncio.run(Router(gateways, args.default_region).serve(args.port))
    finally:
        gateways.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
