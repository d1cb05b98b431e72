"""Generate the CustomResourceDefinitions from the models in ``o41.kube.api``.

``python -m o41.kube.crd crds/`` writes one YAML file per resource. Pydantic's JSON schema is
turned into a Kubernetes structural schema (references inlined, optional unions flattened,
titles dropped) and CEL rules are added for what one object can check alone.
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

from o41.kube.api import (
    GROUP,
    VERSION,
    LocationSpec,
    LocationStatus,
    OrganizationSpec,
    OrganizationStatus,
    TrustDomainSpec,
    TrustDomainStatus,
)

Schema = dict[str, Any]

IMMUTABLE = (
    "{field} cannot change after creation: the versions already stored depend on it. "
    "Create a new Location with the new value and retire this one (spec.retired: true)"
)


def structural(model: type[BaseModel]) -> Schema:
    """The model's schema in the structural form the API server requires."""
    raw = model.model_json_schema(by_alias=True, mode="validation")
    defs = raw.pop("$defs", {})
    cleaned: Schema = _clean(raw, defs)
    return cleaned


def _clean(node: Any, defs: dict[str, Schema]) -> Any:
    if isinstance(node, list):
        return [_clean(x, defs) for x in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        target = copy.deepcopy(defs[node["$ref"].rsplit("/", 1)[-1]])
        merged = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
        return _clean(merged, defs)
    if "anyOf" in node:  # Optional[X] -> X (absence means unset; no nulls stored)
        options = [o for o in node["anyOf"] if o.get("type") != "null"]
        if len(options) == 1:
            rest = {k: v for k, v in node.items() if k not in ("anyOf", "default")}
            return _clean({**options[0], **rest}, defs)
    out: Schema = {}
    for key, value in node.items():
        if key in ("title", "$defs"):
            continue
        if key == "default" and value is None:
            continue
        if key == "default" and value in ([], {}):
            continue  # an empty default adds noise to every object
        if key == "additionalProperties" and value is False:
            continue  # structural schemas prune unknown fields; kubectl warns on them
        if key == "properties":
            out[key] = {k: _clean(v, defs) for k, v in value.items()}
        else:
            out[key] = _clean(value, defs)
    return out


def _immutable(schema: Schema, *fields: str) -> None:
    for name in fields:
        schema["properties"][name].setdefault("x-kubernetes-validations", []).append(
            {"rule": "self == oldSelf", "message": IMMUTABLE.format(field=f"spec.{name}")}
        )


def _unchanged(field: str) -> str:
    """CEL: an optional field is still absent, or still holds its old value. A rule on the
    field itself would not run when it is added or removed (transition rules need both an
    old and a new value), so the rule sits on the parent and compares presence too."""
    return (
        f"has(self.{field}) == has(oldSelf.{field}) && "
        f"(!has(self.{field}) || self.{field} == oldSelf.{field})"
    )


# Backend fields that may change after creation: none. Every field of every backend says
# where the bucket is or how its URLs are made (endpoint, project, account URL, signing
# region, addressing style); a field added later is immutable unless it is listed here.
MUTABLE_BACKEND_FIELDS: frozenset[str] = frozenset()


def _backend_rules(backend: Schema) -> None:
    """Exactly one backend; its kind and every field of it fixed at creation.

    The kind rule sits on ``backend`` (required, so always there to compare); each field's
    rule on its kind's object, which runs only when old and new both have that kind, so a
    change of kind gets the kind's message alone.
    """
    kinds = list(backend["properties"])
    backend.setdefault("x-kubernetes-validations", []).extend(
        [
            {
                "rule": "[" + ", ".join(f"has(self.{k})" for k in kinds) + "]"
                ".filter(x, x).size() == 1",
                "message": "set exactly one backend: " + ", ".join(kinds[:-1]) + f" or {kinds[-1]}",
            },
            {
                "rule": " && ".join(f"has(self.{k}) == has(oldSelf.{k})" for k in kinds),
                "message": IMMUTABLE.format(
                    field="the backend kind (" + ", ".join(kinds[:-1]) + f" or {kinds[-1]})"
                ),
            },
        ]
    )
    for kind in kinds:
        options = backend["properties"][kind]
        for field in options.get("properties", {}):
            if field in MUTABLE_BACKEND_FIELDS:
                continue
            options.setdefault("x-kubernetes-validations", []).append(
                {
                    "rule": _unchanged(field),
                    "message": IMMUTABLE.format(field=f"spec.backend.{kind}.{field}"),
                    "fieldPath": f".{field}",
                }
            )


def _conditions(status: Schema) -> None:
    status["properties"]["conditions"].update(
        {"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]}
    )


def location_schema() -> Schema:
    spec = structural(LocationSpec)
    _immutable(spec, "organization", "cloud", "region")
    _backend_rules(spec["properties"]["backend"])
    spec["x-kubernetes-validations"] = [
        {
            "rule": "!has(self.backend.s3) || self.cloud == 'aws'",
            "message": "an s3 backend is Amazon S3, so cloud must be aws; "
            "use s3Compatible for other S3 endpoints",
        },
        {
            "rule": "!has(self.backend.gcs) || self.cloud == 'gcp'",
            "message": "a gcs backend is Google Cloud Storage, so cloud must be gcp",
        },
        {
            "rule": "!has(self.backend.azureBlob) || self.cloud == 'azure'",
            "message": "an azureBlob backend is Azure Blob Storage, so cloud must be azure",
        },
        {
            "rule": _unchanged("bucket"),
            "message": IMMUTABLE.format(field="spec.bucket"),
            "fieldPath": ".bucket",
        },
    ]
    status = structural(LocationStatus)
    _conditions(status)
    return _root(spec, status)


def organization_schema() -> Schema:
    spec = structural(OrganizationSpec)
    status = structural(OrganizationStatus)
    _conditions(status)
    return _root(spec, status)


# A TrustDomain's name prefixes its tenants (``<trustDomain>:<namespace>``): a DNS label.
TRUST_DOMAIN_NAME_RULE = {
    "rule": "size(self.metadata.name) <= 63 && "
    "self.metadata.name.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$')",
    "message": "metadata.name must be a DNS label (lower-case letters, digits and '-', at "
    "most 63 characters): it prefixes the tenants <trustDomain>:<namespace>",
}
ISSUER_IMMUTABLE = (
    "spec.issuer cannot change after creation: the tenants <trustDomain>:<namespace> are "
    "that issuer's. Make a new TrustDomain for the new issuer (and name it in the "
    "Organizations' members), then delete this one"
)
ONE_KEY_SOURCE = (
    "set at most one of keys.jwksURL and keys.jwks (neither: OIDC discovery at "
    "<issuer>/.well-known/openid-configuration)"
)


def trust_domain_schema() -> Schema:
    spec = structural(TrustDomainSpec)
    spec["properties"]["issuer"]["x-kubernetes-validations"] = [
        {"rule": "self == oldSelf", "message": ISSUER_IMMUTABLE}
    ]
    spec["properties"]["keys"]["x-kubernetes-validations"] = [
        {"rule": "!(has(self.jwksURL) && has(self.jwks))", "message": ONE_KEY_SOURCE}
    ]
    status = structural(TrustDomainStatus)
    _conditions(status)
    root = _root(spec, status)
    root["x-kubernetes-validations"] = [TRUST_DOMAIN_NAME_RULE]
    return root


def _root(spec: Schema, status: Schema) -> Schema:
    return {
        "type": "object",
        "required": ["spec"],
        "properties": {
            "apiVersion": {
                "type": "string",
                "description": f"The versioned schema of this object: {GROUP}/{VERSION}.",
            },
            "kind": {"type": "string", "description": "The kind of this object."},
            "metadata": {"type": "object"},  # the API server's ObjectMeta, described there
            "spec": spec,
            "status": status,
        },
    }


READY = '.status.conditions[?(@.type=="Ready")]'


def _crd(
    kind: str,
    plural: str,
    short: list[str],
    description: str,
    schema: Schema,
    columns: list[dict[str, Any]],
) -> dict[str, Any]:
    schema = {"description": description, **schema}
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{plural}.{GROUP}",
            "labels": {"app.kubernetes.io/part-of": "o41-artifacts"},
        },
        "spec": {
            "group": GROUP,
            "scope": "Cluster",
            "names": {
                "kind": kind,
                "listKind": f"{kind}List",
                "plural": plural,
                "singular": kind.lower(),
                "shortNames": short,
                "categories": ["o41", "artifacts"],
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": columns,
                    "schema": {"openAPIV3Schema": schema},
                }
            ],
        },
    }


