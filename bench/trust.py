"""What a begin costs per kind of token (issue 31), next to its ceiling, same machine, same run.

``POST /v1/writes`` (begin) requests per second and p50/p99, ``--clients`` concurrent
clients for ``--seconds`` each, with:

1. ``local pod token``: a real ServiceAccount token of the test bed's control plane; the
   service checks it with a real TokenReview, cached 30 s per token (so, under load, one
   TokenReview and then the cache);
2. ``remote pod token (cached)``: one projected token of cluster B (``ml/trainer``)
   signed by ``testbed.issuer.Issuer`` (RS256), verified offline, cached per token;
3. ``service token (VM)``: one token made with ``o41.kube.service_tokens.TokenAdmin`` against
   the control plane (ES256, its record a ConfigMap the service watches);
4. ``ceiling: bare aiohttp JSON handler``: the same load on a handler that reads the body
   and answers JSON (bench/placement.py's);
5. ``remote, a fresh token per request``: cluster B's tokens each sent once, so each is a
   full RS256 verification (no cache hit): what the per-token cache saves. The tokens are
   signed before the load (as many as the cached path's rate for ``--seconds``, and a
   margin); if they run out first, the measure ends there and says so.

Real: the control plane (kube-apiserver, etcd, controller-manager, ...; its TokenReview),
the operator (it makes the Location Ready and admits the TrustDomain), the placement
service as its own process (``python -m o41.webhook``: its watch of TrustDomains, the
records and the service tokens; its Authenticator), the S3 stand-in (versitygw) that
backs the Location, the TrustDomain ``cluster-b`` and the Organization whose
spec.members admits B's namespace ``ml``, the ServiceAccount token and the service token.

Stand-ins: cluster B is no cluster, only its issuer (an RSA key in memory, its JWKS, its
tokens); its issuer URL is a closed port on 127.0.0.1, so the operator's fetch of its keys
fails (and leaves the record alone), and the record of its keys (the ConfigMap the operator
writes after a good fetch) is written by this bench with ``TrustRecord(...).configmap``,
the issuer's JWKS and fetchedAt now. The service's state store is the embedded one by
default (``--store etcd`` for a 3-member etcd): every path pays the same for it.

The service's per-token cache of remote tokens is dropped whenever the TrustDomain's
policy or its keys change (a relist that hands the same ones again keeps it): the bench
prints their resourceVersions around each measure, so a change during one shows. The
paths run in ``--rounds`` alternated rounds; the table shows each path's median round.

    .venv/bin/python bench/trust.py [--seconds 5] [--clients 16] [--rounds 3] [--store etcd]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "src")]

import aiohttp  # noqa: E402

from o41.kube.service_tokens import TokenAdmin  # noqa: E402
from o41.kube.trust_record import TrustRecord, record_name  # noqa: E402
from testbed.etcd import EtcdCluster  # noqa: E402
from testbed.issuer import Issuer  # noqa: E402
from testbed.kube import (  # noqa: E402
    ControlPlane,
    apply,
    bin_dir,
    kubectl,
    service_account_token,
)
from testbed.process import LOOPBACK, Server, free_port, port_open, wait_until  # noqa: E402
from testbed.product import (  # noqa: E402
    NAMESPACE,
    OperatorProcess,
    PlacementProcess,
    install_crds,
    store_secrets,
)
from testbed.stores import start_s3  # noqa: E402

# bench/placement.py's ceiling, as it is there
BARE = """
from aiohttp import web
async def handler(request):
    await request.read()
    return web.json_response({"version": "0193a1b2c3d4-9f8e7d6c5b4a3f2e", "location": "x"})
