"""The one place the client side makes TLS contexts: the placement service (the artifacts
client, the collections' HTTP and WebSocket), the buckets' pre-signed URLs and the cloud
metadata services all connect with a context from here.

The placement service is checked against ``O41_ARTIFACTS_CA_FILE`` (or the ``ca_file``
given to a client) when set: a hub with a certificate of its own CA (the chart's, or a
cert-manager issuer's) is trusted by that bundle alone. Unset, the system's roots (and
``SSL_CERT_FILE``, as OpenSSL reads it). Buckets and metadata services always use the
system's roots: the hub's CA has no business vouching for a cloud's endpoints.

Standard library only, imported by pods at start: contexts are made on first use and
kept (the CA file's is made again when the file changes).
"""

from __future__ import annotations

import os
import ssl
import threading

from o41.client.errors import CaFileError as CaFileError  # its name here too

ENV_CA_FILE = "O41_ARTIFACTS_CA_FILE"

_lock = threading.Lock()
_system: dict[tuple[str | None, str | None], ssl.SSLContext] = {}
_by_file: dict[str, tuple[tuple[int, int], ssl.SSLContext]] = {}


def system_context() -> ssl.SSLContext:
    """The system's roots (buckets, metadata services, a hub with a public certificate);
    made again when ``SSL_CERT_FILE`` or ``SSL_CERT_DIR`` change, as OpenSSL would read them."""
    key = (os.environ.get("SSL_CERT_FILE"), os.environ.get("SSL_CERT_DIR"))
    with _lock:
        found = _system.get(key)
        if found is None:
            found = _system[key] = ssl.create_default_context()
        return found


def ca_file_of(given: str | None = None) -> str | None:
    """The CA bundle for the placement service: ``given``, else ``$O41_ARTIFACTS_CA_FILE``."""
    return given or os.environ.get(ENV_CA_FILE) or None


def service_context(ca_file: str | None = None) -> ssl.SSLContext:
    """The context for the placement service: ``ca_file`` (or ``$O41_ARTIFACTS_CA_FILE``)
    alone, else the system's roots. :class:`CaFileError`, naming the file and the fix,
    when the bundle cannot be used."""
    path = ca_file_of(ca_file)
    if path is None:
        return system_context()
    try:
        st = os.stat(path)
    except OSError as e:
        raise CaFileError(
            f"{ENV_CA_FILE}={path} cannot be read ({e.strerror}): point it at the hub's "
            "CA bundle (a PEM file: the chart's ConfigMap <release>-o41-artifacts-placement-ca, "
            "key ca.crt), or unset it to trust the system's CAs"
        ) from None
    stamp = (st.st_mtime_ns, st.st_size)
    with _lock:
        found = _by_file.get(path)
        if found is not None and found[0] == stamp:
            return found[1]
        try:
            context = ssl.create_default_context(cafile=path)
        except (OSError, ssl.SSLError) as e:
            raise CaFileError(
                f"{ENV_CA_FILE}={path} holds no usable CA certificate ({e}): give the PEM "
                "bundle of the CA that signed the hub's certificate"
            ) from None
        _by_file[path] = (stamp, context)
        return context


def untrusted(error: BaseException, endpoint: str, ca_file: str | None = None) -> str | None:
    """What to say when ``error`` is the placement service's certificate failing the
    check (None for any other error): what was wrong and which variable to set."""
    if not isinstance(error, ssl.SSLCertVerificationError):
        return None
    why = f"certificate verify failed: {error.verify_message or error.reason}"
    path = ca_file_of(ca_file)
    if "hostname" in why.lower() or "ip address mismatch" in why.lower():
        return (
            f"the placement service at {endpoint} has a certificate for another name "
            f"({why}): use the endpoint the certificate names (the chart's "
            "placement.externalURL, or its in-cluster Service name)"
        )
    if path:
        return (
            f"the placement service at {endpoint} has a certificate that {ENV_CA_FILE}={path} "
            f"does not vouch for ({why}): point {ENV_CA_FILE} at the CA bundle of that "
            "service (the chart's ConfigMap <release>-o41-artifacts-placement-ca, key ca.crt)"
        )
    return (
        f"the placement service at {endpoint} has a certificate of a CA this machine does "
        f"not trust ({why}): set {ENV_CA_FILE} to the hub's CA bundle (the chart's "
        "ConfigMap <release>-o41-artifacts-placement-ca, key ca.crt; its install notes "
        "show how to fetch it)"
    )
