"""The custom resources' shapes: one source of truth for the code and for ``crds/``.

``Location`` and ``Organization`` are cluster-scoped, like cert-manager's ClusterIssuer:
a bucket is cluster-wide infrastructure, and an Organization says which namespaces may use
it. ``python -m o41.kube.crd`` writes the CRD YAML from these models; a test fails when the
files in ``crds/`` drift from them.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from o41.core.retention import MAX_KEEP, MAX_RULES
from o41.core.retention import PATTERN as RETENTION_PATTERN

GROUP = "artifacts.o41.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"

NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
CLOUD_PATTERN = r"^[a-z][a-z0-9-]{0,30}[a-z0-9]$"
REGION_PATTERN = r"^[a-z0-9][a-z0-9-]{0,62}$"


class Model(BaseModel):
    """camelCase on the wire, snake_case in Python; unknown fields are an error."""

    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True
    )


class SecretRef(Model):
    """A Secret in the operator's namespace (the "cluster resource namespace")."""

    secret_name: str = Field(
        description=(
            "Name of a Secret in the operator's namespace. Keys by backend: s3 and "
            "s3Compatible `accessKeyId` and `secretAccessKey`; gcs `serviceAccount.json`; "
            "azureBlob `accountKey`."
        ),
        pattern=NAME_PATTERN,
        max_length=253,
    )


class S3Backend(Model):
    """A bucket on Amazon S3 in the location's region (cloud must be `aws`)."""

    endpoint: str | None = Field(
        default=None,
        description="Override of the S3 endpoint URL (FIPS endpoints, tests); empty for AWS.",
    )


class GcsBackend(Model):
    """A Google Cloud Storage bucket in the location's region (cloud must be `gcp`)."""

    project: str | None = Field(
        default=None, description="Project that owns the bucket; default: the credential's."
    )
    endpoint: str | None = Field(
        default=None, description="Override of the GCS endpoint URL (tests); empty for Google."
    )


class AzureBlobBackend(Model):
    """A container in an existing Azure storage account (cloud must be `azure`)."""

    account_url: str = Field(
        description="The storage account's blob endpoint, e.g. https://acct.blob.core.windows.net",
    )


class S3CompatibleBackend(Model):
    """A bucket on any S3-compatible endpoint (Nebius, R2, on-prem...) with any cloud tag."""

    endpoint: str = Field(
        description="The endpoint URL, e.g. https://storage.eu-north1.nebius.cloud"
    )
    signing_region: str | None = Field(
        default=None,
        description="Region used to sign requests when it differs from the location's region.",
    )
    addressing_style: Literal["path", "virtual"] = Field(
        default="path", description="Bucket addressing: path (widest support) or virtual."
    )


class Backend(Model):
    """Exactly one backend: s3, gcs, azureBlob or s3Compatible."""

    s3: S3Backend | None = Field(
        default=None, description="A bucket on Amazon S3 in the location's region (cloud aws)."
    )
    gcs: GcsBackend | None = Field(
        default=None,
        description="A Google Cloud Storage bucket in the location's region (cloud gcp).",
    )
    azure_blob: AzureBlobBackend | None = Field(
        default=None,
        description="A container in an existing Azure storage account (cloud azure).",
    )
    s3_compatible: S3CompatibleBackend | None = Field(
        default=None,
        description="A bucket on any S3-compatible endpoint (Nebius, R2, on-prem...), any "
        "cloud tag.",
    )

    @property
    def kind(self) -> str:
        for name in ("s3", "gcs", "azure_blob", "s3_compatible"):
            if getattr(self, name) is not None:
                return name
        raise ValueError("a Location needs exactly one backend")


class LocationSpec(Model):
    """What the user declares: the organization, the cloud and region, the backend."""

    organization: str = Field(
        description="The Organization this location belongs to.", pattern=NAME_PATTERN
    )
    cloud: str = Field(
        description="Cloud tag, lower-case: aws, gcp, azure, or any tag for S3-compatible "
        "endpoints (nebius, r2, on-prem...). Cannot change after creation.",
        pattern=CLOUD_PATTERN,
    )
    region: str = Field(
        description="The cloud's own region name (us-east-1, us-central1, westeurope, "
        "eu-north1...). Cannot change after creation.",
        pattern=REGION_PATTERN,
    )
    backend: Backend = Field(
        description="Where the bucket lives. Its kind and every field of it cannot change "
        "after creation (they say where the versions already stored are): create a new "
        "Location and retire this one instead."
    )
    bucket: str | None = Field(
        default=None,
        description="Bucket (or container) name; generated from the location when empty, "
        "valid for the backend and stable across retries. Cannot change after creation.",
        min_length=3,
        max_length=63,
    )
    credentials: SecretRef | None = Field(
        default=None,
        description="Credentials for the backend; when empty the operator's ambient identity "
        "(IRSA, Workload Identity) is used. May change (rotation): they say who calls the "
        "bucket, not where it is.",
    )
    retired: bool = Field(
        default=False,
        description="A retired location takes no new writes; its versions stay readable. "
        "The organization's fallback cannot be retired.",
    )