app = web.Application()
app.router.add_post("/v1/writes", handler)
web.run_app(app, host="127.0.0.1", port=int(__import__("sys").argv[1]), access_log=None)
"""

ORG = "bench"
LOCAL_NS = "bench"
DOMAIN = "cluster-b"
REMOTE_NS, REMOTE_SA = "ml", "trainer"
VM = "bench-vm"
TRUST_DOMAIN_CRD = ROOT / "crds" / "trustdomains.artifacts.o41.io.yaml"
BODY = json.dumps(
    {
        "organization": ORG,
        "artifact": "ckpt",
        "size": 1024,
        "place": {"cloud": "aws", "region": "us-east-1", "source": "env"},
    }
).encode()

Tokens = Callable[[], str | None]  # the next request's token; None: none left


@dataclass
class Measured:
    label: str
    rps: float
    latencies: list[float]
    errors: int
    elapsed: float
    first_error: str = ""
    ran_out: bool = False  # the fresh tokens ran out before --seconds

    def quantile(self, q: int) -> float:
        if len(self.latencies) < 2:
            return float("nan")
        return statistics.quantiles(self.latencies, n=100)[q - 1] * 1000


async def load(url: str, tokens: Tokens, clients: int, seconds: float) -> Measured:
    """``clients`` concurrent loops of begins for ``seconds`` (bench/placement.py's
    ``load``, each request with the token ``tokens`` gives; a client stops when none is
    left). Errors: answers >= 300 and failed connections."""
    latencies: list[float] = []
    errors = 0
    first_error = ""
    ran_out = False
    stop = time.monotonic() + seconds
    connector = aiohttp.TCPConnector(limit=clients)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def one() -> None:
            nonlocal errors, first_error, ran_out
            while time.monotonic() < stop:
                token = tokens()
                if token is None:
                    ran_out = True
                    return
                headers = {"Content-Type": "application/json", "Authorization": f"Bearer {token}"}
                start = time.perf_counter()
                try:
                    async with session.post(url, data=BODY, headers=headers) as r:
                        text = await r.read()
                        if r.status >= 300:
                            errors += 1
                            first_error = first_error or f"{r.status} {text[:300]!r}"
                except aiohttp.ClientError as e:
                    errors += 1
                    first_error = first_error or f"{type(e).__name__}: {e}"
                latencies.append(time.perf_counter() - start)

        began = time.monotonic()
        await asyncio.gather(*(one() for _ in range(clients)))
        elapsed = time.monotonic() - began
    return Measured("", len(latencies) / elapsed, latencies, errors, elapsed, first_error, ran_out)


def same(token: str) -> Tokens:
    return lambda: token


def pool(tokens: list[str]) -> Tokens:
    it = iter(tokens)
    return lambda: next(it, None)


def begin_once(url: str, token: str) -> tuple[int, str]:
    """One begin: (status, the start of the body)."""

    async def go() -> tuple[int, str]:
        headers = {"Content-Type": "application/json", "Authorization": f"Bearer {token}"}
        async with (
            aiohttp.ClientSession() as session,
            session.post(f"{url}/v1/writes", data=BODY, headers=headers) as r,
        ):
            return r.status, (await r.text())[:400]

    return asyncio.run(go())


def wait_accepted(url: str, token: str, what: str, timeout: float = 60.0) -> None:
    """Until a begin with ``token`` is answered 2xx (the service's watch has seen what
    the token needs); else fail with the last answer."""
    last: tuple[int, str] = (0, "")

    def accepted() -> bool:
        nonlocal last
        last = begin_once(url, token)
        return last[0] < 300

    try:
        wait_until(accepted, timeout=timeout, what=what, interval=0.3)
    except Exception as e:
        raise RuntimeError(f"{what}: never accepted; last answer {last[0]} {last[1]}") from e


def resource_versions(kc: Path, uid: str) -> str:
    """The TrustDomain's and its record's resourceVersions: a change drops the service's
    per-token cache of remote tokens."""
    td = kubectl(kc, "get", "trustdomain", DOMAIN, "-o", "jsonpath={.metadata.resourceVersion}")
    cm = kubectl(
        kc,
        "-n",
        NAMESPACE,
        "get",
        "configmap",
        record_name(uid),
        "-o",
        "jsonpath={.metadata.resourceVersion}",
    )
    return f"{td}/{cm}"


def trust_domain_condition(kc: Path) -> dict[str, Any]:
    raw = kubectl(kc, "get", "trustdomain", DOMAIN, "-o", "json")
    conditions = (json.loads(raw).get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c.get("type") == "Ready"), {})


def table(results: list[Measured], bare: Measured, local: Measured) -> list[str]:
    lines = [
        f"{'':<44} {'req/s':>7} {'p50 ms':>7} {'p99 ms':>7} {'errors':>6} "
        f"{'of bare':>8} {'of local':>8}"
    ]
    for m in results:
        note = f"  (tokens ran out after {m.elapsed:.1f} s)" if m.ran_out else ""
        lines.append(
            f"{m.label:<44} {m.rps:7.0f} {m.quantile(50):7.1f} {m.quantile(99):7.1f} "
            f"{m.errors:6d} {m.rps / bare.rps:8.0%} {m.rps / local.rps:8.0%}{note}"
        )
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5)
    parser.add_argument(
        "--rounds", type=int, default=3, help="alternated rounds; the median round is shown"
    )
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument(
        "--store",
        choices=["embedded", "etcd"],
        default="embedded",
        help="the service's state store: embedded (default, the lightest) or a 3-member etcd",
    )
    args = parser.parse_args()
    if not TRUST_DOMAIN_CRD.exists():
        raise SystemExit(f"{TRUST_DOMAIN_CRD} is missing: the TrustDomain CRD is needed")
    work = Path(tempfile.mkdtemp(prefix="o41-bench-trust-"))
    bins = bin_dir()
    started: list[Server] = []
    plane: ControlPlane | None = None
    s3 = None
    etcd: EtcdCluster | None = None
    try:
        plane = ControlPlane(work / "kube", bins).start()
        s3 = start_s3(work / "s3")
        kc = plane.kubeconfig
        install_crds(kc)
        store_secrets(kc, s3)
        operator = OperatorProcess(kc, work / "operator", check_interval=60).start()
        assert operator.server is not None
        started.append(operator.server)
        gateway = s3.gateway("us-east-1")  # its own port, as bench/placement.py

        # Cluster B: an issuer at a closed port of 127.0.0.1 (the operator's fetch fails
        # there and leaves the record alone), its TrustDomain, the record of its keys.
        issuer = Issuer(f"https://{LOOPBACK}:{free_port()}/cluster-b")
        org = {
            "apiVersion": "artifacts.o41.io/v1alpha1",
            "kind": "Organization",
            "metadata": {"name": ORG},
            "spec": {
                "namespaces": [LOCAL_NS],
                "members": [{"trustDomain": DOMAIN, "namespaces": [REMOTE_NS]}],
            },
        }
        location = {
            "apiVersion": "artifacts.o41.io/v1alpha1",
            "kind": "Location",
            "metadata": {"name": "east"},
            "spec": {
                "organization": ORG,
                "cloud": "aws",
                "region": "us-east-1",
                "backend": {"s3": {"endpoint": gateway}},
                "credentials": {"secretName": "creds-s3"},
            },
        }
        trust_domain = {
            "apiVersion": "artifacts.o41.io/v1alpha1",
            "kind": "TrustDomain",
            "metadata": {"name": DOMAIN},
            "spec": {"issuer": issuer.url, "audiences": ["o41"]},
        }
        apply(kc, org, location, trust_domain)
        uid = kubectl(kc, "get", "trustdomain", DOMAIN, "-o", "jsonpath={.metadata.uid}")
        fetched_at = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        record = TrustRecord(uid, DOMAIN, issuer.url, issuer.jwks(), fetched_at=fetched_at)
        apply(kc, record.configmap(NAMESPACE))
        kubectl(
            kc,
            "wait",
            "--for=jsonpath={.status.takesWrites}=true",
            f"organization/{ORG}",
            "--timeout=60s",
        )

        etcd_endpoints: list[str] = []
        if args.store == "etcd":
            etcd = EtcdCluster(bins / "etcd", work / "etcd").start()
            etcd_endpoints = etcd.endpoints
        service = PlacementProcess(kc, etcd_endpoints, work / "placement").start()
        assert service.server is not None
        started.append(service.server)

        local_token = service_account_token(kc, LOCAL_NS)
        remote_token = issuer.token(REMOTE_NS, REMOTE_SA)
        from kubernetes import config

        api = config.new_client_from_config(config_file=str(kc))  # type: ignore[no-untyped-call]
        vm_token, _ = TokenAdmin(api, NAMESPACE).create(ORG, VM, 3600)

        # The operator's status of the TrustDomain settles once it has seen the record
        # (its fetches then fail the same way: no change, so no drop of the service's cache).
        try:
            wait_until(
                lambda: "last good keys" in str(trust_domain_condition(kc).get("message")),
                timeout=30,
                what="the operator to show the TrustDomain's recorded keys",
                interval=0.5,
            )
        except Exception:
            print(f"note: TrustDomain status did not settle: {trust_domain_condition(kc)}")
        wait_accepted(service.url, local_token, "the local pod token")
        wait_accepted(service.url, remote_token, "cluster B's token (TrustDomain and record)")
        wait_accepted(service.url, vm_token, "the service token (its record)")

        bare_port = free_port()
        bare = Server("bare", [sys.executable, "-c", BARE, str(bare_port)], work / "bare.log")
        bare.start()
        started.append(bare)
        bare.wait_ready(lambda: port_open(bare_port))
        bare_url = f"http://{LOOPBACK}:{bare_port}/v1/writes"
        begin_url = f"{service.url}/v1/writes"

        def measure(label: str, url: str, tokens: Tokens) -> Measured:
            before = resource_versions(kc, uid)
            m = asyncio.run(load(url, tokens, args.clients, args.seconds))
            after = resource_versions(kc, uid)
            m.label = label
            print(
                f"  {label}: {m.rps:.0f} req/s, {len(m.latencies)} requests in "
                f"{m.elapsed:.1f} s, errors {m.errors}"
                + (f" (first: {m.first_error})" if m.first_error else "")
                + f"; TrustDomain/record resourceVersion {before} -> {after}"
                + (" CHANGED: the remote cache was dropped" if before != after else ""),
                flush=True,
            )
            return m

        print(f"{os.cpu_count()} cores; load average before {os.getloadavg()}", flush=True)
        asyncio.run(load(begin_url, same(local_token), 4, 1))  # warm: connections, caches
        asyncio.run(load(begin_url, same(remote_token), 4, 1))
        asyncio.run(load(begin_url, same(vm_token), 4, 1))
        rounds: list[list[Measured]] = []
        for n in range(1, args.rounds + 1):
            print(f"round {n} of {args.rounds}", flush=True)
            ceiling = measure("ceiling: bare aiohttp JSON handler", bare_url, same(local_token))
            local = measure("local pod token (TokenReview, cached)", begin_url, same(local_token))
            remote = measure("remote pod token (cluster B, cached)", begin_url, same(remote_token))
            vm = measure("service token (VM, ES256)", begin_url, same(vm_token))
            wanted = int(remote.rps * args.seconds * 1.3) + args.clients
            t = time.perf_counter()
            fresh_tokens = [issuer.token(REMOTE_NS, REMOTE_SA) for _ in range(wanted)]
            print(
                f"  signed {wanted} fresh tokens of cluster B in {time.perf_counter() - t:.1f} s",
                flush=True,
            )
            fresh = measure(
                "remote, a fresh token per request (uncached)", begin_url, pool(fresh_tokens)
            )
            rounds.append([ceiling, local, remote, vm, fresh])
        print(f"load average after {os.getloadavg()}")
        print()
        print(
            f"begin (POST /v1/writes), {args.clients} concurrent clients for "
            f"{args.seconds:g} s each, store {args.store}, {args.rounds} alternated rounds: "
            "the round of median req/s of each path"
        )
        medians = [
            sorted(ms, key=lambda m: m.rps)[len(ms) // 2] for ms in zip(*rounds, strict=True)
        ]
        for line in table(medians, medians[0], medians[1]):
            print(line)
    finally:
        for server in reversed(started):
            server.stop()
        if etcd is not None:
            etcd.stop()
        if s3 is not None:
            s3.stop()
        if plane is not None:
            plane.stop()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
