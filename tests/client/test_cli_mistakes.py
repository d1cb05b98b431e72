"""Issue 39, point 7: a user's mistake is one line on stderr (one JSON object with
``--json``) and an exit status, never a traceback: every command of ``o41``, run as a
process, with no endpoint set, a token file that is not there, a kubeconfig that is not
there."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from testbed.process import LOOPBACK, free_port

SERVICE = ("--org", "ml", "--artifact", "model")
COMMANDS = {
    "write": ("write", *SERVICE, "FILE"),
    "read": ("read", *SERVICE, "--version", "latest", "--output", "OUT"),
    "files": ("files", *SERVICE),
    "versions": ("versions", *SERVICE),
    "versions of the organization": ("versions", "--org", "ml"),
    "tags": ("tag", *SERVICE),
    "tag": ("tag", *SERVICE, "best"),
    "tag move": ("tag", *SERVICE, "best", "latest", "--expect-absent"),
    "tag delete": ("tag", *SERVICE, "best", "--delete"),
}


def o41(*args: str, tmp: Path, **env: str) -> subprocess.CompletedProcess[str]:
    given = {k: v for k, v in os.environ.items() if not k.startswith("O41_ARTIFACTS_")}
    given.update(O41_ARTIFACTS_CLOUD="aws", O41_ARTIFACTS_REGION="us-east-1", **env)
    (tmp / "FILE").write_bytes(b"weights")
    return subprocess.run(
        [sys.executable, "-m", "o41.cli", *args],
        env=given,
        cwd=tmp,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.parametrize("json_errors", [False, True], ids=["text", "json"])
@pytest.mark.parametrize("command", list(COMMANDS))
def test_no_endpoint_is_one_line_and_no_traceback(
    command: str, json_errors: bool, tmp_path: Path
) -> None:
    args = COMMANDS[command] + (("--json",) if json_errors else ())
    done = o41(*args, tmp=tmp_path)
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    (line,) = done.stderr.splitlines()
    said = "no placement service endpoint: set O41_ARTIFACTS_ENDPOINT or pass --endpoint"
    if json_errors:
        assert json.loads(line) == {"error": said, "status": None}
    else:
        assert line == f"o41 {args[0]}: {said}"
    assert done.stdout == ""


@pytest.mark.parametrize("command", ["write", "versions", "tag move"])
def test_a_missing_token_file_is_named(command: str, tmp_path: Path) -> None:
    missing = tmp_path / "no-such-token"
    endpoint = f"http://{LOOPBACK}:{free_port()}"  # never asked: the file is read first
    done = o41(
        *COMMANDS[command], "--endpoint", endpoint, "--token-file", str(missing), tmp=tmp_path
    )
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    (line,) = done.stderr.splitlines()
    assert f"cannot read the token file {missing}: No such file or directory" in line
    assert "--token-file or O41_ARTIFACTS_TOKEN_FILE" in line
    # the same file named by the environment
    done = o41(
        *COMMANDS[command],
        "--json",
        "--endpoint",
        endpoint,
        tmp=tmp_path,
        O41_ARTIFACTS_TOKEN_FILE=str(missing),
    )
    assert done.returncode == 1
    assert str(missing) in json.loads(done.stderr)["error"]


def test_a_bad_retry_deadline_is_one_line(tmp_path: Path) -> None:
    done = o41(
        *COMMANDS["versions"],
        "--endpoint",
        f"http://{LOOPBACK}:1",
        tmp=tmp_path,
        O41_ARTIFACTS_RETRY_DEADLINE="five minutes",
    )
    assert done.returncode == 1 and "Traceback" not in done.stderr
    (line,) = done.stderr.splitlines()
    assert "O41_ARTIFACTS_RETRY_DEADLINE='five minutes' is not a number of seconds" in line


@pytest.mark.parametrize(
    "args",
    [
        ("status", "ml"),
        ("token", "list"),
        ("cluster", "add", "workload", "--from-kubeconfig", "KUBECONFIG"),
        ("admin", "rebuild"),
    ],
    ids=lambda a: " ".join(a[:2]),
)
def test_the_admin_commands_without_a_kubeconfig_say_so(
    args: tuple[str, ...], tmp_path: Path
) -> None:
    nowhere = str(tmp_path / "no-kubeconfig")
    args = tuple(nowhere if a == "KUBECONFIG" else a for a in args)
    extra = () if "--from-kubeconfig" in args else ("--kubeconfig", nowhere)
    done = o41(*args, *extra, tmp=tmp_path, KUBECONFIG=nowhere)
    assert done.returncode in (1, 2), done.stderr
    assert "Traceback" not in done.stderr
    assert len(done.stderr.splitlines()) == 1, done.stderr
    assert "kubeconfig" in done.stderr.lower() or "configuration" in done.stderr.lower()