class Condition(Model):
    """One aspect of the object's state, the Kubernetes way (``kubectl wait
    --for=condition=Ready``)."""

    type: str = Field(description="The condition's type; Ready is the one there is.")
    status: Literal["True", "False", "Unknown"] = Field(
        description="True, False or Unknown: whether the condition holds."
    )
    reason: str = Field(
        description="Why, in one CamelCase word (BucketReady, BadCredentials, NoFallback...; "
        "docs/operator.md lists them)."
    )
    message: str = Field(description="Why, in words, and what to do about it.")
    last_transition_time: str = Field(description="When the status last changed (RFC 3339, UTC).")
    observed_generation: int | None = Field(
        default=None,
        description="The metadata.generation (spec version) the condition was set from.",
    )


CONDITIONS = "The object's conditions (Ready), one per type."
OBSERVED = (
    "The metadata.generation (spec version) the operator last acted on: the status is "
    "current when it equals metadata.generation."
)


class LocationStatus(Model):
    """What the operator observed (an output: no rule reads it back)."""

    bucket: str | None = Field(default=None, description="The bucket the location writes to.")
    endpoint: str | None = Field(default=None, description="The endpoint serving the bucket.")
    role: str | None = Field(
        default=None, description="fallback, default (of its cloud), both, or empty."
    )
    unfinished: bool = Field(
        default=False,
        description="Setup failed and the location never became Ready, so it took no write: "
        "only an unfinished location can be deleted. Shown from the operator's record (a "
        "ConfigMap in its namespace); admission never reads it here.",
    )
    ready_since: str | None = Field(
        default=None,
        description="When the location first became Ready (from the operator's record).",
    )
    versions: int = Field(
        default=0,
        description="Committed versions stored here, as the placement service counts them "
        "(copied by the operator from its counts ConfigMap every few seconds).",
    )
    last_checked: str | None = Field(
        default=None,
        description="When the operator's periodic check last reached the bucket (RFC 3339, "
        "UTC; every O41_LOCATION_CHECK_INTERVAL seconds once the location was Ready).",
    )
    observed_generation: int | None = Field(default=None, description=OBSERVED)
    conditions: list[Condition] = Field(default_factory=list, description=CONDITIONS)


class RetentionRule(Model):
    artifacts: str = Field(
        description="The artifacts the rule applies to: a glob over their names "
        "(`ckpt-*`, `*`; fnmatch, case-sensitive). The first matching rule applies.",
        pattern=RETENTION_PATTERN,
    )
    keep_versions: int = Field(
        ge=1,
        le=MAX_KEEP,
        description="How many versions of each matching artifact to keep, newest by "
        "commit. Older ones are deleted (object and record), except a version a tag "
        "points at, and `latest`.",
    )


Namespace = Annotated[str, Field(pattern=NAME_PATTERN, max_length=63)]


