"""The hub chart's optional etcd for the collections alone (issue 40, point 1's "optionally
in the hub's chart"): ``collections.etcd.enabled`` renders a second 3-member etcd of
etcd.*'s settings and gives the placement service ``--collections-etcd``; off (the
default), nothing of it is rendered.

Its TLS, as the template makes it (``certificates.generator: helm``): the state store's
clients' CA signed the service's client certificate once and its key is kept nowhere, so
the collections' etcd gets a serving CA of its own, which the service's ``ca.crt`` then
holds beside the first; its members let in the state store's clients' CA (the service's
certificate). Shown by starting both rendered etcds on loopback and the service's store
reading and writing each with exactly the files the chart gives it; and on an upgrade
(``helm template --dry-run=server``, which looks up as an upgrade does, against the test
bed's API server): the state store's certificates are kept, the bundle is made, and a
second upgrade keeps the collections' certificates too.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from cryptography import x509

from o41.client.collections import Client
from o41.client.transport import HttpTransport
from o41.state import store_settings
from o41.state.etcd import EtcdStore
from test_chart import CHART, KUBE_VERSION, NAMESPACE, Doc, container, find, render, run_helm
from test_chart_etcd_tls import SRC, URL, ChartEtcd, Members, decode_secret, http_status
from testbed.kube import Kube
from testbed.process import LOOPBACK, Server, free_port
from testbed.product import SAFE_ENV, install_crds

ON = "collections.etcd.enabled=true"
COLLECTIONS = "o41-artifacts-collections-etcd"
ETCD = "o41-artifacts-etcd"


def named(docs: list[Doc], kind: str, name: str) -> Doc:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, (kind, name)
    return found[0]


def test_off_by_default_nothing_of_it_is_rendered() -> None:
    docs = render()
    assert not [d for d in docs if "collections-etcd" in d["metadata"]["name"]]
    assert "--collections-etcd" not in container(find(docs, "Deployment", "-placement"))["args"]


def test_on_it_renders_a_second_etcd_and_the_services_flag() -> None:
    docs = render(ON)
    for kind in ("StatefulSet", "Service", "PodDisruptionBudget", "NetworkPolicy"):
        doc = named(docs, kind, COLLECTIONS)
        assert doc["metadata"]["labels"]["app.kubernetes.io/component"] == "collections-etcd"
    statefulset = named(docs, "StatefulSet", COLLECTIONS)
    assert statefulset["spec"]["replicas"] == 3
    args = container(statefulset)["args"]
    assert f"--initial-cluster-token={COLLECTIONS}" in args
    assert f"--peer-cert-allowed-cn={COLLECTIONS}-peer" in args
    # the state store's etcd is as it was
    assert (
        container(named(docs, "StatefulSet", ETCD))["args"]
        == container(find(render(), "StatefulSet", f"{ETCD}"))["args"]
    )
    placement = container(find(docs, "Deployment", "-placement"))["args"]
    urls = ",".join(f"https://{COLLECTIONS}-{i}.{COLLECTIONS}.{NAMESPACE}.svc:2379"
                    for i in range(3))  # fmt: skip
    assert placement[placement.index("--collections-etcd") + 1] == urls
    # its client port only from the service, its peer port only from its own members
    policy = named(docs, "NetworkPolicy", COLLECTIONS)
    [clients, peers] = policy["spec"]["ingress"]
    assert clients["from"][0]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == (
        "placement"
    )
    assert peers["from"][0]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == (
        "collections-etcd"
    )
    for doc in docs:
        kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)
    lint = run_helm("lint", "--strict", str(CHART), "--set", ON)
    assert lint.returncode == 0, lint.stdout + lint.stderr


def test_with_cert_manager_its_certificates_come_from_the_same_issuer() -> None:
    docs = render(ON, "etcd.tls.certManager.enabled=true")
    certificates = {d["metadata"]["name"]: d["spec"] for d in docs if d["kind"] == "Certificate"}
    server = certificates[f"{COLLECTIONS}-server-tls"]
    peer = certificates[f"{COLLECTIONS}-peer-tls"]
    assert server["issuerRef"] == certificates[f"{ETCD}-server-tls"]["issuerRef"]
    assert f"{COLLECTIONS}-0.{COLLECTIONS}.{NAMESPACE}.svc" in server["dnsNames"]
    assert peer["commonName"] == f"{COLLECTIONS}-peer"


@pytest.mark.parametrize(
    ("sets", "said"),
    [
        (("certificates.generator=job",), "the Job does not make the collections etcd's"),
        (("etcd.external.endpoints[0]=http://etcd.db:2379",), "not with etcd.external"),
    ],
)
def test_what_it_cannot_do_yet_is_refused_with_what_to_set(
    sets: tuple[str, ...], said: str
) -> None:
    argv = ["template", "o41", str(CHART), "--set", ON]
    for s in sets:
        argv += ["--set", s]
    done = run_helm(*argv)
    assert done.returncode != 0 and said in done.stderr, done.stderr


def pems(secret: Doc, key: str) -> list[x509.Certificate]:
    return x509.load_pem_x509_certificates(base64.b64decode(secret["data"][key]))


def test_the_service_trusts_both_serving_cas_and_the_new_etcd_trusts_its_certificate() -> None:
    docs = render(ON)
    secrets = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Secret"}
    client = secrets[f"{ETCD}-client-tls"]
    index_server = secrets[f"{ETCD}-server-tls"]
    server = secrets[f"{COLLECTIONS}-server-tls"]
    [clients_ca] = pems(index_server, "ca.crt")
    [serving_ca] = pems(server, "issuer.crt")
    assert pems(client, "ca.crt") == [clients_ca, serving_ca]
    pems(server, "tls.crt")[0].verify_directly_issued_by(serving_ca)
    # its members let in the certificate the service shows (the state store's clients' CA)
    assert pems(server, "ca.crt") == [clients_ca]
    pems(client, "tls.crt")[0].verify_directly_issued_by(clients_ca)


class IndexMembers(Members):
    """The state store's StatefulSet's members (two StatefulSets now end with -etcd)."""

    @property
    def statefulset(self) -> Doc:
        return named(self.docs, "StatefulSet", ETCD)


class CollectionsMembers(Members):
    """The collections' StatefulSet's members on loopback."""

    @property
    def statefulset(self) -> Doc:
        return named(self.docs, "StatefulSet", COLLECTIONS)

    def rewrite(self, text: str, own: int, mounts: dict[str, Path]) -> str:
        def address(m: re.Match[str]) -> str:
            scheme, host, port = m.group(1), m.group(2), int(m.group(3))
            if host == "0.0.0.0":
                member = own
            else:
                found = re.fullmatch(rf"{COLLECTIONS}-(\d+)\.{COLLECTIONS}\.{NAMESPACE}\.svc",
                                     host)  # fmt: skip
                assert found, host
                member = int(found.group(1))
            return self.url(member, port, scheme)

        text = URL.sub(address, text)
        for mount_path, local in mounts.items():
            text = text.replace(mount_path, str(local))
        return text

    def environment(self, member: int) -> dict[str, str]:
        env = super().environment(member)
        env["POD_NAME"] = f"{COLLECTIONS}-{member}"
        return env


@pytest.fixture(scope="module")
def both(
    etcd_binary: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[ChartEtcd, CollectionsMembers]]:
    """Both rendered etcds on loopback, each member Ready by the StatefulSet's probe."""
    directory = tmp_path_factory.mktemp("collections-etcd")
    docs = render(ON)
    secrets: dict[str, Path] = {}
    for where in ("index", "collections"):  # each Members reads <its directory>/secrets
        for d in docs:
            if d["kind"] == "Secret" and "-etcd-" in d["metadata"]["name"]:
                name = d["metadata"]["name"]
                secrets[name] = decode_secret(d, directory / where / "secrets" / name)
    index = IndexMembers(docs, directory / "index")
    collections = CollectionsMembers(docs, directory / "collections")
    try:
        for members in (index, collections):
            for i in range(3):
                members.start(i, etcd_binary)
        for members in (index, collections):
            for i in range(3):
                members.servers[i].wait_ready(functools.partial(members.ready, i), timeout=60)
        yield ChartEtcd(index, secrets, etcd_binary), collections
    finally:
        collections.stop()
        index.stop()


