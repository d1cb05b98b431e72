"""``o41 place`` run as scripts run it: a real subprocess, an exact output, an exit code."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from testbed.metadata import AwsImds, GcpMetadata, isolate, write_dmi

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"


@pytest.fixture(autouse=True)
def isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    """Loopback-only inputs; the subprocess inherits them through the environment."""
    escapes = isolate(monkeypatch, tmp_path)
    pythonpath = os.environ.get("PYTHONPATH")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(SRC), pythonpath])))
    yield tmp_path / "dmi"
    assert escapes == []


def o41(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The real ``o41`` entry point in a fresh interpreter."""
    return subprocess.run(
        [sys.executable, "-m", "o41.cli", *args],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, **(env or {})},
        cwd=ROOT,
        check=False,
    )


def test_json_env() -> None:
    done = o41(
        "place", "--json", env={"O41_ARTIFACTS_CLOUD": "GCP", "O41_ARTIFACTS_REGION": "us-east1"}
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == '{"cloud": "gcp", "region": "us-east1", "source": "env"}\n'


def test_json_unknown_place_is_an_answer() -> None:
    done = o41("place", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"cloud": None, "region": None, "source": "none"}
    assert done.stdout.count("\n") == 1


def test_json_skypilot() -> None:
    info = json.dumps({"cluster_name": "c", "cloud": "Nebius", "region": "eu-north1", "zone": None})
    done = o41("place", "--json", env={"SKYPILOT_CLUSTER_INFO": info})
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {
        "cloud": "nebius",
        "region": "eu-north1",
        "source": "skypilot",
    }


def test_json_metadata(isolated: Path) -> None:
    write_dmi(isolated, sys_vendor="Amazon EC2")
    with AwsImds("il-central-1") as imds:
        done = o41("place", "--json", env={"O41_ARTIFACTS_AWS_METADATA_URL": imds.url})
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {
        "cloud": "aws",
        "region": "il-central-1",
        "source": "metadata",
    }
    assert imds.count == 2


def test_json_metadata_without_region(isolated: Path) -> None:
    write_dmi(isolated, product_name="Google Compute Engine")
    done = o41("place", "--json")  # the GCP URL is a closed loopback port
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"cloud": "gcp", "region": None, "source": "metadata"}


def test_json_malformed_skypilot_warns_on_stderr_and_keeps_stdout_json() -> None:
    done = o41("place", "--json", env={"SKYPILOT_CLUSTER_INFO": "{broken"})
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"cloud": None, "region": None, "source": "none"}
    assert "SKYPILOT_CLUSTER_INFO" in done.stderr
    assert done.stderr.count("SKYPILOT_CLUSTER_INFO") == 1


@pytest.mark.parametrize(
    ("present", "missing"),
    [
        ("O41_ARTIFACTS_CLOUD", "O41_ARTIFACTS_REGION"),
        ("O41_ARTIFACTS_REGION", "O41_ARTIFACTS_CLOUD"),
    ],
)
@pytest.mark.parametrize("as_json", [True, False])
def test_half_set_env_exits_2_with_one_line(present: str, missing: str, as_json: bool) -> None:
    args = ["place", "--json"] if as_json else ["place"]
    done = o41(*args, env={present: "aws"})
    assert done.returncode == 2
    assert done.stdout == ""
    assert "Traceback" not in done.stderr
    assert done.stderr.endswith("\n")
    assert done.stderr.count("\n") == 1
    assert missing in done.stderr
    if as_json:  # an error is one JSON object on stderr when --json is given
        assert missing in json.loads(done.stderr)["error"]
    else:
        assert done.stderr.startswith("o41 place: ")


def test_human_output_explains_each_step(isolated: Path) -> None:
    write_dmi(isolated, product_name="Google Compute Engine")
    info = json.dumps({"cluster_name": "c", "cloud": "Kubernetes", "region": "ctx", "zone": None})
    with GcpMetadata("projects/9/zones/me-west1-a") as gcp:
        done = o41(
            "place", env={"O41_ARTIFACTS_GCP_METADATA_URL": gcp.url, "SKYPILOT_CLUSTER_INFO": info}
        )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "place: gcp / me-west1 (source metadata)"
    body = "\n".join(lines[1:])
    for source in ("env", "skypilot", "metadata"):
        assert source in body
    assert "kubernetes" in body
    assert "Google Compute Engine" in body


def test_human_output_unknown() -> None:
    done = o41("place")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == "place: unknown (source none)"
    assert "none" in done.stdout.splitlines()[-1]


def test_console_script() -> None:
    """The installed ``o41`` script if the venv has one, else pyproject's target called so."""
    script = Path(sys.executable).with_name("o41")
    if script.exists():
        argv = [str(script)]
    else:  # not installed (a bare checkout): call ``o41.cli:main`` exactly as the script would
        target = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
        module, func = target["o41"].split(":")
        argv = [sys.executable, "-c", f"import sys, {module}; sys.exit({module}.{func}())"]
    half_set = subprocess.run(
        [*argv, "place", "--json"],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "O41_ARTIFACTS_REGION": "eastus"},
        check=False,
    )
    assert (half_set.returncode, half_set.stdout) == (2, "")
    assert half_set.stderr.count("\n") == 1
    assert "O41_ARTIFACTS_CLOUD" in half_set.stderr
    done = subprocess.run(
        [*argv, "place", "--json"],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "O41_ARTIFACTS_CLOUD": "azure", "O41_ARTIFACTS_REGION": "eastus"},
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == '{"cloud": "azure", "region": "eastus", "source": "env"}\n'


def test_no_subcommand_is_a_usage_error() -> None:
    done = o41()
    assert done.returncode == 2
    assert "place" in done.stderr


def test_imports_stay_light() -> None:
    """Pods import the client often: no SDK, no HTTP client until the firmware names a cloud.

    The second half (threading, logging, json, pathlib) is what place.py keeps lazy on
    purpose; a regression here costs every pod a few milliseconds at start-up.
    """
    code = (
        "import sys, o41.cli, o41.client.place\n"
        "from o41.client.place import detect_place\n"
        "detect_place()\n"
        "heavy = ('aiohttp', 'boto3', 'botocore', 'google', 'azure', 'kubernetes', 'kopf',"
        " 'pydantic', 'http', 'urllib', 'ssl', 'socket',"
        " 'threading', 'logging', 'json', 'pathlib')\n"
        "print(sorted(m for m in sys.modules if m in heavy or m.split('.')[0] in heavy))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=30, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
