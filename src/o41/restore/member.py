"""``python -m o41.restore.member``: the init container ``kubectl o41 admin restore`` adds to
the etcd StatefulSet while it restores (``o41.restore.admin.restore_step``).

It restores this member from a snapshot only when both hold: its data dir is empty (a
new volume) AND the restore Secret is mounted (``kubectl o41 admin restore`` made it:
a signed GET URL of the snapshot and its SHA-256). Otherwise it does nothing, so a member
that restarts on its own volume is never touched. Every member is restored from the same
snapshot with the same cluster flags, as etcd's disaster-recovery guide does; the
revision is bumped and marked compacted, so no revision read before the loss is handed
out again (watchers and compare-and-set guards never see an old number reused).
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

ETCDUTL = "/usr/local/bin/etcdutl"
#: Far beyond the writes a lost etcd can have taken since its last snapshot (Kubernetes'
#: own restore guide uses the same figure).
BUMP_REVISION = 1_000_000_000
CHUNK = 1024 * 1024


def _say(message: str) -> None:
    print(f"o41 restore: {message}", flush=True)


def download(url: str, target: Path, sha256: str) -> int:
    """Fetch ``url`` into ``target`` and check its SHA-256; its size."""
    digest, size = hashlib.sha256(), 0
    no_proxy = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with no_proxy.open(url, timeout=60) as answer, target.open("wb") as out:
        while chunk := answer.read(CHUNK):
            digest.update(chunk)
            out.write(chunk)
            size += len(chunk)
    if digest.hexdigest() != sha256:
        target.unlink()
        raise ValueError(
            f"the snapshot's SHA-256 is {digest.hexdigest()}, its sidecar says {sha256}: "
            "not restored (a changed or partial object)"
        )
    return size


def restore(args: argparse.Namespace) -> int:
    data, request = Path(args.data_dir), Path(args.request)
    if data.exists() and any(data.iterdir()):
        _say(f"{data} holds data: nothing to restore")
        return 0
    if not (request / "url").exists():
        _say("no restore asked for: etcd starts as it is")
        return 0
    url = (request / "url").read_text().strip()
    sha256 = (request / "sha256").read_text().strip()
    key = (request / "key").read_text().strip() if (request / "key").exists() else "?"
    target = data.parent / "restore.db"
    _say(f"restoring member {args.name} from {key}")
    try:
        size = download(url, target, sha256)
    except (OSError, ValueError) as e:
        _say(f"cannot fetch the snapshot: {e}")
        return 1
    if data.exists():
        data.rmdir()  # empty: etcdutl makes it
    argv = [
        args.etcdutl, "snapshot", "restore", str(target),
        f"--name={args.name}",
        f"--data-dir={data}",
        f"--initial-cluster={args.initial_cluster}",
        f"--initial-cluster-token={args.initial_cluster_token}",
        f"--initial-advertise-peer-urls={args.initial_advertise_peer_urls}",
        f"--bump-revision={BUMP_REVISION}",
        "--mark-compacted",
    ]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    target.unlink(missing_ok=True)
    if done.returncode != 0:
        shutil.rmtree(data, ignore_errors=True)  # the next try starts from empty again
        _say(f"etcdutl failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
        return 1
    _say(f"member {args.name} restored from {key} ({size} bytes)")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m o41.restore.member", description=__doc__)
    parser.add_argument("--name", required=True, help="this member's name (the pod's)")
    parser.add_argument("--data-dir", required=True, help="etcd's --data-dir")
    parser.add_argument("--request", required=True, help="where the restore Secret is mounted")
    parser.add_argument("--initial-cluster", required=True)
    parser.add_argument("--initial-cluster-token", required=True)
    parser.add_argument("--initial-advertise-peer-urls", required=True)
    parser.add_argument("--etcdutl", default=ETCDUTL)
    return restore(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