async def test_the_services_store_reads_and_writes_both_etcds_with_what_the_chart_gives_it(
    both: tuple[ChartEtcd, CollectionsMembers],
) -> None:
    index, collections = both
    endpoints, tls = index.placement_store_settings()  # --etcd and the O41_ETCD_* files
    assert tls is not None and tls.cert_file
    args = container(find(index.docs, "Deployment", "-placement"))["args"]
    rendered = args[args.index("--collections-etcd") + 1]
    collections_endpoints, _ = store_settings(collections.rewrite(rendered, -1, {}), {})
    assert len(collections_endpoints) == 3
    for urls, key in ((endpoints, b"/index/a"), (collections_endpoints, b"/collections/a")):
        store = EtcdStore(urls, timeout=5.0, tls=tls)  # the same files for both
        try:
            await store.put(key, b"over TLS")
            kv = await store.get(key)
            assert kv is not None and kv.value == b"over TLS"
        finally:
            await store.close()
    # two clusters: what one holds the other does not
    store = EtcdStore(collections_endpoints, timeout=5.0, tls=tls)
    try:
        assert await store.get(b"/index/a") is None
    finally:
        await store.close()


@pytest.mark.kube
def test_an_upgrade_that_turns_it_on_keeps_the_first_etcds_certificates(
    kube: Kube, namespace: str
) -> None:
    """An upgrade looks the Secrets up; `helm template --dry-run=server` does the same
    against the API server. The first install's Secrets are applied as it made them."""

    def upgrade(*sets: str) -> dict[str, Doc]:
        argv = [
            "template",
            "o41",
            str(CHART),
            "--namespace",
            namespace,
            "--dry-run=server",
            "--kubeconfig",
            str(kube.kubeconfig),
            "--show-only",
            "templates/etcd-tls.yaml",
        ]
        for s in sets:
            argv += ["--set", s]
        done = run_helm(*argv)
        assert done.returncode == 0, done.stderr
        return {d["metadata"]["name"]: d for d in yaml.safe_load_all(done.stdout) if d}  # fmt: skip

    def apply(secrets: dict[str, Doc]) -> None:
        kube.kubectl("apply", "-n", namespace, "-f", "-",
                     input=json.dumps({"apiVersion": "v1", "kind": "List",
                                       "items": list(secrets.values())}))  # fmt: skip

    installed = upgrade()
    apply(installed)
    assert upgrade() == installed  # kept, as every upgrade does
    turned_on = upgrade(ON)
    for role in ("server", "peer"):
        assert turned_on[f"{ETCD}-{role}-tls"] == installed[f"{ETCD}-{role}-tls"]
    client, before = turned_on[f"{ETCD}-client-tls"], installed[f"{ETCD}-client-tls"]
    assert client["data"]["tls.crt"] == before["data"]["tls.crt"]
    [clients_ca] = pems(before, "ca.crt")
    [serving_ca] = pems(turned_on[f"{COLLECTIONS}-server-tls"], "issuer.crt")
    assert pems(client, "ca.crt") == [clients_ca, serving_ca]
    pems(turned_on[f"{COLLECTIONS}-server-tls"], "tls.crt")[0].verify_directly_issued_by(serving_ca)
    apply(turned_on)
    assert upgrade(ON) == turned_on  # and a second upgrade keeps them all


