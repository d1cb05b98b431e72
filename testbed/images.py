"""The project's images, built by ``hack/image.sh`` with podman: no Docker, no registry.

``build()`` runs the script (a no-op when the images of the current sources exist: tags are
content hashes) and returns their references and the docker-archive files that the real
node's containerd imports. podman runs with the project's own config and storage
(``podman_env()``), never the machine's defaults.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from testbed.process import cache_dir

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "hack" / "image.sh"


@dataclass(frozen=True)
class Images:
    """References of the app, etcd and pause images (``localhost/...:<content hash>``)."""

    app: str
    etcd: str
    pause: str

    def all(self) -> tuple[str, ...]:
        return (self.app, self.etcd, self.pause)


def _run(*args: str) -> str:
    done = subprocess.run(
        [str(SCRIPT), *args], capture_output=True, text=True, check=False, timeout=3600
    )
    if done.returncode != 0:
        tail = "\n".join(done.stderr.splitlines()[-30:])
        raise RuntimeError(f"hack/image.sh {' '.join(args)} exited {done.returncode}:\n{tail}")
    return done.stdout


def _parse(out: str) -> Images:
    refs = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    return Images(app=refs["app"], etcd=refs["etcd"], pause=refs["pause"])


def build() -> Images:
    """Build what is missing (minutes the first time, about a second after) and return the
    references of the images of the current sources."""
    return _parse(_run())


def current() -> Images:
    """The references the current sources would have, built or not."""
    return _parse(_run("--print"))


def podman_env() -> dict[str, str]:
    """The environment that points podman at the project's config and storage."""
    env = {}
    for line in _run("--env").splitlines():
        key, _, value = line.removeprefix("export ").partition("=")
        env[key] = value
    return env


def podman(
    *args: str, check: bool = True, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """Run podman with the project's config and storage."""
    done = subprocess.run(
        ["podman", *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=timeout,
        env={**os.environ, **podman_env()},
    )
    if check and done.returncode != 0:
        raise RuntimeError(f"podman {' '.join(args)} exited {done.returncode}: {done.stderr}")
    return done


def archive(ref: str) -> Path:
    """The docker-archive that ``hack/image.sh`` saved for ``ref``."""
    return cache_dir() / "images" / (ref.replace("/", "_").replace(":", "_") + ".tar")
