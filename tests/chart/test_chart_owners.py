"""The hub chart's ``placement.collectionOwners`` and the remote chart's tier's
``collections.owners`` (issue 41): the service's ``O41_COLLECTIONS_OWNERS``
(docs/collections.md, "Owners"). Off by default (nothing rendered), ``guard`` then
``on``; a bare YAML ``off`` (a boolean) and any other word are refused by the schema; an
upgrade from a running service without the guard straight to ``on`` is refused, as the
two-rollout rule says (``helm template --is-upgrade --dry-run=server`` looks the running
Deployment up as ``helm upgrade`` does, against the test bed's API server).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from test_chart import CHART, container, find, render, run_helm
from test_chart_remote import REMOTE
from testbed.kube import Kube

PLACEMENT = "o41-artifacts-placement"
TIER = "w-o41-remote-collections"  # release w's collections tier
HUB = ("--set", "placement.collectionOwners={}")
TIER_ON = ("--set", "hub.endpoint=https://hub.example.com", "--set", "collections.enabled=true",
           "--set", "collections.owners={}")  # fmt: skip


def owners_env(docs: list[dict[str, Any]]) -> list[str]:
    env = container(find(docs, "Deployment", "-placement"))["env"]
    return [e["value"] for e in env if e["name"] == "O41_COLLECTIONS_OWNERS"]


def test_off_by_default_the_service_gets_nothing_of_it() -> None:
    assert owners_env(render()) == []


@pytest.mark.parametrize("value", ["guard", "on"])
def test_guard_and_on_reach_the_service(value: str) -> None:
    assert owners_env(render(f"placement.collectionOwners={value}")) == [value]


def test_a_bare_off_and_other_words_are_refused_with_the_choices(tmp_path: Path) -> None:
    values = tmp_path / "values.yaml"
    values.write_text("placement:\n  collectionOwners: off\n")  # YAML 1.1: false
    done = run_helm("template", "o41", str(CHART), "-f", str(values))
    assert done.returncode != 0
    assert "/placement/collectionOwners" in done.stderr and "want string" in done.stderr
    done = run_helm("template", "o41", str(CHART), "--set", "placement.collectionOwners=yes")
    assert done.returncode != 0
    assert "value must be one of 'off', 'guard', 'on'" in done.stderr, done.stderr


@pytest.mark.kube
@pytest.mark.parametrize(
    ("release", "chart", "deployment", "sets", "told"),
    [
        ("o41", CHART, PLACEMENT, HUB, "the running service has no guard (off)"),
        ("w", REMOTE, TIER, TIER_ON, "the running tier has no guard (off)"),
    ],
    ids=["hub", "remote-tier"],
)
def test_an_upgrade_from_off_straight_to_on_is_refused_and_through_guard_is_not(
    kube: Kube,
    namespace: str,
    release: str,
    chart: Path,
    deployment: str,
    sets: tuple[str, ...],
    told: str,
) -> None:
    def running(owners: str | None) -> None:
        """The Deployment as a release of that setting runs it."""
        env = [] if owners is None else [{"name": "O41_COLLECTIONS_OWNERS", "value": owners}]
        labels = {"app": "o41"}
        manifest = {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": deployment, "namespace": namespace},
            "spec": {
                "replicas": 0,
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {"containers": [{"name": "o41", "image": "o41", "env": env}]},
                },
            },
        }
        kube.kubectl("apply", "-f", "-", input=json.dumps(manifest))

    def upgrade(value: str) -> Any:
        return run_helm(
            "template", release, str(chart), "--namespace", namespace, "--is-upgrade",
            "--dry-run=server", "--kubeconfig", str(kube.kubeconfig),
            *[s.format(value) for s in sets],
        )  # fmt: skip

    running(None)  # off: no guard
    refused = upgrade("on")
    assert refused.returncode != 0
    assert told in refused.stderr, refused.stderr
    assert "=guard first" in refused.stderr
    assert upgrade("guard").returncode == 0
    running("guard")  # rolled out
    done = upgrade("on")
    assert done.returncode == 0, done.stderr
    assert 'name: O41_COLLECTIONS_OWNERS\n              value: "on"' in done.stdout


def test_the_remote_tier_takes_the_value_too() -> None:
    argv = ["template", "w", str(REMOTE), "--namespace", "ml"]
    done = run_helm(*argv, *[s.format("guard") for s in TIER_ON])
    assert done.returncode == 0, done.stderr
    assert 'name: O41_COLLECTIONS_OWNERS\n              value: "guard"' in done.stdout
    done = run_helm(*argv, *[s.format("off") for s in TIER_ON])
    assert done.returncode == 0, done.stderr
    assert "O41_COLLECTIONS_OWNERS" not in done.stdout