class Member(Model):
    """Pods of another cluster (a TrustDomain) that may use the organization."""

    trust_domain: str = Field(
        description="The TrustDomain (another cluster's token issuer) the pods come from.",
        pattern=NAME_PATTERN,
        max_length=63,
    )
    namespaces: list[Namespace] = Field(
        min_length=1,
        max_length=256,
        description="Namespaces of that cluster whose pods may use this organization. "
        "`ml` of that cluster and `ml` of this one are different tenants: their "
        "collections, quotas and pending writes never meet.",
    )
    service_accounts: list[
        Annotated[str, Field(pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$", max_length=253)]
    ] = Field(
        default_factory=list,
        max_length=256,
        description="Only these ServiceAccounts of those namespaces; empty: any.",
    )


class OrganizationSpec(Model):
    """What the user declares: who may use it, and the picks of fallback and defaults."""

    namespaces: list[Namespace] = Field(
        default_factory=list,
        description="Namespaces of this cluster whose pods may use this organization.",
    )
    members: list[Member] = Field(
        default_factory=list,
        max_length=64,
        description="Namespaces of other clusters (by TrustDomain) whose pods may use "
        "this organization (docs/multi-cluster.md).",
    )
    fallback: str | None = Field(
        default=None,
        description="The fallback location; default: the first location added.",
        pattern=NAME_PATTERN,
    )
    cloud_defaults: dict[str, str] = Field(
        default_factory=dict,
        description="Default location per cloud, e.g. {aws: aws-us-east-1}; default: the "
        "first location added in each cloud.",
    )
    retention: list[RetentionRule] = Field(
        default_factory=list,
        max_length=MAX_RULES,
        description="Per-artifact retention: keep the newest keepVersions versions of the "
        "artifacts a rule matches (tagged versions and `latest` always stay). Off when "
        "empty (the default): every version is kept.",
    )


class OrganizationStatus(Model):
    """The fallback and cloud defaults in force, as the operator keeps them."""

    fallback: str | None = Field(default=None, description="The fallback in force.")
    cloud_defaults: dict[str, str] = Field(
        default_factory=dict, description="The default location of each cloud in force."
    )
    takes_writes: bool = Field(
        default=False, description="True once the organization has a Ready fallback."
    )
    locations: int = Field(default=0, description="How many Locations belong to it.")
    observed_generation: int | None = Field(default=None, description=OBSERVED)
    conditions: list[Condition] = Field(default_factory=list, description=CONDITIONS)


# --- TrustDomain: another cluster's (or any OIDC) token issuer ---------------------------

TRUST_DOMAIN_NAME = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"  # a DNS label: a tenant's prefix


class TrustDomainKeys(Model):
    """Where the issuer's public keys come from: at most one of jwksURL and jwks; neither
    means OIDC discovery at `<issuer>/.well-known/openid-configuration`."""

    jwks_url: str | None = Field(
        default=None,
        alias="jwksURL",
        description="The JWKS URL (https), when the issuer publishes no discovery document.",
        pattern=r"^https://",
        max_length=2048,
    )
    jwks: str | None = Field(
        default=None,
        description="The JWKS itself (JSON), for an issuer the hub cannot reach "
        "(`kubectl get --raw /openid/v1/jwks` in that cluster). Rotation then means "
        "updating it.",
        max_length=65536,
    )


class TrustDomainSpec(Model):
    """Which issuer's tokens the service accepts, for which audiences, with which keys."""

    issuer: str = Field(
        description="The issuer URL, exactly as the tokens' `iss` claim says it "
        "(`kubectl get --raw /.well-known/openid-configuration` in that cluster). "
        "Unique across TrustDomains. Cannot change after creation: the tenants "
        "`<trustDomain>:<namespace>` are that issuer's.",
        pattern=r"^https://[^\s]+$",
        max_length=2048,
    )
    audiences: list[Annotated[str, Field(min_length=1, max_length=256)]] = Field(
        default_factory=lambda: ["o41"],
        min_length=1,
        max_length=16,
        description="A token must name one of these in `aud`. Never the API server's "
        "own audience: a token for the API server is refused.",
    )
    keys: TrustDomainKeys = Field(
        default_factory=TrustDomainKeys,
        description="Where the public keys come from; default: OIDC discovery.",
    )
    ca_bundle: str | None = Field(
        default=None,
        description="PEM CA certificates to verify the issuer's TLS (discovery, JWKS); "
        "default: the system roots.",
        max_length=65536,
    )
    refresh_interval: int = Field(
        default=300,
        ge=60,
        le=86400,
        description="Seconds between fetches of the keys by the operator.",
    )
    stale_after: int = Field(
        default=86400,
        ge=300,
        le=30 * 86400,
        description="Seconds after the last successful fetch past which the keys are no "
        "longer trusted (tokens get 503 until a fetch succeeds): how long a removed key "
        "may still be used when the issuer cannot be reached.",
    )
    clock_leeway: int = Field(
        default=60,
        ge=0,
        le=300,
        description="Seconds of clock skew allowed on exp, nbf and iat.",
    )


class TrustDomainStatus(Model):
    """What the operator observed when it last fetched the keys (an output only: the keys
    the service trusts are in the operator's record, never here)."""

    key_ids: list[str] = Field(
        default_factory=list, description="The kids of the keys last fetched."
    )
    last_fetched: str | None = Field(
        default=None, description="When the keys were last fetched successfully (RFC 3339)."
    )
    observed_generation: int | None = Field(default=None, description=OBSERVED)
    conditions: list[Condition] = Field(default_factory=list, description=CONDITIONS)
