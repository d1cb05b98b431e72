"""``o41 versions``, ``o41 tag``, ``--version latest|TAG``, ``--metadata``, ``-V`` and
``--json`` errors: the real ``o41`` entry point in a subprocess against the in-process
service (``test_writes.serve``: the app on the embedded store, a stand-in bucket)."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from o41 import __version__
from test_retention import rules
from test_writes import Service, serve
from testbed.locations import ORG

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
async def service(tmp_path: Path) -> AsyncIterator[Service]:
    async for s in serve(tmp_path):
        yield s


async def o41(service: Service, *args: str) -> tuple[int, str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("O41_", "SKYPILOT_"))}
    env.update(
        {
            "PYTHONPATH": str(ROOT / "src"),
            "O41_ARTIFACTS_ENDPOINT": service.url,
            "O41_ARTIFACTS_TOKEN_FILE": str(service.token),
            "O41_ARTIFACTS_CLOUD": "aws",
            "O41_ARTIFACTS_REGION": "us-west-2",
        }
    )
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "o41.cli",
        *args,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_the_program_version_and_the_read_version_are_apart(service: Service) -> None:
    for flag in ("-V", "--version"):
        code, out, _ = await o41(service, flag)
        assert (code, out) == (0, f"o41 {__version__}\n")
    code, _, err = await o41(service, "read", "--org", ORG, "--artifact", "a", "--output", "x")
    assert code == 2 and "--version" in err  # the read's --version is its own, required
    code, _, err = await o41(service, "versions", "--artifact", "a", "--json")
    assert code == 2 and "--org" in json.loads(err)["error"]  # a usage error, as JSON


async def test_write_list_tag_and_read_by_tag_from_the_command_line(
    service: Service, tmp_path: Path
) -> None:
    art = ["--org", ORG, "--artifact", "ckpt"]
    versions = []
    for step in range(3):
        f = tmp_path / f"step{step}"
        f.write_bytes(f"weights {step}".encode())
        code, out, err = await o41(
            service,
            "write",
            *art,
            str(f),
            "--metadata",
            f"step={step}",
            "--metadata",
            '{"metrics": {"loss": 0.5}}',
            "--tag",
            "last-written",
            "--json",
        )
        assert code == 0, err
        written = json.loads(out)
        assert written["tag"] == "last-written"
        versions.append(written["version"])

    code, out, err = await o41(service, "versions", *art, "--limit", "2", "--json")
    assert code == 0, err
    page = json.loads(out)
    assert [v["version"] for v in page["versions"]] == versions[:0:-1]
    assert page["versions"][0]["metadata"] == {"step": 2, "metrics": {"loss": 0.5}}
    code, out, err = await o41(service, "versions", *art, "--cursor", page["next"])
    assert code == 0 and out.split()[0] == versions[0], (out, err)
    code, out, _ = await o41(service, "versions", "--org", ORG)
    assert code == 0 and out.startswith(f"ckpt  last {versions[2]}")

    code, out, err = await o41(service, "tag", *art, "best", versions[0], "--expect-absent")
    assert code == 0 and f"now points at {versions[0]} (new)" in out, err
    code, out, err = await o41(
        service, "tag", *art, "best", versions[1], "--expect", versions[2], "--json"
    )
    assert code == 1 and out == ""
    refused = json.loads(err)  # one JSON object on stderr
    assert (refused["status"], refused["current"]) == (409, versions[0])
    assert f"points at version {versions[0]}" in refused["error"]

    code, out, err = await o41(service, "tag", *art)
    assert code == 0 and sorted(line.split()[0] for line in out.splitlines()) == [
        "best",
        "last-written",
    ]

    dest = tmp_path / "back"
    for ref, want in (("best", 0), ("latest", 2), (versions[1], 1)):
        code, out, err = await o41(
            service, "read", *art, "--version", ref, "--output", str(dest), "--json"
        )
        assert code == 0, err
        got = json.loads(out)
        assert dest.read_bytes() == f"weights {want}".encode()
        if ref == versions[want]:  # by id: the format scripts already parse, unchanged
            assert got == {"location": "west", "locality": "local"}
        else:  # by latest or a tag: which version it read
            assert (got["version"], got["tag"]) == (versions[want], ref if ref == "best" else None)

    code, out, err = await o41(service, "tag", *art, "best", "--delete")
    assert code == 0 and versions[0] in out, err
    code, out, err = await o41(
        service, "read", *art, "--version", "best", "--output", str(dest), "--json"
    )
    assert code == 1 and json.loads(err)["status"] == 404
    assert "has no tag 'best'" in json.loads(err)["error"]


async def test_bad_metadata_and_tags_are_refused_before_anything_is_written(
    service: Service, tmp_path: Path
) -> None:
    f = tmp_path / "f"
    f.write_bytes(b"x")
    art = ["--org", ORG, "--artifact", "bad"]
    for extra, want in [
        (["--metadata", "novalue"], "KEY=VALUE"),
        (["--metadata", "{not json"], "not JSON"),
        (["--metadata", "bad key=1"], "metadata key 'bad key'"),
        (["--tag", "x" * 64], "1 to 63 characters"),
    ]:
        code, out, err = await o41(service, "write", *art, str(f), *extra, "--json")
        assert code == 1 and out == "" and want in json.loads(err)["error"], (extra, err)
        code, out, err = await o41(service, "write", *art, str(f), *extra)
        assert code == 1 and err.startswith("o41 write: ") and want in err, (extra, err)
    assert service.storage.signed == []
    code, out, _ = await o41(service, "versions", *art, "--json")
    assert code == 0 and json.loads(out)["versions"] == []


async def test_the_example_jobs_script_resumes_from_latest(service: Service) -> None:
    """examples/job.yaml's Python, as its two pods run it, twice: the first run trains 2
    steps, the second (STEPS=4) resumes each pod at step 2 from its latest directory
    checkpoint and reads the other's latest. (tests/client/test_training_stack.py kills it.)"""
    import yaml

    docs = list(yaml.safe_load_all((ROOT / "examples" / "job.yaml").read_text()))
    (job,) = [d for d in docs if d and d["kind"] == "Job"]
    script = job["spec"]["template"]["spec"]["containers"][0]["args"][0]

    async def pod(index: int, run: int, steps: int) -> str:
        code, out, err = await o41_python(
            service, script, index, compute=f"share-{run}", steps=steps, run=run
        )
        assert code == 0, err
        return out

    first = await asyncio.gather(pod(0, 1, 2), pod(1, 1, 2))
    for out in first:
        assert "resumed" not in out and "counter: 2" in out, first
        assert [
            json.loads(line[6:])["step"] for line in out.splitlines() if line.startswith("wrote ")
        ] == [0, 1], out
        assert "tag first stays at" not in out and "at step 1" in out
    second = await asyncio.gather(pod(0, 2, 4), pod(1, 2, 4))
    for out in second:
        assert "step 1 metadata" in out.split("resumed from", 1)[1].splitlines()[0], out
        assert [
            json.loads(line[6:])["step"] for line in out.splitlines() if line.startswith("wrote ")
        ] == [2, 3], out
        assert "tag first stays at" in out and "counter: 2" in out and "at step 3" in out
    latest = json.loads(
        (await o41(service, "versions", "--org", ORG, "--artifact", "checkpoint-0", "--json"))[1]
    )["versions"]
    assert [v["metadata"]["step"] for v in latest] == [3, 2, 1, 0]
    assert all(v["files"] == 4 for v in latest)


