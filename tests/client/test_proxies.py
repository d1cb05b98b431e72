"""Issue 39, point 4: ``HTTPS_PROXY``, ``HTTP_PROXY`` and ``NO_PROXY`` (and their lowercase
names) are honoured as requests and urllib3 honour them, for the placement service and for
the buckets' URLs: through a local forward proxy (testbed/proxy.py) that records what it
tunnelled (CONNECT, for https and the collections' socket) and what it forwarded (a plain
http request in absolute form). The whole stack through it (the real service and the S3
stand-in) is tests/client/test_hub_blink_stack.py's."""

from __future__ import annotations

import base64
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from o41.client.collections import Client as Collections
from o41.client.connection import Connection
from o41.client.errors import ConfigError, ConnectError
from o41.client.transfers import connection, proxy_for
from stub_service import Answer, StubService
from testbed.pki import Authority
from testbed.process import LOOPBACK
from testbed.proxy import ForwardProxy

PROXY_ENV = ("http_proxy", "https_proxy", "all_proxy", "no_proxy")


@pytest.fixture(autouse=True)
def no_proxy_set(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test sets the variables it means; none comes from the machine."""
    for name in PROXY_ENV:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)


@pytest.fixture
def proxy() -> Any:
    with ForwardProxy() as running:
        yield running


def answer(method: str, path: str, body: Any) -> Answer:
    if path == "/v1/collections":
        return Answer(404, {"error": "no WebSocket here"})  # the collections: POSTs
    if path.endswith("/tags"):
        return Answer(200, {"tags": []})
    return Answer(200, {"path": path, "value": 3})


def test_an_https_service_is_reached_through_a_connect_tunnel(
    proxy: ForwardProxy, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ca = Authority.create(tmp_path / "ca")
    pair = ca.issue("hub", "hub", ips=(LOOPBACK,))
    with StubService(answer, https=(str(pair.cert), str(pair.key))) as hub:
        monkeypatch.setenv("HTTPS_PROXY", proxy.url)
        service = Connection(hub.url, token="t", ca_file=str(ca.cert_path))
        assert service.request("GET", "/v1/usage")["path"] == "/v1/usage"
        # TLS end to end: the proxy saw the tunnel's end, not the request
        assert proxy.tunnels == [f"{LOOPBACK}:{hub.port}"] and proxy.forwarded == []
        # a bucket's https URL (transfers.connection: uploads and the read path) too
        conn, target = connection(f"{hub.url}/bucket/key?X-Amz-Signature=s", 10, service.tls())
        conn.request("GET", target)
        assert conn.getresponse().read()
        conn.close()
        assert target == "/bucket/key?X-Amz-Signature=s"
        assert proxy.tunnels == [f"{LOOPBACK}:{hub.port}"] * 2
        # NO_PROXY names the host: straight there
        monkeypatch.setenv("no_proxy", f"example.com,{LOOPBACK}")
        assert service.request("GET", "/v1/usage")["path"] == "/v1/usage"
        assert len(proxy.tunnels) == 2
    assert hub.asked("/v1/usage") == 2


def test_a_plain_http_service_goes_through_in_absolute_form_with_credentials(
    proxy: ForwardProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    with StubService(answer) as hub:
        user_url = proxy.url.replace("http://", "http://trainer:s%3Acret@")
        monkeypatch.setenv("http_proxy", user_url)
        monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")  # the lowercase one wins
        service = Connection(hub.url, token="t")
        assert service.request("POST", "/v1/writes", {"size": 1}, idempotent=True)
        assert proxy.forwarded == [f"POST {hub.url}/v1/writes"]
        basic = base64.b64encode(b"trainer:s:cret").decode()
        assert proxy.authorizations == [f"Basic {basic}"]
        # the collections' socket tunnels with CONNECT, http too (a WebSocket could not
        # go through in absolute form)
        client = Collections.over(service, "job-1")
        assert client.counter("steps").add(1) == 3
        assert proxy.tunnels == [f"{LOOPBACK}:{hub.port}"] * 2  # the upgrade, then POSTs
        monkeypatch.setenv("NO_PROXY", "*")  # every host
        assert service.request("GET", "/v1/usage")["path"] == "/v1/usage"
        assert len(proxy.forwarded) == 1


def test_the_command_honours_the_proxy_and_no_proxy(proxy: ForwardProxy, tmp_path: Path) -> None:
    with StubService(answer) as hub:
        env = {k: v for k, v in os.environ.items() if not k.startswith("O41_ARTIFACTS_")}
        env.update(O41_ARTIFACTS_TOKEN="t", HTTP_PROXY=proxy.url)
        command = [sys.executable, "-m", "o41.cli", "tag", "--org", "ml", "--artifact", "m"]
        command += ["--endpoint", hub.url, "--json"]
        for name, value in (("NO_PROXY", ""), ("NO_PROXY", LOOPBACK)):
            done = subprocess.run(
                command, env={**env, name: value}, capture_output=True, text=True, check=False
            )
            assert done.returncode == 0, done.stderr
        tags = f"GET {hub.url}/v1/organizations/ml/artifacts/m/tags"
        assert proxy.forwarded == [tags]  # the first, not the one NO_PROXY bypassed
        assert hub.asked("/v1/organizations/ml/artifacts/m/tags") == 2


def test_the_proxy_is_chosen_as_requests_chooses_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from urllib.parse import urlsplit

    def chosen(url: str) -> str | None:
        found = proxy_for(urlsplit(url))
        return None if found is None else f"{found.address[0]}:{found.address[1]}"

    assert chosen("https://hub.example.com") is None  # nothing set
    monkeypatch.setenv("HTTPS_PROXY", "proxy.corp:3128")  # no scheme: http://
    monkeypatch.setenv("ALL_PROXY", "http://all.corp")
    monkeypatch.setenv("NO_PROXY", ".internal, bucket.example.com:9000")
    assert chosen("https://hub.example.com") == "proxy.corp:3128"
    assert chosen("http://hub.example.com") == "all.corp:80"  # no HTTP_PROXY: ALL_PROXY
    assert chosen("https://hub.svc.internal") is None  # a domain suffix
    assert chosen("https://internal") is None
    assert chosen("https://bucket.example.com:9000/x") is None  # host:port
    assert chosen("https://bucket.example.com/x") == "proxy.corp:3128"
    monkeypatch.setenv("HTTPS_PROXY", "https://tls.corp:443")
    with pytest.raises(ConfigError, match="only http:// proxies"):
        chosen("https://hub.example.com")


def test_a_proxy_that_is_down_is_a_connect_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing went past the proxy: retried for any call, and named as unreached."""
    monkeypatch.setenv("HTTPS_PROXY", "http://127.0.0.1:9")
    service = Connection("https://hub.example.com", token="t", retry_deadline=0)
    with pytest.raises(ConnectError, match="cannot reach the placement service"):
        service.request("POST", "/v1/writes/v/commit", {})
