"""Locations on the test bed's storage stand-ins, as a user would write them.

``make dev-up`` writes them to ``.dev/examples.yaml`` (one ``kubectl apply -f`` makes an
organization with a Location on each stand-in) and ``make demo`` applies the same objects.
The stand-ins' keys are made at each start, so the file is written then, never shipped.
"""

from __future__ import annotations

import json
from typing import Any

import yaml

from testbed.stores import AzureStore, GcsStore, S3Store

API = "artifacts.o41.io/v1alpha1"
ORGANIZATION = "ml"
SECRETS_NAMESPACE = "o41-system"  # the operator's and the service's own namespace


def secrets(
    s3: S3Store | None = None, gcs: GcsStore | None = None, azure: AzureStore | None = None
) -> list[dict[str, Any]]:
    """The stand-ins' credentials, as the Secrets the test bed makes (``creds-<backend>``),
    in the keys a Location's credentials name."""
    data: dict[str, dict[str, str]] = {}
    if s3 is not None:
        data["s3"] = {"accessKeyId": s3.access_key, "secretAccessKey": s3.secret_key}
    if gcs is not None:
        data["gcs"] = {"serviceAccount.json": json.dumps(gcs.service_account_info)}
    if azure is not None:
        data["azure"] = {"accountKey": azure.account_key}
    return [
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": f"creds-{backend}", "namespace": SECRETS_NAMESPACE},
            "type": "Opaque",
            "stringData": values,
        }
        for backend, values in data.items()
    ]


def locations(s3: S3Store, gcs: GcsStore, azure: AzureStore) -> dict[str, dict[str, Any]]:
    """Location name -> its spec: two AWS regions and GCP, Azure and an S3-compatible cloud
    (tagged nebius) on the stand-ins. The first one becomes the organization's fallback."""
    return {
        "aws-us-east-1": {
            "cloud": "aws",
            "region": "us-east-1",
            "backend": {"s3": {"endpoint": s3.endpoint}},
            "credentials": {"secretName": "creds-s3"},
        },
        "aws-us-west-2": {
            "cloud": "aws",
            "region": "us-west-2",
            "backend": {"s3": {"endpoint": s3.endpoint}},
            "credentials": {"secretName": "creds-s3"},
        },
        "gcp-us-central1": {
            "cloud": "gcp",
            "region": "us-central1",
            "backend": {"gcs": {"endpoint": gcs.endpoint, "project": gcs.project}},
            "credentials": {"secretName": "creds-gcs"},
        },
        "azure-westeurope": {
            "cloud": "azure",
            "region": "westeurope",
            "backend": {"azureBlob": {"accountUrl": azure.account_url}},
            "credentials": {"secretName": "creds-azure"},
        },
        # An S3-compatible store serves one region whatever the cloud's own region is named
        # (as MinIO serves us-east-1): signingRegion says which one requests are signed for.
        "nebius-eu-north1": {
            "cloud": "nebius",
            "region": "eu-north1",
            "backend": {"s3Compatible": {"endpoint": s3.endpoint, "signingRegion": s3.region}},
            "credentials": {"secretName": "creds-s3"},
        },
    }


def objects(
    s3: S3Store,
    gcs: GcsStore,
    azure: AzureStore,
    *,
    namespaces: list[str],
    only: list[str] | None = None,
) -> list[dict[str, Any]]:
    """The Secrets, an Organization whose pods run in ``namespaces``, and its Locations
    (``only`` those named, in that order; default: all)."""
    specs = locations(s3, gcs, azure)
    names = only if only is not None else list(specs)
    return [
        *secrets(s3, gcs, azure),
        {
            "apiVersion": API,
            "kind": "Organization",
            "metadata": {"name": ORGANIZATION},
            "spec": {"namespaces": namespaces},
        },
        *(
            {
                "apiVersion": API,
                "kind": "Location",
                "metadata": {"name": name},
                "spec": {"organization": ORGANIZATION, **specs[name]},
            }
            for name in names
        ),
    ]


def manifest(s3: S3Store, gcs: GcsStore, azure: AzureStore) -> str:
    """``.dev/examples.yaml``: the objects, with a header that says what they are."""
    header = (
        "# Locations on the dev stack's storage stand-ins, written by `make dev-up` (the\n"
        "# stand-ins' keys are new at each start). Apply them with\n"
        "#   source .dev/env && kubectl apply -f .dev/examples.yaml\n"
        "#   kubectl get locations,organizations     # READY True in a few seconds\n"
        "# The first Location (aws-us-east-1) becomes the organization's fallback.\n"
    )
    docs = objects(s3, gcs, azure, namespaces=["default", "team-a"])
    return header + yaml.safe_dump_all(docs, sort_keys=False)
