"""Where a pod's collections go (issue 40, point 2): ``O41_COLLECTIONS_ENDPOINT`` (this
cluster's tier) before ``O41_ARTIFACTS_ENDPOINT`` (the hub), else embedded; the tier's CA
and token default to the artifacts' ones (an HTTPS tier, ``python -m o41.webhook --serve
collections`` with ``O41_TLS_*``, checked with either); and what ``o41 status`` says."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from o41.client.collections import Client, Unavailable
from o41.client.endpoints import collections_route
from o41.client.transport import EmbeddedTransport, HttpTransport
from testbed.pki import Authority
from testbed.process import LOOPBACK, free_port
from testbed.product import CollectionsProcess, TierProcess

TIER = "http://tier.o41-system:8080"
HUB = "https://hub.example:8443"


@pytest.fixture
def clean(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in list(os.environ):
        if name.startswith(("O41_ARTIFACTS_", "O41_COLLECTIONS_")):
            monkeypatch.delenv(name)
    return monkeypatch


def test_the_tier_when_set_else_the_hub_else_embedded(clean: pytest.MonkeyPatch) -> None:
    assert collections_route().where == "embedded"
    assert isinstance(Client.from_environment().transport, EmbeddedTransport)

    clean.setenv("O41_ARTIFACTS_ENDPOINT", HUB)
    hub = collections_route()
    assert (hub.where, hub.endpoint) == ("hub", HUB)

    clean.setenv("O41_COLLECTIONS_ENDPOINT", TIER + "/")
    tier = collections_route()
    assert (tier.where, tier.endpoint) == ("tier", TIER)
    transport = Client.from_environment().transport
    assert isinstance(transport, HttpTransport)
    assert transport.connection.endpoint == TIER


def test_the_tier_takes_the_artifacts_token_and_ca_unless_given_its_own(
    clean: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    clean.setenv("O41_ARTIFACTS_ENDPOINT", HUB)
    clean.setenv("O41_COLLECTIONS_ENDPOINT", TIER)
    (tmp_path / "token").write_text("the-pods-token\n")
    clean.setenv("O41_ARTIFACTS_TOKEN_FILE", str(tmp_path / "token"))
    clean.setenv("O41_ARTIFACTS_CA_FILE", "/etc/o41/hub-ca.crt")
    connection = collections_route().connection
    assert connection is not None
    assert connection.bearer() == "the-pods-token"
    assert connection.ca_file == "/etc/o41/hub-ca.crt"

    (tmp_path / "tier-token").write_text("the-tiers-token")
    clean.setenv("O41_COLLECTIONS_TOKEN_FILE", str(tmp_path / "tier-token"))
    clean.setenv("O41_COLLECTIONS_CA_FILE", "/etc/o41/tier-ca.crt")
    connection = collections_route().connection
    assert connection is not None
    assert connection.bearer() == "the-tiers-token"
    assert connection.ca_file == "/etc/o41/tier-ca.crt"


def _status(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("O41_")}
    return subprocess.run(
        [sys.executable, "-m", "o41.cli", "status"],
        env={**base, "O41_ARTIFACTS_RETRY_DEADLINE": "0", **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.fixture
def standalone(tmp_path: Path) -> Iterator[CollectionsProcess]:
    """The collections without authentication, embedded store: something that answers."""
    process = CollectionsProcess([], tmp_path / "collections.log", extra=("--namespace", "ml"))
    process.start()
    try:
        yield process
    finally:
        process.stop()


def test_o41_status_says_where_the_collections_go_and_whether_they_answer(
    standalone: CollectionsProcess,
) -> None:
    done = _status({})
    assert (done.returncode, done.stdout.splitlines()) == (
        0,
        [
            "artifacts: no endpoint ($O41_ARTIFACTS_ENDPOINT is not set)",
            "collections: embedded in this process (neither $O41_COLLECTIONS_ENDPOINT nor "
            "$O41_ARTIFACTS_ENDPOINT is set)",
        ],
    )

    done = _status({"O41_ARTIFACTS_ENDPOINT": standalone.url})
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        f"artifacts: {standalone.url} (the hub, $O41_ARTIFACTS_ENDPOINT)",
        f"collections: {standalone.url} (the hub, $O41_ARTIFACTS_ENDPOINT; "
        "$O41_COLLECTIONS_ENDPOINT is not set)",
        "  reached: namespace 'ml' holds 0 entries, 0 bytes",
    ]

    closed = f"http://{LOOPBACK}:{free_port()}"  # nothing listens there
    done = _status({"O41_ARTIFACTS_ENDPOINT": standalone.url, "O41_COLLECTIONS_ENDPOINT": closed})
    lines = done.stdout.splitlines()
    assert done.returncode == 1
    assert lines[1] == (
        f"collections: {closed} (this cluster's collections tier, $O41_COLLECTIONS_ENDPOINT)"
    )
    assert lines[2].startswith(f"  not reached: cannot reach the collections tier at {closed}")
    assert "check O41_COLLECTIONS_ENDPOINT" in lines[2]


@pytest.fixture
def tls_tier(tmp_path: Path) -> Iterator[tuple[TierProcess, Authority]]:
    """``python -m o41.webhook --serve collections`` over HTTPS (a throwaway CA), no
    authentication, the embedded store: the tier's TLS and the client's CA choice."""
    ca = Authority.create(tmp_path / "tier-ca")
    serving = ca.issue("tier", LOOPBACK, ips=(LOOPBACK,))
    tls = {"O41_TLS_CERT_FILE": str(serving.cert), "O41_TLS_KEY_FILE": str(serving.key)}
    process = TierProcess(
        tmp_path / "no-kubeconfig",
        [],
        tmp_path,
        env=tls,
        extra=("--authentication", "none"),
        ca_file=ca.cert_path,
    )
    process.start()
    try:
        yield process, ca
    finally:
        process.stop()


def test_an_https_tier_is_checked_with_its_ca_else_the_hubs(
    clean: pytest.MonkeyPatch, tls_tier: tuple[TierProcess, Authority], tmp_path: Path
) -> None:
    tier, ca = tls_tier
    stranger = Authority.create(tmp_path / "another-ca")
    clean.setenv("O41_ARTIFACTS_RETRY_DEADLINE", "0")
    clean.setenv("O41_COLLECTIONS_ENDPOINT", tier.url)
    clean.setenv("O41_COLLECTIONS_CA_FILE", str(ca.cert_path))
    clean.setenv("O41_ARTIFACTS_CA_FILE", str(stranger.cert_path))  # the hub's: not the tier's
    assert tier.url.startswith("https://")
    assert Client.from_environment().counter("steps").add(2) == 2

    clean.delenv("O41_COLLECTIONS_CA_FILE")  # one CA for both: the artifacts' is taken
    clean.setenv("O41_ARTIFACTS_CA_FILE", str(ca.cert_path))
    assert Client.from_environment().counter("steps").add(1) == 3

    clean.setenv("O41_COLLECTIONS_CA_FILE", str(stranger.cert_path))
    with pytest.raises(Unavailable, match="certificate verify failed") as refused:
        Client.from_environment().counter("steps").add(1)
    said = str(refused.value)
    assert f"the collections tier at {tier.url} has a certificate that " in said
    assert f"O41_COLLECTIONS_CA_FILE={stranger.cert_path} does not vouch for" in said
