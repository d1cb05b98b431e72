"""The light install (issue 38): what a training image gets from `pip install o41-artifacts`
with no extras runs the pod's side end to end. The server's dependencies are made
unimportable in the pod's processes (a ``sitecustomize`` that refuses them, as a venv
without them would), and `o41 write`, `o41 read` and ``sky.counter`` run against the real
service. The static half is the import contract "What pods import needs only the light
install" (pyproject.toml); the packages and megabytes each install brings are measured in
docs/development.md."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from fixtures.world import World

pytestmark = [pytest.mark.kube, pytest.mark.stores, pytest.mark.etcd]

ROOT = Path(__file__).resolve().parents[2]


def server_only() -> list[str]:
    """The import names of the `server` extra's distributions (and what they bring)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["optional-dependencies"]["server"], "the server extra is gone"
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    light = next(c for c in contracts["contracts"] if c["name"].startswith("What pods import"))
    return list(light["forbidden_modules"])


@pytest.fixture(scope="module")
def light_env(world: World) -> dict[str, str]:
    """PYTHONPATH with a sitecustomize that refuses the server's packages."""
    folder = world.tmp / "light-install"
    folder.mkdir(exist_ok=True)
    (folder / "sitecustomize.py").write_text(
        "import sys\n"
        f"SERVER = {set(server_only())!r}\n"
        "class Light:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in SERVER:\n"
        "            raise ModuleNotFoundError(f'{name} is not in the light install', name=name)\n"
        "sys.meta_path.insert(0, Light())\n"
    )
    return {"PYTHONPATH": str(folder)}


def test_the_light_install_refuses_what_it_does_not_have(light_env: dict[str, str]) -> None:
    """The stand-in for a venv without the extra does refuse the server's packages."""
    done = subprocess.run(
        [sys.executable, "-c", "import kubernetes"],
        env={**os.environ, **light_env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1 and "not in the light install" in done.stderr


def test_o41_write_read_and_sky_counter_run_on_the_light_install(
    world: World, light_env: dict[str, str]
) -> None:
    data = os.urandom(70_000)
    path = world.tmp / "light-model"
    path.write_bytes(data)
    args = ("--org", world.org, "--artifact", "light")
    place = ("aws", "us-east-1")
    done = world.o41("write", *args, str(path), "--json", token=world.team_a, place=place,
                     env=light_env)  # fmt: skip
    assert done.returncode == 0, done.stderr
    version = json.loads(done.stdout)["version"]
    back = world.tmp / "light-back"
    done = world.o41("read", *args, "--version", version, "--output", str(back),
                     token=world.team_a, place=place, env=light_env)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert back.read_bytes() == data

    code = "from o41 import artifacts, sky\nc = sky.counter('light')\nc.add(3)\nprint(c.get())\n"
    env = {k: v for k, v in os.environ.items() if not k.startswith("O41_")}
    env.update(
        light_env,
        O41_ARTIFACTS_ENDPOINT=world.service.url,
        O41_ARTIFACTS_TOKEN_FILE=str(world.team_a),
        O41_COMPUTE=f"light-{os.getpid()}",
    )
    ran = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60,
        check=False,
    )  # fmt: skip
    assert (ran.returncode, ran.stdout.strip()) == (0, "3"), ran.stderr


def test_an_admin_command_on_the_light_install_says_which_extra_it_needs(
    light_env: dict[str, str],
) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "o41.cli", "token", "list"],
        env={**os.environ, **light_env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert "pip install 'o41-artifacts[server]'" in done.stderr
