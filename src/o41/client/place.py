"""Work out the pod's place once, in the spec's order: env, skypilot, metadata, none.

The place decides where the pod's writes go, so every request sends its ``source``. The
answer is computed once per process (``detect_place``) and explained step by step
(``explain_place``) for ``o41 place``. Pods import this module at start-up, so it imports
nothing heavy: the HTTP client is imported only when the firmware names a cloud, and
metadata never goes through an HTTP proxy (``http.client`` has no proxy support at all).

See docs/place.md for the decisions behind each rule.
"""

from __future__ import annotations

import _thread
import os
import re
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Literal, NamedTuple

from o41.client.errors import PlaceConfigError as PlaceConfigError  # its name here too
from o41.core.places import Place, Source

if TYPE_CHECKING:
    import http.client

# Deliberately not imported here: logging, json, pathlib, threading, http.client, urllib.
# Each costs milliseconds on every pod start and is needed only on the path that uses it;
# for the same reason the records below are NamedTuples (a dataclass costs ~1 ms to build).

ENV_CLOUD = "O41_ARTIFACTS_CLOUD"
ENV_REGION = "O41_ARTIFACTS_REGION"
ENV_SKYPILOT = "SKYPILOT_CLUSTER_INFO"
ENV_DMI_DIR = "O41_ARTIFACTS_DMI_DIR"
ENV_AWS_URL = "O41_ARTIFACTS_AWS_METADATA_URL"
ENV_GCP_URL = "O41_ARTIFACTS_GCP_METADATA_URL"
ENV_AZURE_URL = "O41_ARTIFACTS_AZURE_METADATA_URL"

DEFAULT_DMI_DIR = "/sys/class/dmi/id"
DEFAULT_AWS_URL = "http://169.254.169.254"
DEFAULT_GCP_URL = "http://metadata.google.internal"
DEFAULT_AZURE_URL = "http://169.254.169.254"

#: The spec's budget for the whole metadata exchange (both IMDSv2 requests together).
METADATA_TIMEOUT = 1.0

#: SkyPilot clouds whose "region" is a context or cluster name, not a cloud region.
SKYPILOT_UNUSABLE = frozenset({"kubernetes", "ssh", "slurm"})

#: Only these DMI files are readable without root; serials and product_uuid are not.
DMI_FILES = (
    "sys_vendor",
    "product_name",
    "board_vendor",
    "board_asset_tag",
    "chassis_asset_tag",
    "bios_vendor",
    "bios_version",
)

#: Azure's well-known chassis asset tag. Any Hyper-V guest says "Microsoft Corporation",
#: so the vendor alone would send an on-premises Hyper-V box to Azure's metadata address.
AZURE_CHASSIS_TAG = "7783-7084-3265-9085-8269-3286-77"

MetadataCloud = Literal["aws", "gcp", "azure"]

# A region or zone as the clouds spell them (us-east-1, eastus, us-central1-a); anything
# else (an HTML page from a captive portal, an error text) is not an answer.
_NAME = r"[A-Za-z0-9][A-Za-z0-9_-]{0,62}"
_MAX_BODY = 4096


class Step(NamedTuple):
    """One line of the explanation: a source, whether it answered, and why."""

    source: Source
    answered: bool
    why: str

    def __str__(self) -> str:
        return f"{self.source}: {'answered' if self.answered else 'skipped'}: {self.why}"


class Detection(NamedTuple):
    """The place and how it was found, step by step (the last step is the one that answered)."""

    place: Place
    steps: tuple[Step, ...]


# ---------------------------------------------------------------------------------------
# The cached answer: once per process.

_lock = _thread.allocate_lock()  # threading.Lock itself; ``threading`` costs an import
_detection: Detection | None = None
_skypilot_warned = False


def _after_fork_in_child() -> None:
    """A fork (a DataLoader worker) while another thread detects must not inherit a held lock."""
    global _lock
    _lock = _thread.allocate_lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


def explain_place() -> Detection:
    """The process's place with its explanation, detected on the first call only.

    Blocks up to about ``METADATA_TIMEOUT`` on the first call; async code should call it
    once at start-up (or through ``asyncio.to_thread``). A configuration error is raised on
    every call and never cached: the process must not run with a guessed place.
    """
    global _detection
    found = _detection
    if found is None:
        with _lock:  # two threads at start-up must not ask the metadata service twice
            if _detection is None:
                _detection = detect()
            found = _detection
    return found


