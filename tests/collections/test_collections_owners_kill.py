"""The owner killed for real (issue 41): two replicas of the service, processes with
``O41_COLLECTIONS_OWNERS=on`` on one 3-member etcd; one owns a dict and answers its strong
reads from memory, and is SIGKILLed mid-run while clients read and write through both.
The history (every answer, the operations cut by the kill as unknown) is linearizable, the
other replica's writes go on once the dead owner's lease is over, and none of the writes
acknowledged before the kill is lost (the checker would see a read that misses one)."""

from __future__ import annotations

import asyncio
import base64
import http.client
import json
import math
import random
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from linearizability import Operation, check_dict
from o41.collections.keys import encode_key
from o41.state.etcd import EtcdStore
from testbed.etcd import EtcdCluster
from testbed.process import LOOPBACK
from testbed.product import CollectionsProcess

pytestmark = pytest.mark.etcd

TTL = 2


def post(port: int, compute: str, name: str, op: str, args: dict[str, Any]) -> dict[str, Any]:
    """One operation; any failure raises (its outcome is then unknown)."""
    connection = http.client.HTTPConnection(LOOPBACK, port, timeout=4)
    try:
        connection.request(
            "POST",
            f"/v1/collections/{compute}/dict/{name}/{op}",
            json.dumps(args),
            {"Authorization": "Bearer token-a", "Content-Type": "application/json"},
        )
        response = connection.getresponse()
        answer: dict[str, Any] = json.loads(response.read())
    finally:
        connection.close()
    if response.status != 200:
        raise RuntimeError(f"{response.status}: {answer}")
    return answer


def owner_keys(endpoints: list[str], compute: str) -> list[bytes]:
    async def look() -> list[bytes]:
        store = EtcdStore(endpoints, timeout=5)
        try:
            found = await store.range(b"/o41/owners/")
        finally:
            await store.close()
        return [kv.key for kv in found if compute.encode() in kv.key]

    return asyncio.run(look())


def test_the_owner_killed_mid_run(state_etcd: EtcdCluster, tmp_path: Path) -> None:
    env = {"O41_COLLECTIONS_OWNERS": "on", "O41_COLLECTIONS_OWNER_TTL": str(TTL)}
    a = CollectionsProcess(state_etcd.endpoints, tmp_path / "a.log", env=env).start()
    b = CollectionsProcess(state_etcd.endpoints, tmp_path / "b.log", env=env).start()
    compute, name = f"job-{uuid.uuid4().hex[:10]}", "killed"
    try:
        post(a.port, compute, name, "set", {"key": encode_key("x"), "value": "MA=="})
        deadline = time.monotonic() + 10
        owned: list[bytes] = []
        while not owned:  # reads through A elect it
            assert time.monotonic() < deadline, "A never came to own the dict"
            post(a.port, compute, name, "get", {"key": encode_key("x")})
            owned = [k for k in owner_keys(state_etcd.endpoints, compute) if k.endswith(b"/owner")]
            time.sleep(0.05)

        history: list[Operation] = []
        lock = threading.Lock()
        state = {"killed": math.inf}
        stop = time.monotonic() + 1.0 + TTL + 3.0

        def worker(w: int) -> None:
            rng = random.Random(w)
            i = 0
            while time.monotonic() < stop:
                i += 1
                key = rng.choice("xyz")
                f = rng.choice(["get", "get", "contains", "set", "delete", "pop", "setdefault"])
                dead = time.monotonic() >= state["killed"]
                reading = f in ("get", "contains")
                # before the kill, A writes and both read (B's writes would make A step
                # aside); after it, B does everything
                port = (rng.choice((a.port, b.port)) if reading else a.port) if not dead else b.port
                arg = f"{w}.{i}" if f in ("set", "setdefault") else None
                args: dict[str, Any] = {"key": encode_key(key)}
                if arg is not None:
                    args["value"] = base64.b64encode(arg.encode()).decode()
                start = time.monotonic()
                try:
                    answer = post(port, compute, name, f, args)
                except (OSError, http.client.HTTPException, RuntimeError):
                    with lock:
                        history.append(Operation(key, f, arg, None, start, math.inf, w))
                    continue
                end = time.monotonic()
                value = answer.get("value")
                decoded = base64.b64decode(value).decode() if isinstance(value, str) else None
                result: Any = {
                    "get": decoded,
                    "set": None,
                    "delete": answer.get("found"),
                    "contains": answer.get("found"),
                    "pop": decoded,
                    "setdefault": decoded,
                }[f]
                with lock:
                    history.append(Operation(key, f, arg, result, start, end, w))

        threads = [threading.Thread(target=worker, args=(w,)) for w in range(6)]
        for t in threads:
            t.start()
        time.sleep(1.0)
        a.kill()  # SIGKILL: no resignation, no revoke; its lease must run out
        state["killed"] = time.monotonic()
        for t in threads:
            t.join()

        killed = state["killed"]
        # "0" (base64 "MA==") was set before: the checker starts x from it
        history.insert(0, Operation("x", "set", "0", None, -2.0, -1.0, -1))
        assert check_dict(history) == []
        before = [o for o in history if not o.unknown and o.ret < killed]
        after = [o for o in history if not o.unknown and o.call > killed]
        writes_after = [o for o in after if o.f in ("set", "delete", "pop", "setdefault")]
        assert len(before) > 50
        assert writes_after, "B's writes never went on"
        resumed = min(o.ret for o in writes_after) - killed
        print(
            f"{len(history)} operations, {sum(o.unknown for o in history)} unknown; B's "
            f"first write after the kill answered {resumed:.2f} s after it"
        )
        assert resumed < TTL + 2.5  # the dead owner's lease, and a step aside's polling
    finally:
        a.stop()
        b.stop()
