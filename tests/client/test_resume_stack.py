"""An interrupted 100 MiB write resumes without sending its parts again, on the whole
stack: the real placement service process (TokenReview against the real API server,
state in a 3-member etcd), a Location on the S3 stand-in (versitygw, which checks every
signature and part) reached through a counting proxy, and ``o41 write`` as a real
process killed with SIGKILL after some of its parts are in the bucket.

The proxy counts each part PUT that reached the bucket (by part number); while the
first process runs it lets parts 1 and 2 through and holds the others, so the kill
lands after exactly two parts. ``o41 write --resume VERSION`` must then send exactly the
five others, once each, and the version read back must be the file.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
import signal
import subprocess
import sys
import time
from typing import Any

import pytest
from aiohttp import web

from o41.core.parts import PART_SIZE

from fixtures.placement import BreakableEndpoint
from fixtures.world import World

pytestmark = [pytest.mark.kube, pytest.mark.stores, pytest.mark.etcd]

MiB = 2**20
SIZE = 100 * MiB  # 7 parts of 16 MiB (the last 4 MiB)
_PART = re.compile(r"(?:^|&)partNumber=(\d+)(?:&|$)")


class CountingEndpoint(BreakableEndpoint):
    """Forwards everything; counts the part PUTs the bucket took (by number, with the
    object's path); while ``holding``, parts past ``let_through`` wait and, once
    ``dropping``, are refused without being forwarded (their sender is dead)."""

    def __init__(self, upstream: str) -> None:
        super().__init__(upstream)
        self.let_through = 2
        self.holding = True
        self.dropping = False
        self.stored: list[tuple[str, int]] = []  # (path, part) answered 200 by the bucket

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        found = _PART.search(request.query_string)
        ours = request.method == "PUT" and "/resumed/" in request.path  # not the operator's
        number = int(found.group(1)) if found and ours else None
        if number is not None and self.holding and number > self.let_through:
            while not self.dropping:  # noqa: ASYNC110 - set from the test's thread
                await asyncio.sleep(0.05)
            return web.Response(status=503, text="<Error><Code>SlowDown</Code></Error>")
        response = await super()._forward(request)
        if number is not None and response.status == 200:
            self.stored.append((request.path, number))
        return response


def o41(w: World, *args: str) -> subprocess.Popen[str]:
    env = w.pod_environ("nebius", "eu-west1", strip=("O41_ARTIFACTS_", "SKYPILOT_"))
    command = [sys.executable, "-m", "o41.cli", *args]
    command += ["--endpoint", w.service.url, "--token-file", str(w.team_a)]
    return subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def until(condition: Any, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.05)
    raise AssertionError(f"waited {seconds} s for {what}")


def test_a_killed_100_mib_write_resumes_without_sending_its_parts_again(
    world: World,
) -> None:
    w = world
    proxy = CountingEndpoint(w.s3.endpoint)
    proxy.start()
    try:
        here = w.location(
            "nebius-resume",
            "nebius",
            "eu-west1",
            {"s3Compatible": {"endpoint": proxy.url, "signingRegion": "us-east-1"}},
            w.credentials["s3"],
        )
        w.ready(here)
        data = os.urandom(SIZE)
        path = w.tmp / "ckpt-100mib"
        path.write_bytes(data)
        art = ["--org", w.org, "--artifact", "resumed"]

        first = o41(w, "write", *art, str(path), "--json")
        until(lambda: len(proxy.stored) >= 2, 120, "two parts in the bucket")
        first.send_signal(signal.SIGKILL)
        first.wait(30)
        assert first.returncode == -signal.SIGKILL
        proxy.dropping = True  # the held parts' sender is dead: they never reach the bucket
        _, err = first.communicate(timeout=10)
        said = re.search(r"writing version (\S+) of resumed in parts", err)
        assert said is not None, err  # the id a user resumes with, on stderr
        version = said.group(1)
        assert f"o41 write --resume {version}" in err
        object_path = proxy.stored[0][0]
        assert object_path.endswith(f"/resumed/{version}")
        assert sorted(n for _, n in proxy.stored) == [1, 2]

        status, progress = w.api("GET", f"/v1/writes/{version}")
        assert status == 200, progress
        assert [(p["number"], p["size"]) for p in progress["present"]] == [
            (1, PART_SIZE),
            (2, PART_SIZE),
        ]
        assert progress["parts"] == 7

        proxy.holding, proxy.stored = False, []
        t0 = time.monotonic()
        again = o41(w, "write", *art, str(path), "--resume", version, "--json")
        out, err = again.communicate(timeout=300)
        resumed_in = time.monotonic() - t0
        assert again.returncode == 0, err
        assert f'"version": "{version}"' in out
        assert "2 of 7 parts are in the bucket" in err
        assert sorted(n for _, n in proxy.stored) == [3, 4, 5, 6, 7]  # 1 and 2 not again
        assert {p for p, _ in proxy.stored} == {object_path}

        back = w.tmp / "ckpt-back"
        done = w.o41("read", *art, "--version", "latest", "--output", str(back), token=w.team_a)
        assert done.returncode == 0, done.stderr
        assert hashlib.sha256(back.read_bytes()).digest() == hashlib.sha256(data).digest()
        # the same run's reference: the whole file written afresh, all 7 parts
        proxy.stored = []
        t0 = time.monotonic()
        whole = o41(w, "write", *art, str(path), "--json")
        _, err = whole.communicate(timeout=300)
        whole_in = time.monotonic() - t0
        assert whole.returncode == 0, err
        assert sorted(n for _, n in proxy.stored) == [1, 2, 3, 4, 5, 6, 7]
        print(
            f"\nresume: 5 of 7 parts (84 MiB) sent and committed in {resumed_in:.1f} s; "
            f"the same file written whole in the same run: {whole_in:.1f} s"
        )
    finally:
        proxy.stop()