def detect_place() -> Place:
    """The process's place (cloud, region, source), detected once per process."""
    return explain_place().place


def reset() -> None:
    """Forget the cached place and the once-only warning, as in a fresh process (tests)."""
    global _detection, _skypilot_warned
    with _lock:
        _detection = None
        _skypilot_warned = False


# ---------------------------------------------------------------------------------------
# The steps. ``detect`` runs them now, uncached.


def detect(environ: Mapping[str, str] | None = None) -> Detection:
    """Run the spec's steps in order; the first that answers wins."""
    env = os.environ if environ is None else environ
    steps: list[Step] = []
    for source, step in _STEPS:
        place, why = step(env)
        steps.append(Step(source, place is not None, why))
        if place is not None:
            return Detection(place, tuple(steps))
    steps.append(Step("none", True, "nothing found: the place is unknown, writes use the fallback"))
    return Detection(Place.unknown(), tuple(steps))


def _get(env: Mapping[str, str], name: str) -> str:
    """An environment value; empty or blank counts as unset (manifests often set "")."""
    return env.get(name, "").strip()


def _from_env(env: Mapping[str, str]) -> tuple[Place | None, str]:
    cloud, region = _get(env, ENV_CLOUD), _get(env, ENV_REGION)
    if cloud and region:
        return Place(cloud.lower(), region, "env"), f"{ENV_CLOUD} and {ENV_REGION} are set"
    if cloud:
        raise PlaceConfigError(ENV_CLOUD, ENV_REGION)
    if region:
        raise PlaceConfigError(ENV_REGION, ENV_CLOUD)
    return None, f"{ENV_CLOUD} and {ENV_REGION} are not set"


def _warn_skypilot(why: str) -> str:
    global _skypilot_warned
    if not _skypilot_warned:
        _skypilot_warned = True
        import logging

        logging.getLogger(__name__).warning("ignoring %s: %s", ENV_SKYPILOT, why)
    return why


def _from_skypilot(env: Mapping[str, str]) -> tuple[Place | None, str]:
    raw = _get(env, ENV_SKYPILOT)
    if not raw:
        return None, f"{ENV_SKYPILOT} is not set"
    import json

    try:
        info = json.loads(raw)
    except ValueError as e:
        return None, _warn_skypilot(f"it is not JSON ({e})")
    if not isinstance(info, dict):
        return None, _warn_skypilot("it is not a JSON object")
    cloud, region = info.get("cloud"), info.get("region")
    if not isinstance(cloud, str) or not cloud.strip():
        return None, _warn_skypilot("it has no cloud")
    cloud = cloud.strip().lower()
    if cloud in SKYPILOT_UNUSABLE:
        return None, (
            f"cloud {cloud} is not usable (its region {region!r} is a context or cluster name)"
        )
    if not isinstance(region, str) or not region.strip():
        return None, _warn_skypilot(f"cloud {cloud} has no region")
    return Place(cloud, region.strip(), "skypilot"), f"cloud {cloud}, region {region.strip()}"


# ---------------------------------------------------------------------------------------
# Firmware (DMI) first, then only the named cloud's metadata service.


def read_dmi(directory: str | os.PathLike[str]) -> dict[str, str]:
    """The readable DMI strings in ``directory``; missing or unreadable files are absent."""
    found: dict[str, str] = {}
    for name in DMI_FILES:
        try:
            with open(os.path.join(directory, name), encoding="utf-8", errors="replace") as f:
                value = f.read(4096).strip()  # a DMI string is short; a fixture may not be
        except OSError:
            continue
        if value:
            found[name] = value
    return found


