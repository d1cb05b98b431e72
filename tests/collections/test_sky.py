"""``from o41 import sky``: the spec's examples as written, on the embedded backend (one
process, same API and semantics), the compute a pod belongs to, and a light import."""

from __future__ import annotations

import subprocess
import sys
import threading
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from o41 import sky
from o41.client.collections import Client, EmbeddedTransport, compute_from_environment


@pytest.fixture
def embedded(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The module-level factories on a fresh embedded backend, as on a laptop."""
    monkeypatch.delenv("O41_ARTIFACTS_ENDPOINT", raising=False)
    monkeypatch.setenv("O41_COMPUTE", "laptop")
    sky.configure(None)
    try:
        yield
    finally:
        current = sky.client()
        sky.configure(None)
        assert isinstance(current.transport, EmbeddedTransport)
        current.transport.close()


def write_checkpoint() -> None:
    """The spec's stand-in for real work."""


@sky.function
def save_checkpoint(step: Any, model: Any) -> Any:
    checkpoints = sky.registry("checkpoints")
    checkpoints.register(step, model)
    return checkpoints.list()


@sky.function
def worker_step(batch: Any) -> None:
    processed = sky.counter("processed")
    processed.add(len(batch))
    with sky.lock("checkpoint"):
        write_checkpoint()


def test_the_spec_examples_run_as_written(embedded: None) -> None:
    assert save_checkpoint(10, {"layer": [0.5, 0.25]}) == [10]
    assert save_checkpoint(20, {"layer": [0.75]}) == [10, 20]
    threads = [threading.Thread(target=worker_step, args=([1] * n,)) for n in range(1, 9)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sky.counter("processed").get() == sum(range(1, 9))

    models = sky.registry("checkpoints")
    models.register(30, {"layer": [1.0]})  # on the node that trained it
    latest_step = max(models.list())
    model = models.lookup(latest_step)  # on any node that wants it
    assert model == {"layer": [1.0]}
    assert sky.queue("tasks").poll() is None  # an empty queue returns None


def test_every_factory_and_both_consistencies_embedded(embedded: None) -> None:
    for consistency in typing.get_args(sky.Consistency):
        d = sky.dict("d", consistency=consistency)
        d["k"] = {"v": 1}
        assert d["k"] == {"v": 1} and d.pop("k") == {"v": 1} and d.get("k") is None
        s = sky.set("s", consistency=consistency)
        s.add("m")
        assert s.items() == {"m"}
        c = sky.counter(f"c-{consistency}", consistency=consistency)
        assert c.add(2) == 2 and c.get() == 2
        q = sky.queue(f"q-{consistency}", consistency=consistency)
        q.offer(1)
        assert q.poll() == 1 and q.poll() is None
        r = sky.registry("r", consistency=consistency)
        r.register("a", 1)
        assert r.lookup("a") == 1 and r.list() == ["a"]
    assert sky.barrier("b", 1).wait() == 0
    with sky.lock("l", ttl=5, timeout=1) as lock:
        assert lock.token > 0
    with pytest.raises(TimeoutError):
        sky.barrier("b2", 2).wait(timeout=0.1)


def test_function_marks_and_runs_as_is() -> None:
    @sky.function
    def plain(x: int) -> int:
        return x + 1

    @sky.function()
    def called(x: int) -> int:
        return x * 2

    assert plain(1) == 2 and called(2) == 4
    assert plain.__o41_function__ and called.__o41_function__  # type: ignore[attr-defined]


def test_consistency_is_the_spec_literal() -> None:
    assert typing.get_args(sky.Consistency) == ("strong", "eventual")
    assert sky.DistributedRegistry is sky.Registry
    with pytest.raises(ValueError, match="consistency"):
        Client(EmbeddedTransport()).dict("d", consistency="weak")  # type: ignore[arg-type]


def test_the_compute_comes_from_the_pods_job(tmp_path: Path) -> None:
    nowhere = str(tmp_path / "none")
    assert compute_from_environment({"O41_COMPUTE": "train"}, nowhere) == "train"
    labels = tmp_path / "labels"
    labels.write_text('app="x"\nbatch.kubernetes.io/job-name="train-42"\njob-name="train-42"\n')
    assert compute_from_environment({}, str(labels)) == "train-42"
    labels.write_text('job-name="older"\n')
    assert compute_from_environment({}, str(labels)) == "older"
    in_pod = {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "HOSTNAME": "train-42-x7k2p"}
    assert compute_from_environment(in_pod, nowhere) == "train-42"
    indexed = {
        "KUBERNETES_SERVICE_HOST": "10.0.0.1",
        "HOSTNAME": "train-42-3",
        "JOB_COMPLETION_INDEX": "3",
    }
    assert compute_from_environment(indexed, nowhere) == "train-42"
    indexed_pod_name = {**indexed, "HOSTNAME": "train-42-3-x7k2p"}
    assert compute_from_environment(indexed_pod_name, nowhere) == "train-42"
    assert compute_from_environment({"HOSTNAME": "my-laptop"}, nowhere) == "local"
    with pytest.raises(ValueError, match="bad compute name"):
        compute_from_environment({"O41_COMPUTE": "no/slash"}, nowhere)


def test_importing_sky_stays_light() -> None:
    code = (
        "import sys; from o41 import sky; "
        "print(sorted(m for m in ('aiohttp', 'grpc', 'aetcd', 'kopf', 'kubernetes', 'boto3', "
        "'pydantic', 'asyncio') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