def location_crd() -> dict[str, Any]:
    return _crd(
        "Location",
        "locations",
        ["loc", "locs"],
        "A bucket in a cloud and region where an organization's artifact versions live. "
        "Retired, never deleted: a retired location takes no new writes and its versions "
        "stay readable.",
        location_schema(),
        [
            {"name": "Organization", "type": "string", "jsonPath": ".spec.organization"},
            {"name": "Cloud", "type": "string", "jsonPath": ".spec.cloud"},
            {"name": "Region", "type": "string", "jsonPath": ".spec.region"},
            {"name": "Ready", "type": "string", "jsonPath": f"{READY}.status"},
            {"name": "Role", "type": "string", "jsonPath": ".status.role"},
            {"name": "Retired", "type": "boolean", "jsonPath": ".spec.retired"},
            {"name": "Reason", "type": "string", "jsonPath": f"{READY}.reason", "priority": 1},
            {"name": "Bucket", "type": "string", "jsonPath": ".status.bucket", "priority": 1},
            {"name": "Checked", "type": "date", "jsonPath": ".status.lastChecked", "priority": 1},
            {"name": "Versions", "type": "integer", "jsonPath": ".status.versions", "priority": 1},
            {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
        ],
    )


def organization_crd() -> dict[str, Any]:
    return _crd(
        "Organization",
        "organizations",
        ["org", "orgs"],
        "A group of Locations with one fallback and a default per cloud, usable from the "
        "namespaces it lists.",
        organization_schema(),
        [
            {"name": "Fallback", "type": "string", "jsonPath": ".status.fallback"},
            {"name": "Cloud Defaults", "type": "string", "jsonPath": ".status.cloudDefaults"},
            {"name": "Takes Writes", "type": "boolean", "jsonPath": ".status.takesWrites"},
            {"name": "Locations", "type": "integer", "jsonPath": ".status.locations"},
            {"name": "Ready", "type": "string", "jsonPath": f"{READY}.status"},
            {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
        ],
    )


def trust_domain_crd() -> dict[str, Any]:
    return _crd(
        "TrustDomain",
        "trustdomains",
        ["td", "tds"],
        "Another cluster's (or any OIDC) token issuer whose workload tokens the placement "
        "service accepts: its issuer URL, the audiences a token must name, and where its "
        "public keys come from. The operator fetches the keys; Ready says whether it could.",
        trust_domain_schema(),
        [
            {"name": "Issuer", "type": "string", "jsonPath": ".spec.issuer"},
            {"name": "Ready", "type": "string", "jsonPath": f"{READY}.status"},
            {"name": "Reason", "type": "string", "jsonPath": f"{READY}.reason"},
            {"name": "Keys", "type": "string", "jsonPath": ".status.keyIds"},
            {"name": "Fetched", "type": "date", "jsonPath": ".status.lastFetched", "priority": 1},
            {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
        ],
    )


def rendered() -> dict[str, str]:
    """File name -> YAML text, exactly as kept in ``crds/``."""
    header = "# Generated by `python -m o41.kube.crd crds/` from o41/kube/api.py; do not edit.\n"
    return {
        f"{crd['spec']['names']['plural']}.{GROUP}.yaml": header
        + yaml.safe_dump(crd, sort_keys=False, width=100)
        for crd in (location_crd(), organization_crd(), trust_domain_crd())
    }


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    target = Path(args[0] if args else "crds")
    target.mkdir(parents=True, exist_ok=True)
    for name, text in rendered().items():
        (target / name).write_text(text)
        print(f"wrote {target / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