def cloud_from_dmi(dmi: Mapping[str, str]) -> tuple[MetadataCloud | None, str]:
    """Which of AWS, GCP, Azure the firmware names (no network call), and the evidence.

    With no cloud named, the evidence is what the firmware does say (vendor, product).
    """
    for key in ("sys_vendor", "board_vendor"):
        if dmi.get(key, "").lower() == "amazon ec2":
            return "aws", f"{key} is {dmi[key]!r}"
    if dmi.get("board_asset_tag", "").startswith("i-"):
        return "aws", f"board_asset_tag {dmi['board_asset_tag']!r} is an EC2 instance id"
    for key in ("bios_vendor", "bios_version"):
        if "amazon" in dmi.get(key, "").lower():
            return "aws", f"{key} {dmi[key]!r} mentions Amazon"
    if dmi.get("product_name", "").startswith("Google"):
        return "gcp", f"product_name is {dmi['product_name']!r}"
    if dmi.get("sys_vendor", "") == "Google":
        return "gcp", "sys_vendor is 'Google'"
    if dmi.get("chassis_asset_tag", "") == AZURE_CHASSIS_TAG:
        return "azure", "chassis_asset_tag is Azure's"
    seen = ", ".join(f"{k}={v!r}" for k, v in dmi.items() if k in ("sys_vendor", "product_name"))
    return None, seen or "none readable"


def _from_metadata(env: Mapping[str, str]) -> tuple[Place | None, str]:
    directory = _get(env, ENV_DMI_DIR) or DEFAULT_DMI_DIR
    cloud, evidence = cloud_from_dmi(read_dmi(directory))
    if cloud is None:
        why = f"no DMI string in {directory} names a cloud ({evidence}); no metadata service asked"
        return None, why
    base = _get(env, _URL_ENV[cloud]) or _URL_DEFAULT[cloud]
    region, how = region_from_metadata(cloud, base, METADATA_TIMEOUT)
    name = _CLOUD_NAME[cloud]
    if region is None:
        why = f"{name} by DMI ({evidence}); its metadata service at {base} {how}: region unknown"
    else:
        why = f"{name} by DMI ({evidence}); its metadata service at {base} says {region}"
    return Place(cloud, region, "metadata"), why


class _NoAnswer(Exception):
    """The metadata service refused or gave an answer that is not a region."""


class _Exchange:
    """HTTP requests to one metadata service, all sharing one deadline.

    Each socket operation gets only the time left, and ``abort`` shuts the socket from
    another thread, so a service that trickles bytes cannot stretch the budget.
    """

    def __init__(self, base: str, deadline: float) -> None:
        from urllib.parse import urlsplit

        parts = urlsplit(base.rstrip("/"))
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise _NoAnswer("is not an http(s) URL")
        self.scheme, self.host = parts.scheme, parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)  # IPv6 needs it
        self.prefix = parts.path
        self.deadline = deadline
        self.conn: http.client.HTTPConnection | None = None
        self.aborted = False

    def _left(self) -> float:
        left = self.deadline - time.monotonic()
        if left <= 0 or self.aborted:
            raise TimeoutError
        return left

    def request(
        self, method: str, path: str, headers: dict[str, str]
    ) -> tuple[int, str, http.client.HTTPResponse]:
        import http.client

        left = self._left()
        if self.conn is None:
            if self.scheme == "https":
                from o41.client.tls import system_context

                self.conn = http.client.HTTPSConnection(
                    self.host, self.port, timeout=left, context=system_context()
                )
            else:
                self.conn = http.client.HTTPConnection(self.host, self.port, timeout=left)
        self.conn.timeout = left
        if self.conn.sock is not None:
            self.conn.sock.settimeout(left)
        self.conn.request(method, self.prefix + path, headers=headers)
        if self.conn.sock is not None:
            self.conn.sock.settimeout(self._left())
        resp = self.conn.getresponse()
        body = resp.read(_MAX_BODY + 1)
        if len(body) > _MAX_BODY:
            raise _NoAnswer(f"answered {method} {path} with more than {_MAX_BODY} bytes")
        return resp.status, body.decode("utf-8", errors="replace").strip(), resp

    def abort(self) -> None:
        import contextlib
        import socket

        self.aborted = True
        conn = self.conn
        sock = conn.sock if conn is not None else None
        if sock is not None:
            with contextlib.suppress(OSError):  # already closed: nothing to stop
                sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()


def _expect(status: int, what: str) -> None:
    if status != 200:
        raise _NoAnswer(f"answered {status} to {what}")