@pytest.mark.kube
def test_the_service_as_rendered_keeps_the_collections_in_their_etcd_only(
    both: tuple[ChartEtcd, CollectionsMembers], kube: Kube, namespace: str, tmp_path: Path
) -> None:
    """``python -m o41.webhook`` with the container's arguments and environment (addresses
    on loopback, the mounted client Secret the decoded one): a pod's dict entry lands in
    the collections' etcd, and not in the state store's."""
    index, collections = both
    install_crds(kube.kubeconfig)
    c = container(find(index.docs, "Deployment", "-placement"))
    argv = list(c["args"])
    api, metrics = free_port(), free_port()
    for flag, value in (
        ("--host", LOOPBACK),
        ("--port", str(api)),
        ("--metrics-port", str(metrics)),
    ):
        argv[argv.index(flag) + 1] = value
    endpoints, tls = index.placement_store_settings()
    assert tls is not None
    argv[argv.index("--etcd") + 1] = ",".join(endpoints)
    at = argv.index("--collections-etcd") + 1
    argv[at] = collections.rewrite(argv[at], -1, {})
    env = {e["name"]: e["value"] for e in c["env"] if "value" in e}
    env.update(tls.environment())
    server = Server(
        "chart placement",
        [sys.executable, *argv[1:], "--kubeconfig", str(kube.kubeconfig)],
        tmp_path / "placement.log",
        env={**SAFE_ENV, **env, "PYTHONPATH": SRC},
    )
    try:
        server.start().wait_ready(
            lambda: http_status(f"http://{LOOPBACK}:{api}/readyz")[0] == 200, timeout=60
        )
        kube.kubectl("create", "serviceaccount", "job", "-n", namespace)
        token = kube.kubectl("create", "token", "job", "-n", namespace).strip()
        client = Client(HttpTransport(f"http://{LOOPBACK}:{api}", token=token), "apart")
        client.dict("checkpoints")["step-1"] = b"weights"
        assert client.dict("checkpoints")["step-1"] == b"weights"
    finally:
        server.stop()

    async def entries(urls: list[str]) -> int:
        store = EtcdStore(urls, timeout=5.0, tls=tls)
        try:
            prefix = f"/o41/collections/{namespace}/apart/dict/checkpoints/".encode()
            return len(await store.range(prefix))
        finally:
            await store.close()

    collections_urls, _ = store_settings(argv[at], {})
    assert asyncio.run(entries(collections_urls)) == 1
    assert asyncio.run(entries(endpoints)) == 0
