"""The state store over TLS to an etcd that asks for client certificates, as a production
etcd is run: what works, what etcd refuses and what the refusal tells the user, and the
settings that cannot work, refused before anything starts.

The etcd here is the test bed's own (``state_etcd_tls``): https:// client URLs, a serving
certificate for 127.0.0.1 and ``--client-cert-auth`` with a throwaway CA.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from o41.client.collections import Client, HttpTransport
from o41.state import EtcdTls, StoreUnavailable, store_settings
from o41.state.etcd import EtcdStore
from testbed.etcd import EtcdCluster
from testbed.pki import Authority
from testbed.product import SAFE_ENV, CollectionsProcess

SRC = str(Path(__file__).resolve().parents[2] / "src")


def test_settings_that_cannot_work_are_refused_saying_what_to_fix(tmp_path: Path) -> None:
    ca = Authority.create(tmp_path / "pki")
    client = ca.issue("client", "o41", client=True)
    ca_only = {"O41_ETCD_CA_FILE": str(ca.cert_path)}
    with pytest.raises(ValueError, match=r"mix http:// and https://"):
        store_settings("https://127.0.0.1:2379,http://127.0.0.1:2380", {})
    with pytest.raises(ValueError, match=r"TLS files are given .* endpoints are http://"):
        store_settings("http://127.0.0.1:2379", ca_only)
    with pytest.raises(ValueError, match=r"TLS files are given but no etcd endpoints"):
        store_settings("", ca_only)
    with pytest.raises(ValueError, match=r"a client certificate needs its key"):
        store_settings("https://127.0.0.1:2379", {"O41_ETCD_CERT_FILE": str(client.cert)})
    missing = tmp_path / "nowhere" / "ca.crt"
    with pytest.raises(ValueError, match=rf"cannot read the CA certificate {missing}"):
        store_settings("https://127.0.0.1:2379", {"O41_ETCD_CA_FILE": str(missing)})
    with pytest.raises(ValueError, match=r"not an etcd client URL"):
        store_settings("ftp://127.0.0.1:2379", {})
    # and what does work: https with a CA and a client pair, https on the system's roots
    pair = EtcdTls(str(ca.cert_path), str(client.cert), str(client.key))
    urls = "https://127.0.0.1:2379,https://127.0.0.1:2380"
    assert store_settings(urls, pair.environment()) == (urls.split(","), pair)
    assert store_settings("https://127.0.0.1:2379", {}) == (["https://127.0.0.1:2379"], None)
    assert store_settings("", {}) == ([], None)


def test_the_environment_names_the_files() -> None:
    env = {"O41_ETCD_CA_FILE": "/tls/ca.crt", "O41_ETCD_CERT_FILE": "/tls/tls.crt"}
    found = EtcdTls.from_environment(env)
    assert found == EtcdTls("/tls/ca.crt", "/tls/tls.crt", None)
    assert found is not None and found.environment() == env
    assert EtcdTls.from_environment({"O41_ETCD_CA_FILE": ""}) is None
    assert EtcdTls.from_environment({}) is None


@pytest.mark.etcd
async def test_without_a_client_certificate_etcd_refuses_and_the_error_says_where_to_look(
    state_etcd_tls: EtcdCluster,
) -> None:
    good = state_etcd_tls.client_tls
    store = EtcdStore(state_etcd_tls.endpoints, timeout=1, tls=EtcdTls(ca_file=good.ca_file))
    try:
        with pytest.raises(StoreUnavailable) as refused:
            await store.put(b"/tls-test/no-cert", b"x")
    finally:
        await store.close()
    message = str(refused.value)
    assert "etcd did not answer put" in message
    assert "over TLS: check O41_ETCD_CA_FILE, O41_ETCD_CERT_FILE and O41_ETCD_KEY_FILE" in message
    # nothing was written: the same key read with a good certificate is absent
    store = EtcdStore(state_etcd_tls.endpoints, timeout=5, tls=good)
    try:
        assert await store.get(b"/tls-test/no-cert") is None
    finally:
        await store.close()


@pytest.mark.etcd
async def test_an_etcd_whose_certificate_another_ca_signed_is_not_trusted(
    state_etcd_tls: EtcdCluster, tmp_path: Path
) -> None:
    other = Authority.create(tmp_path / "other-ca")
    good = state_etcd_tls.client_tls
    store = EtcdStore(
        state_etcd_tls.endpoints,
        timeout=1,
        tls=EtcdTls(str(other.cert_path), good.cert_file, good.key_file),
    )
    try:
        with pytest.raises(StoreUnavailable) as refused:
            await store.get(b"/tls-test/any")
    finally:
        await store.close()
    assert "CERTIFICATE_VERIFY_FAILED" in str(refused.value)
    assert "over TLS: check" in str(refused.value)


def live_files(directory: Path, ca: str | None, cert: Path | str, key: Path | str) -> EtcdTls:
    """TLS files the way a mounted Secret holds them: one directory, replaced in place."""
    directory.mkdir(exist_ok=True)
    assert ca is not None
    for name, source in (("ca.crt", ca), ("tls.crt", cert), ("tls.key", key)):
        shutil.copyfile(source, directory / name)
    return EtcdTls(*(str(directory / n) for n in ("ca.crt", "tls.crt", "tls.key")))


@pytest.mark.etcd
async def test_a_renewed_client_certificate_is_used_without_a_restart(
    state_etcd_tls: EtcdCluster, tmp_path: Path
) -> None:
    good = state_etcd_tls.client_tls
    assert good.cert_file is not None and good.key_file is not None
    stale = Authority.create(tmp_path / "other-ca").issue("client", "o41", client=True)
    live = tmp_path / "live"
    tls = live_files(live, good.ca_file, stale.cert, stale.key)  # etcd does not trust it
    store = EtcdStore(state_etcd_tls.endpoints, timeout=1, tls=tls, reload_every=0)
    try:
        with pytest.raises(StoreUnavailable):
            await store.put(b"/tls-test/renewed", b"refused")
        live_files(live, good.ca_file, good.cert_file, good.key_file)  # the renewal
        await store.put(b"/tls-test/renewed", b"after the renewal")
        kv = await store.get(b"/tls-test/renewed")
        assert kv is not None
        assert kv.value == b"after the renewal"
    finally:
        await store.close()


@pytest.mark.etcd
async def test_a_watch_goes_on_across_a_renewal(
    state_etcd_tls: EtcdCluster, tmp_path: Path
) -> None:
    good = state_etcd_tls.client_tls
    assert state_etcd_tls.authority is not None and good.cert_file and good.key_file
    live = tmp_path / "live"
    store = EtcdStore(
        state_etcd_tls.endpoints,
        timeout=1,  # also how long a retired channel's calls may go on
        tls=live_files(live, good.ca_file, good.cert_file, good.key_file),
        reload_every=0,
    )
    prefix = f"/tls-test/{tmp_path.name}/".encode()
    events = store.watch(prefix, start_revision=await store.put(prefix + b"a", b"1"))
    try:
        first = await asyncio.wait_for(anext(events), 10)
        assert first.kv.value == b"1"
        renewed = state_etcd_tls.authority.issue("client-renewed", "o41-placement", client=True)
        live_files(live, good.ca_file, renewed.cert, renewed.key)
        await store.put(prefix + b"b", b"2")  # over a new channel: the old one retires
        # the old channel closes once its grace is over, cancelling the watch's stream on it
        await asyncio.wait_for(asyncio.gather(*store._retiring.values()), 10)
        await store.put(prefix + b"c", b"3")
        seen = [await asyncio.wait_for(anext(events), 10) for _ in range(2)]
        assert [(e.kind, e.kv.key, e.kv.value) for e in seen] == [
            ("put", prefix + b"b", b"2"),
            ("put", prefix + b"c", b"3"),
        ]
    finally:
        await events.aclose()  # type: ignore[attr-defined]
        await store.close()


@pytest.mark.etcd
async def test_the_collections_keep_their_state_in_an_etcd_spoken_to_over_tls(
    state_etcd_tls: EtcdCluster, tmp_path: Path
) -> None:
    service = CollectionsProcess(
        state_etcd_tls.endpoints,
        tmp_path / "service.log",
        env=state_etcd_tls.client_tls.environment(),
    ).start()
    try:
        client = Client(HttpTransport(service.url, token="test"), "tls-job")
        checkpoints = client.dict("checkpoints")
        checkpoints["step-1"] = b"weights"
        assert checkpoints["step-1"] == b"weights"
        assert client.counter("processed").add(3) == 3
    finally:
        service.stop()
    # the bytes are in etcd, read back over TLS by a client of our own
    store = EtcdStore(state_etcd_tls.endpoints, timeout=5, tls=state_etcd_tls.client_tls)
    try:
        kv = await store.get(b"/o41/collections/default/tls-job/counter/processed/value")
        assert kv is not None
        assert kv.value == b"3"
        entries = await store.range(b"/o41/collections/default/tls-job/dict/checkpoints/")
        assert len(entries) == 1
    finally:
        await store.close()


@pytest.mark.parametrize("main", ["o41.webhook", "o41.webhook.collections"])
def test_a_server_given_settings_that_cannot_work_stops_with_one_line(
    main: str, tmp_path: Path
) -> None:
    done = subprocess.run(
        [sys.executable, "-m", main, "--port", "1", "--etcd", "http://127.0.0.1:1"],
        env={**SAFE_ENV, "PYTHONPATH": SRC, "O41_ETCD_CA_FILE": str(tmp_path / "ca.crt")},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert "etcd TLS files are given" in done.stderr
    assert "endpoints are http://" in done.stderr
    assert "Traceback" not in done.stderr
    assert f"usage: python -m {main}" in done.stderr  # argparse's own refusal