def _name(value: str, what: str) -> str:
    if not re.fullmatch(_NAME, value):
        raise _NoAnswer(f"answered {what} with {value[:40]!r}, not a {what}")
    return value


def _aws(x: _Exchange) -> str:
    status, token, _ = x.request(
        "PUT", "/latest/api/token", {"X-aws-ec2-metadata-token-ttl-seconds": "21600"}
    )
    _expect(status, "the IMDSv2 token PUT")
    if not token:
        raise _NoAnswer("answered the token PUT with an empty token")
    status, region, _ = x.request(
        "GET", "/latest/meta-data/placement/region", {"X-aws-ec2-metadata-token": token}
    )
    _expect(status, "the region GET")
    return _name(region, "region")


def _gcp(x: _Exchange) -> str:
    status, zone, resp = x.request(
        "GET", "/computeMetadata/v1/instance/zone", {"Metadata-Flavor": "Google"}
    )
    _expect(status, "the zone GET")
    if resp.getheader("Metadata-Flavor") != "Google":
        raise _NoAnswer("answered without Metadata-Flavor: Google, so it is not GCP's")
    zone = _name(zone.rsplit("/", 1)[-1], "zone")  # projects/123/zones/us-central1-a
    region, dash, _ = zone.rpartition("-")
    if not dash or not region:
        raise _NoAnswer(f"answered zone {zone!r}, which has no region part")
    return region


def _azure(x: _Exchange) -> str:
    status, location, _ = x.request(
        "GET",
        "/metadata/instance/compute/location?api-version=2021-02-01&format=text",
        {"Metadata": "true"},
    )
    _expect(status, "the location GET")
    return _name(location, "region")


_ASK: dict[MetadataCloud, Callable[[_Exchange], str]] = {"aws": _aws, "gcp": _gcp, "azure": _azure}
_URL_ENV: dict[MetadataCloud, str] = {
    "aws": ENV_AWS_URL,
    "gcp": ENV_GCP_URL,
    "azure": ENV_AZURE_URL,
}
_URL_DEFAULT: dict[MetadataCloud, str] = {
    "aws": DEFAULT_AWS_URL,
    "gcp": DEFAULT_GCP_URL,
    "azure": DEFAULT_AZURE_URL,
}
_CLOUD_NAME: dict[MetadataCloud, str] = {"aws": "AWS", "gcp": "GCP", "azure": "Azure"}
_STEPS: tuple[tuple[Source, Callable[[Mapping[str, str]], tuple[Place | None, str]]], ...] = (
    ("env", _from_env),
    ("skypilot", _from_skypilot),
    ("metadata", _from_metadata),
)


def region_from_metadata(cloud: MetadataCloud, base: str, timeout: float) -> tuple[str | None, str]:
    """Ask ``cloud``'s metadata service at ``base`` for the region, ``timeout`` s in total.

    Returns the region (None when the service fails, refuses or is too slow) and what
    happened. The exchange runs in a daemon thread so that even a hanging name lookup
    (``metadata.google.internal`` on a box with broken DNS) cannot pass the deadline.
    """
    import threading

    deadline = time.monotonic() + timeout
    outcome: list[tuple[str | None, str]] = []
    try:
        exchange = _Exchange(base, deadline)
    except _NoAnswer as e:
        return None, str(e)

    def ask() -> None:
        try:
            outcome.append((_ASK[cloud](exchange), "answered"))
        except _NoAnswer as e:
            outcome.append((None, str(e)))
        except TimeoutError:
            outcome.append((None, f"gave no answer within {timeout:g} s"))
        except OSError as e:
            outcome.append((None, f"could not be reached ({e.strerror or e})"))
        except Exception as e:  # http.client's protocol errors: a broken service, not a bug
            outcome.append((None, f"gave a broken answer ({type(e).__name__}: {e})"))
        finally:
            exchange.close()

    worker = threading.Thread(target=ask, name="o41-place-metadata", daemon=True)
    worker.start()
    worker.join(max(0.0, deadline - time.monotonic()))
    if worker.is_alive() or not outcome:
        exchange.abort()
        return None, f"gave no answer within {timeout:g} s"
    return outcome[0]
