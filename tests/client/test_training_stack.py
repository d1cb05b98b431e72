"""examples/job.yaml's training loop, killed and started again, on the whole stack: the
real placement service process (TokenReview against the real API server, state in a
3-member etcd), a Location on the S3 stand-in (versitygw, which checks every signature),
and the Job's own script (read out of examples/job.yaml, so the Job and this test run one
file) as real processes, its two pods' worth.

Pod 1 trains 3 steps and waits at the Job's barrier. Pod 0 trains 6, saving a directory
checkpoint (two model shards, the optimizer's state, trainer_state.json) with its step and
loss as metadata every step; it is killed with SIGKILL as soon as it said it saved step 2
(no pause between steps: the kill lands in step 3, before its directory is committed; on
this machine before any of its files reached the bucket), then started again as a new pod
would be (an empty working directory). It must resume from the newest committed version
(the one ``latest`` names after the kill), from the step in that directory's
trainer_state.json, and the Job then finishes as it does when nothing is killed.

Every step's state is a pure function of the previous one (``train_step`` below is the
script's), so a resume that read anything but the committed bytes would write wrong bytes
from then on; each version read back is compared byte for byte with the bytes computed
here for its step.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import pytest
import yaml

from o41.artifacts import Client, NotFound
from o41.core.places import Place
from testbed.stores import S3Store

from fixtures.world import World

pytestmark = [pytest.mark.kube, pytest.mark.stores, pytest.mark.etcd]

ROOT = Path(__file__).resolve().parents[2]
FILES = {
    "model-00001-of-00002.bin": 256 << 10,
    "model-00002-of-00002.bin": 256 << 10,
    "optimizer.pt": 128 << 10,
}


def the_jobs_script() -> str:
    docs = list(yaml.safe_load_all((ROOT / "examples" / "job.yaml").read_text()))
    (job,) = [d for d in docs if d and d["kind"] == "Job"]
    script: str = job["spec"]["template"]["spec"]["containers"][0]["args"][0]
    return script


def expected(step: int) -> dict[str, bytes]:
    """The directory the script saves at ``step``, computed from scratch."""
    state = {f: hashlib.shake_256(f.encode()).digest(n) for f, n in FILES.items()}
    for s in range(step + 1):
        salt = s.to_bytes(8, "big")
        state = {f: hashlib.shake_256(b + salt).digest(len(b)) for f, b in state.items()}
    trainer = json.dumps({"step": step, "loss": 1 / (step + 1)}).encode()
    return {**state, "trainer_state.json": trainer}


def uploaded(w: World, s3: S3Store, artifact: str) -> list[str]:
    """The keys under ``artifact/`` in the east bucket."""
    location = json.loads(w.kube.kubectl("get", "location", w.east, "-o", "json"))
    listed = s3.client().list_objects_v2(Bucket=location["status"]["bucket"], Prefix=f"{artifact}/")
    return [o["Key"] for o in listed.get("Contents", [])]


def uploaded_versions(w: World, s3: S3Store, artifact: str) -> set[str]:
    """The version ids with at least one object under ``artifact`` in the east bucket."""
    return {key.split("/")[1] for key in uploaded(w, s3, artifact)}


def tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


class Pod:
    """The Job's script as one pod of it: a real process; its stdout lines are kept."""

    def __init__(self, w: World, index: int, steps: int, compute: str) -> None:
        work = w.tmp / f"pod-{index}-{uuid.uuid4().hex[:6]}"  # a new pod's empty /tmp
        work.mkdir()
        env = w.pod_environ("aws", "us-east-1", strip=("O41_", "SKYPILOT_"))
        env.update(
            {
                "O41_ARTIFACTS_ENDPOINT": w.service.url,
                "O41_ARTIFACTS_TOKEN_FILE": str(w.team_a),
                "O41_COMPUTE": compute,
                "JOB_COMPLETION_INDEX": str(index),
                "ORG": w.org,
                "STEPS": str(steps),
                "WORK_DIR": str(work),
            }
        )
        self.proc = subprocess.Popen(
            [sys.executable, "-c", the_jobs_script()],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: list[str] = []
        self.at: list[float] = []  # when each stdout line came
        self.err: list[str] = []
        self._threads = [
            threading.Thread(target=self._keep, args=(self.proc.stdout, self.lines), daemon=True),
            threading.Thread(target=self._keep, args=(self.proc.stderr, self.err), daemon=True),
        ]
        for t in self._threads:
            t.start()

    def _keep(self, stream: IO[str] | None, into: list[str]) -> None:
        assert stream is not None
        for line in stream:
            if into is self.lines:
                self.at.append(time.monotonic())
            into.append(line.rstrip("\n"))

    def step_seconds(self) -> list[float]:
        """The time between two saved steps: one step of the loop, its checkpoint's write."""
        at = [a for a, line in zip(self.at, self.lines, strict=True) if line.startswith("wrote ")]
        return [b - a for a, b in itertools.pairwise(at)]

    def wrote(self) -> list[int]:
        """The steps this pod said it saved, in order."""
        return [json.loads(line[6:])["step"] for line in self.lines if line.startswith("wrote ")]

    def until_wrote(self, step: int, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while step not in self.wrote():
            assert self.proc.poll() is None, (self.lines, self.err)
            assert time.monotonic() < deadline, (f"step {step} not saved", self.lines, self.err)
            time.sleep(0.005)

    def finish(self, seconds: float) -> str:
        code = self.proc.wait(seconds)
        for t in self._threads:
            t.join(10)
        assert code == 0, "\n".join(self.lines + self.err)
        return "\n".join(self.lines)


@pytest.fixture
def pods() -> Iterator[list[Pod]]:
    """The pods a test starts; any still running at its end (a failed test) are killed."""
    started: list[Pod] = []
    yield started
    for pod in started:
        if pod.proc.poll() is None:
            pod.proc.kill()
            pod.proc.wait(10)


def test_the_jobs_training_loop_killed_mid_run_resumes_from_the_newest_checkpoint(
    world: World,
    s3: S3Store,
    pods: list[Pod],
) -> None:
    w = world
    client = Client(w.service.url, str(w.team_a), place=Place("aws", "us-east-1", "env"))
    compute = f"train-{uuid.uuid4().hex[:6]}"

    other = Pod(w, 1, steps=3, compute=compute)  # trains 3 steps, then waits for pod 0
    first = Pod(w, 0, steps=6, compute=compute)
    pods += [other, first]
    first.until_wrote(2, seconds=120)
    first.proc.send_signal(signal.SIGKILL)
    assert first.proc.wait(30) == -signal.SIGKILL
    said = first.wrote()
    assert said[:3] == [0, 1, 2] and said == list(range(len(said))), first.lines

    # what survived the kill: only committed versions, each whole, newest first
    kept = list(client.versions(w.org, "checkpoint-0"))
    newest = kept[0].metadata["step"]
    assert [v.metadata["step"] for v in kept] == list(range(newest, -1, -1))
    assert newest in (said[-1], said[-1] + 1)  # step 3 may have committed before it died
    latest = client.latest(w.org, "checkpoint-0")
    assert latest is not None and latest.version == kept[0].version
    # a directory the kill cut short may have files in the bucket: no reader sees it
    in_bucket = uploaded_versions(w, s3, "checkpoint-0")
    assert in_bucket >= {v.version for v in kept}  # the listing of the bucket sees them
    half = in_bucket - {v.version for v in kept}
    for version in half:
        with pytest.raises(NotFound):
            client.files(w.org, "checkpoint-0", version)
    print(
        f"killed after step {said[-1]} was said; newest committed {newest}; "
        f"uncommitted in the bucket: {len(half)}"
    )

    again = Pod(w, 0, steps=6, compute=compute)  # the Job's new pod for index 0
    pods.append(again)
    out = again.finish(180)
    resumed = re.search(r"^resumed from (\S+) step (\d+) metadata (.*)$", out, re.M)
    assert resumed is not None, out
    assert (resumed.group(1), int(resumed.group(2))) == (latest.version, newest)
    assert json.loads(resumed.group(3)) == {"step": newest, "loss": 1 / (newest + 1)}
    assert again.wrote() == list(range(newest + 1, 6))  # on from there; nothing from 0
    assert "tag first stays at" in out  # the killed run's step 0 kept it
    assert re.search(r"^read \S+ of the other pod from \S+ at step 2$", out, re.M), out
    assert "counter: 2" in out  # the killed pod never counted itself
    theirs = other.finish(60)
    assert re.search(r"^read \S+ of the other pod from \S+ at step 5$", theirs, re.M), theirs
    assert "counter: 2" in theirs and other.wrote() == [0, 1, 2]

    # the listing: steps 0..5 once each, every one a directory of 4 with its metadata
    versions = list(client.versions(w.org, "checkpoint-0"))
    assert [v.metadata for v in versions] == [
        {"step": s, "loss": 1 / (s + 1)} for s in range(5, -1, -1)
    ]
    assert all((v.files, v.location) == (4, w.east) for v in versions)
    assert [v.version for v in versions[-len(kept) :]] == [v.version for v in kept]
    assert sorted(uploaded(w, s3, "checkpoint-0")) == sorted(
        f"checkpoint-0/{v.version}/{f}" for v in versions for f in expected(0)
    )  # a directory's files are its objects, under the version's key; nothing else
    first_tag = client.resolve(w.org, "checkpoint-0", "first")
    assert first_tag.version == versions[-1].version  # step 0's

    # every version read back is, byte for byte, what that step saved
    for v in versions:
        step = v.metadata["step"]
        want = expected(step)
        back = w.tmp / f"back-{v.version}"
        read = client.read(w.org, "checkpoint-0", v.version, back)
        assert (read.version, read.files) == (v.version, 4)
        assert tree(back) == want, step
        listed = client.files(w.org, "checkpoint-0", v.version)
        assert [(f.path, f.size, f.md5) for f in listed.files] == sorted(
            (p, len(b), hashlib.md5(b).hexdigest()) for p, b in want.items()
        )
        assert listed.metadata == v.metadata

    # measured, not asserted: a step's directory save against the same bytes as one file
    one = b"".join(expected(0).values())
    single = []
    for _ in range(5):
        t0 = time.monotonic()
        client.write(w.org, "one-file", one)
        single.append(time.monotonic() - t0)
    steps = sorted(again.step_seconds())
    print(
        f"a step with its 4-file directory save: median {steps[len(steps) // 2] * 1000:.0f} ms "
        f"of {len(steps)}; the same {len(one)} bytes as one file: median "
        f"{sorted(single)[2] * 1000:.0f} ms of 5"
    )
