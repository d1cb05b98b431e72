"""The collections client over https: a pod behind a TLS-terminating proxy or a mesh, or a
service given a certificate, trusting a private CA through ``SSL_CERT_FILE`` (the
standard library's default verify paths, so the artifacts client takes it as well; in a
pod the file is a bundle of the system's CAs and the private one). ``O41_ARTIFACTS_CA_FILE``,
the hub's bundle alone, is tested in test_placement_https.py; a refusal names it.

The service here is the real collections routes served over TLS on 127.0.0.1, with a
serving certificate of a throwaway CA.
"""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from pathlib import Path

import pytest

from o41.client.collections import HttpTransport, Unavailable
from o41.state.memory import MemoryStore
from test_collections_support import ServiceThread
from testbed.pki import Authority
from testbed.process import LOOPBACK


@pytest.fixture
def ca(tmp_path: Path) -> Authority:
    return Authority.create(tmp_path / "service-ca")


@pytest.fixture
def service(ca: Authority) -> Iterator[ServiceThread]:
    serving = ca.issue("service", LOOPBACK, ips=(LOOPBACK,))
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(serving.cert, serving.key)
    running = ServiceThread(MemoryStore, ssl_context=context).start()
    try:
        yield running
    finally:
        running.stop()


@pytest.mark.parametrize("websocket", [True, False], ids=["websocket", "post"])
def test_the_client_speaks_https_to_a_service_of_a_private_ca(
    service: ServiceThread, ca: Authority, monkeypatch: pytest.MonkeyPatch, websocket: bool
) -> None:
    assert service.url.startswith("https://")
    monkeypatch.setenv("SSL_CERT_FILE", str(ca.cert_path))
    client = service.client(websocket=websocket)
    checkpoints = client.dict("checkpoints")
    checkpoints["step-1"] = b"w" * 100_000  # several TLS records, several WebSocket frames
    assert checkpoints["step-1"] == b"w" * 100_000
    assert client.counter("processed").add(2) == 2
    transport = client.transport
    assert isinstance(transport, HttpTransport)
    assert transport.websocket is websocket


def test_a_service_certificate_the_pod_does_not_trust_is_refused_saying_what_to_do(
    service: ServiceThread, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stranger = Authority.create(tmp_path / "another-ca")
    monkeypatch.setenv("SSL_CERT_FILE", str(stranger.cert_path))
    with pytest.raises(Unavailable) as refused:
        service.client().dict("checkpoints")["step-1"] = b"never sent"
    message = str(refused.value)
    assert "certificate verify failed" in message
    assert "set O41_ARTIFACTS_CA_FILE to the hub's CA bundle" in message
    # nothing reached the store
    assert service.run(service.store.range(b"/o41/collections/")) == []