async def o41_python(
    service: Service, script: str, index: int, compute: str, steps: int, run: int
) -> tuple[int, str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("O41_", "SKYPILOT_"))}
    work = service.token.parent / f"pod-{index}-run-{run}"
    work.mkdir()
    env.update(
        {
            "PYTHONPATH": str(ROOT / "src"),
            "O41_ARTIFACTS_ENDPOINT": service.url,
            "O41_ARTIFACTS_TOKEN_FILE": str(service.token),
            "O41_ARTIFACTS_CLOUD": "aws",
            "O41_ARTIFACTS_REGION": "us-east-1",
            "O41_COMPUTE": compute,
            "JOB_COMPLETION_INDEX": str(index),
            "ORG": ORG,
            "STEPS": str(steps),
            "WORK_DIR": str(work),
        }
    )
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        script,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_a_write_begun_and_half_uploaded_is_finished_with_resume(
    service: Service, tmp_path: Path
) -> None:
    """`o41 write --resume VERSION` sends only the parts the bucket lacks, then commits."""
    part = 8 * 1024 * 1024
    data = os.urandom(part + 1000)
    place = {"cloud": "aws", "region": "us-east-1", "source": "env"}
    body = {"organization": ORG, "artifact": "half", "size": len(data), "place": place}
    status, began = await service.api("POST", "/v1/writes", {**body, "partSize": part})
    assert status == 201, began
    first = began["upload"]["multipart"]["parts"][0]
    async with aiohttp.ClientSession() as s, s.put(first["url"], data=data[:part]) as r:
        assert r.status == 200  # the pod that began it sent part 1, then died
    f = tmp_path / "half"
    f.write_bytes(data)
    art = ["--org", ORG, "--artifact", "half"]
    code, out, err = await o41(
        service, "write", *art, str(f), "--resume", began["version"], "--json"
    )
    assert code == 0, err
    assert json.loads(out)["version"] == began["version"]
    key = f"/bucket-east/half/{began['version']}"
    assert sorted(service.storage.puts) == [f"{key} 1", f"{key} 2"]  # part 1 once
    back = tmp_path / "back"
    code, _, err = await o41(service, "read", *art, "--version", "latest", "--output", str(back))
    assert code == 0, err
    assert back.read_bytes() == data


async def test_the_versions_list_says_what_the_retention_rule_keeps(service: Service) -> None:
    """The organization's rule for an artifact is in its versions page (``keepVersions``)
    and under ``o41 versions`` (on stderr: stdout stays one line a version)."""
    rules(service, 3)  # the artifact "ckpt" keeps its newest 3
    code, out, err = await o41(service, "versions", "--org", ORG, "--artifact", "ckpt", "--json")
    assert code == 0, err
    assert json.loads(out)["keepVersions"] == 3
    code, out, err = await o41(service, "versions", "--org", ORG, "--artifact", "ckpt")
    assert (code, out) == (0, ""), err
    assert "retention keeps the newest 3 and the tagged ones" in err
    code, out, err = await o41(service, "versions", "--org", ORG, "--artifact", "model", "--json")
    assert code == 0 and json.loads(out)["keepVersions"] is None, err
    code, _, err = await o41(service, "versions", "--org", ORG, "--artifact", "model")
    assert code == 0 and "retention" not in err, err
