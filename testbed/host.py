"""The machine-wide state a real node changes, snapshotted before it starts and put back
after it stops: iptables (both families, every table), nftables, network links, mounts,
cgroups, a few sysctls and the system paths kubelet, containerd and CNI write to.

A real node is the one part of the test bed that is not confined to its own processes and
directory, so its teardown is checked: ``diff(before, snapshot())`` must come back empty.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import shutil
import signal
import subprocess
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

CGROUPS = Path("/sys/fs/cgroup")

# What kubelet (setupKernelTunables), kube-proxy (conntrack) and the CNI bridge plugin
# (ip_forward) may set: written back at teardown.
SYSCTLS = (
    "net/ipv4/ip_forward",
    "net/ipv4/conf/all/forwarding",
    "net/ipv6/conf/all/forwarding",
    "net/ipv4/conf/all/route_localnet",
    "net/bridge/bridge-nf-call-iptables",
    "net/bridge/bridge-nf-call-ip6tables",
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
    "net/netfilter/nf_conntrack_max",
    "net/netfilter/nf_conntrack_tcp_timeout_established",
    "net/netfilter/nf_conntrack_tcp_timeout_close_wait",
    "net/netfilter/nf_conntrack_tcp_be_liberal",
)

# System directories the node's parts write to when not told otherwise (or always).
PATHS = (
    "/var/lib/cni",
    "/var/lib/cni/results",
    "/var/lib/cni/networks",
    "/var/log/containers",
    "/var/log/pods",
    "/run/containerd",
    "/run/containerd/s",
    "/run/netns",
    "/etc/cni/net.d",
    "/opt/cni/bin",
    "/var/lib/kubelet",
    "/etc/kubernetes",
    "/var/lib/containerd",
    "/usr/libexec/kubernetes",
)  # not /run/runc: the node's runc keeps its state below the node's directory, and
# podman/buildah (other sessions' image builds) use that one meanwhile

_COUNTERS = re.compile(r" \[\d+:\d+\]$")


def _run(*argv: str, check: bool = False) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=60)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {done.returncode}: {done.stderr.strip()}")
    return done.stdout


def iptables(family: str) -> dict[str, list[str]]:
    """``iptables-save`` (or ip6tables-save) as table -> lines, counters dropped."""
    tables: dict[str, list[str]] = {}
    current: list[str] = []
    for line in _run(f"{family}-save").splitlines():
        if line.startswith("*"):
            current = tables.setdefault(line[1:], [])
        elif line.startswith((":", "-A")):
            current.append(_COUNTERS.sub("", line))
    return tables


def cgroup_hierarchies() -> list[Path]:
    """Every mounted cgroup hierarchy (v1 controllers, and the v2 one of a hybrid setup)."""
    if (CGROUPS / "cgroup.procs").exists():
        return [CGROUPS]
    return sorted(p for p in CGROUPS.iterdir() if (p / "cgroup.procs").exists())


def _listing(path: str) -> list[str] | None:
    try:
        return sorted(os.listdir(path))
    except FileNotFoundError:
        return None
    except NotADirectoryError:
        return ["(a file)"]


def sysctl(name: str) -> str | None:
    try:
        return (Path("/proc/sys") / name).read_text().strip()
    except OSError:
        return None


def snapshot() -> dict[str, Any]:
    """What the machine looks like now, in the parts a real node touches."""
    return {
        "iptables": iptables("iptables"),
        "ip6tables": iptables("ip6tables"),
        "nft": _run("nft", "-s", "list", "ruleset").splitlines() if shutil.which("nft") else [],
        "links": sorted(
            line.split(":")[1].strip().split("@")[0]
            for line in _run("ip", "-o", "link", "show").splitlines()
        ),
        "mounts": sorted(mount_points()),
        "cgroups": sorted(
            f"{h.name}/{d.name}" for h in cgroup_hierarchies() for d in h.iterdir() if d.is_dir()
        ),
        "sysctls": {name: sysctl(name) for name in SYSCTLS},
        "paths": {path: _listing(path) for path in PATHS},
    }


# Others on the machine (podman and buildah building images, meanwhile) make mounts and
# cgroups of their own: only those a node could have made count as its leftovers.
NODE_CGROUPS = ("kubepods", "o41-node")


def diff(
    before: Mapping[str, Any], after: Mapping[str, Any], mount_roots: tuple[str, ...] = ()
) -> list[str]:
    """What ``after`` has that ``before`` had not, one line each; empty: nothing was left.

    iptables rules are compared both ways (a rule that went is as wrong as one that stayed);
    links, nft, mounts and cgroups by what was added (others' may come and go meanwhile):
    mounts at or below ``mount_roots`` and the system paths a node writes to, cgroups of
    the names in ``NODE_CGROUPS``."""
    lines: list[str] = []
    for family in ("iptables", "ip6tables"):
        for table in sorted(set(before[family]) | set(after[family])):
            old, new = before[family].get(table, []), after[family].get(table, [])
            lines += [f"{family} -t {table}: added {r}" for r in new if r not in old]
            lines += [f"{family} -t {table}: removed {r}" for r in old if r not in new]
    roots = (*mount_roots, *PATHS)

    def ours(key: str, item: str) -> bool:
        if key == "mounts":
            return any(item == r or item.startswith(r.rstrip("/") + "/") for r in roots)
        if key == "cgroups":
            return item.split("/", 1)[1].startswith(NODE_CGROUPS)
        return True

    for key in ("nft", "links", "mounts", "cgroups"):
        lines += [f"{key}: added {x}" for x in after[key] if x not in before[key] and ours(key, x)]
    for name, value in before["sysctls"].items():
        if after["sysctls"].get(name) != value:
            lines.append(f"sysctls: {name} was {value!r}, is {after['sysctls'].get(name)!r}")
    for path, old_entries in before["paths"].items():
        new_entries = after["paths"].get(path)
        if new_entries is None:
            continue  # gone, or never there: nothing left
        if old_entries is None:
            lines.append(f"paths: {path} was made")
        else:
            lines += [f"paths: added {path}/{e}" for e in new_entries if e not in old_entries]
    return lines


def mount_points() -> list[str]:
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        points.append(line.split()[4].encode().decode("unicode_escape"))
    return points


# ----------------------------------------------------------------------------- put back


def restore_iptables(before: Mapping[str, Any]) -> None:
    """Delete every rule and chain added since ``before``; restore the chains' policies.

    Rules first (a chain can be deleted only once nothing jumps to it), then the added
    chains, flushed and deleted. Rules that were there before are never touched.
    """
    for family in ("iptables", "ip6tables"):
        now = iptables(family)
        for table, lines in now.items():
            old = before[family].get(table, [])
            old_chains = {line.split()[0][1:] for line in old if line.startswith(":")}
            new_chains = [
                line.split()[0][1:]
                for line in lines
                if line.startswith(":") and line.split()[0][1:] not in old_chains
            ]
            for line in lines:
                if line.startswith("-A") and line not in old:
                    chain = line.split()[1]
                    if chain in new_chains:
                        continue  # goes with its chain
                    _run(family, "-w", "-t", table, "-D", *shlex.split(line)[1:])
            for chain in new_chains:
                _run(family, "-w", "-t", table, "-F", chain)
            for chain in new_chains:
                _run(family, "-w", "-t", table, "-X", chain)
            for line in old:
                if line.startswith(":") and line.split()[1] != "-":
                    chain, policy = line[1:].split()[:2]
                    _run(family, "-w", "-t", table, "-P", chain, policy)
            if table not in before[family] and shutil.which("nft"):
                # iptables-nft made the table on first use: it goes, now empty, as it came
                _run("nft", "delete", "table", "ip" if family == "iptables" else "ip6", table)


def restore_sysctls(before: Mapping[str, str | None]) -> None:
    for name, value in before.items():
        if value is not None and sysctl(name) != value:
            with contextlib.suppress(OSError):
                (Path("/proc/sys") / name).write_text(value)


def unmount_below(directory: Path) -> list[str]:
    """Unmount everything mounted at or below ``directory``, deepest first (container root
    filesystems, secret volumes, network namespaces, the kubelet's bind mount of its root).
    Returns what could not be unmounted."""
    prefix = str(directory)

    def below() -> list[str]:
        return sorted(
            {p for p in mount_points() if p == prefix or p.startswith(prefix + "/")},
            key=lambda p: -p.count("/"),
        )

    for _ in range(5):
        points = below()
        if not points:
            return []
        for point in points:
            _run("umount", point)
    for point in below():
        _run("umount", "--lazy", point)
    return below()


def cgroup_pids(relative: str) -> set[int]:
    """Every pid in the cgroup ``relative`` and below, in every hierarchy."""
    pids: set[int] = set()
    for hierarchy in cgroup_hierarchies():
        root = hierarchy / relative.strip("/")
        if not root.is_dir():
            continue
        for directory in _cgroup_tree(root):
            with contextlib.suppress(OSError):
                pids |= {int(p) for p in (directory / "cgroup.procs").read_text().split()}
    return pids


def _cgroup_tree(root: Path) -> list[Path]:
    """``root`` and its cgroups below: kubelet and containerd remove theirs while this
    walks (os.walk skips a directory gone meanwhile; Path.rglob raised on it)."""
    return [Path(top) for top, _, _ in os.walk(root)]


def kill_cgroup(relative: str, timeout: float = 30.0) -> set[int]:
    """SIGKILL every process in the cgroup ``relative`` (the node's pods: containers and
    pause), by pid, until none is left; then remove its cgroups, deepest first, in every
    hierarchy. Returns the pids still there at the deadline."""
    deadline = time.monotonic() + timeout
    while (pids := cgroup_pids(relative)) and time.monotonic() < deadline:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)
    for hierarchy in cgroup_hierarchies():
        root = hierarchy / relative.strip("/")
        if not root.is_dir():
            continue
        for directory in sorted(_cgroup_tree(root)[1:], key=lambda d: -len(d.parts)):
            with contextlib.suppress(OSError):
                directory.rmdir()
        with contextlib.suppress(OSError):
            root.rmdir()
    return cgroup_pids(relative)


def make_cgroup(relative: str) -> None:
    """Create the cgroup ``relative`` in every hierarchy (kubelet wants its cgroup root to
    exist); a new v1 cpuset starts empty, so it gets its parent's cpus and memory nodes."""
    for hierarchy in cgroup_hierarchies():
        path = hierarchy / relative.strip("/")
        path.mkdir(parents=True, exist_ok=True)
        for name in ("cpuset.cpus", "cpuset.mems"):
            own, parent = path / name, path.parent / name
            if own.exists() and not own.read_text().strip():
                own.write_text(parent.read_text())


def remove_new_entries(before: Mapping[str, list[str] | None], paths: Iterable[str]) -> None:
    """Remove what was added to each system directory in ``paths`` since ``before``: the
    entries it did not list (a directory that did not exist goes entirely)."""
    for path in sorted(paths, key=lambda p: -p.count("/")):
        old = before.get(path)
        now = _listing(path)
        if now is None:
            continue
        if old is None:
            shutil.rmtree(path, ignore_errors=True)
            with contextlib.suppress(OSError):
                os.unlink(path)
            continue
        for name in set(now) - set(old):
            target = Path(path) / name
            if target.is_dir() and not target.is_symlink():
                shutil.rmtree(target, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    target.unlink()
