"""The client's place, exactly as the spec's table says: env, skypilot, metadata, none.

Every test runs against a tmp DMI directory and loopback metadata fakes (``isolate``):
nothing here can reach 169.254.169.254 or metadata.google.internal.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from o41.client import place as placemod
from o41.client.place import (
    AZURE_CHASSIS_TAG,
    ENV_AWS_URL,
    ENV_AZURE_URL,
    ENV_CLOUD,
    ENV_GCP_URL,
    ENV_REGION,
    ENV_SKYPILOT,
    Detection,
    PlaceConfigError,
    cloud_from_dmi,
    detect,
    detect_place,
    explain_place,
    read_dmi,
    reset,
)
from o41.core.places import Place
from testbed.metadata import (
    AwsImds,
    AzureImds,
    GcpMetadata,
    SilentServer,
    TrickleServer,
    closed_port_url,
    isolate,
    write_dmi,
)

AWS_DMI = {"sys_vendor": "Amazon EC2", "product_name": "m5.large", "bios_vendor": "Amazon EC2"}
GCP_DMI = {"sys_vendor": "Google", "product_name": "Google Compute Engine"}
AZURE_DMI = {
    "sys_vendor": "Microsoft Corporation",
    "product_name": "Virtual Machine",
    "chassis_asset_tag": AZURE_CHASSIS_TAG,
}


@pytest.fixture(autouse=True)
def isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    """Loopback-only inputs, a fresh cache, and no escape to a real address."""
    escapes = isolate(monkeypatch, tmp_path)
    reset()
    yield tmp_path / "dmi"
    reset()
    assert escapes == [], f"detection tried to leave loopback: {escapes}"


def skypilot(cloud: str | None, region: str | None, zone: str | None = None) -> str:
    return json.dumps({"cluster_name": "sky-1234", "cloud": cloud, "region": region, "zone": zone})


# --- env ------------------------------------------------------------------------------


def test_env_gives_the_place_with_the_cloud_lower_cased(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_CLOUD, "AWS")
    monkeypatch.setenv(ENV_REGION, "us-east-1")
    assert detect_place() == Place("aws", "us-east-1", "env")


@pytest.mark.parametrize(("present", "missing"), [(ENV_CLOUD, ENV_REGION), (ENV_REGION, ENV_CLOUD)])
def test_env_half_set_is_a_start_up_error_naming_the_missing_variable(
    monkeypatch: pytest.MonkeyPatch, present: str, missing: str
) -> None:
    monkeypatch.setenv(present, "gcp")
    with pytest.raises(PlaceConfigError, match=missing) as caught:
        detect_place()
    assert caught.value.missing == missing
    assert isinstance(caught.value, ValueError)
    with pytest.raises(PlaceConfigError):  # never cached into a guessed place
        detect_place()


def test_env_empty_values_count_as_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_CLOUD, "")
    monkeypatch.setenv(ENV_REGION, "  ")
    assert detect_place() == Place.unknown()


def test_env_wins_over_skypilot_and_metadata(
    monkeypatch: pytest.MonkeyPatch, isolated: Path
) -> None:
    write_dmi(isolated, **AWS_DMI)
    with AwsImds("eu-west-1") as imds:
        monkeypatch.setenv(ENV_AWS_URL, imds.url)
        monkeypatch.setenv(ENV_SKYPILOT, skypilot("GCP", "us-central1"))
        monkeypatch.setenv(ENV_CLOUD, "azure")
        monkeypatch.setenv(ENV_REGION, "westeurope")
        assert detect_place() == Place("azure", "westeurope", "env")
        assert imds.count == 0


def test_env_half_set_is_an_error_even_when_skypilot_would_answer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(ENV_SKYPILOT, skypilot("AWS", "us-east-1"))
    monkeypatch.setenv(ENV_CLOUD, "aws")
    with pytest.raises(PlaceConfigError, match=ENV_REGION):
        detect_place()


# --- skypilot -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cloud", "region", "zone", "expected"),
    [
        ("AWS", "us-east-1", "us-east-1a", Place("aws", "us-east-1", "skypilot")),
        ("GCP", "us-central1", None, Place("gcp", "us-central1", "skypilot")),
        ("Azure", "eastus", None, Place("azure", "eastus", "skypilot")),
        ("Nebius", "eu-north1", None, Place("nebius", "eu-north1", "skypilot")),
        ("aws", "ap-south-1", None, Place("aws", "ap-south-1", "skypilot")),
    ],
)
def test_skypilot_display_names_are_stored_lower_case(
    monkeypatch: pytest.MonkeyPatch, cloud: str, region: str, zone: str | None, expected: Place
) -> None:
    monkeypatch.setenv(ENV_SKYPILOT, skypilot(cloud, region, zone))
    assert detect_place() == expected


def test_skypilot_wins_over_metadata(monkeypatch: pytest.MonkeyPatch, isolated: Path) -> None:
    write_dmi(isolated, **AWS_DMI)
    with AwsImds("eu-west-1") as imds:
        monkeypatch.setenv(ENV_AWS_URL, imds.url)
        monkeypatch.setenv(ENV_SKYPILOT, skypilot("AWS", "us-west-2"))
        assert detect_place() == Place("aws", "us-west-2", "skypilot")
        assert imds.count == 0


@pytest.mark.parametrize("cloud", ["Kubernetes", "SSH", "Slurm", "kubernetes"])
def test_skypilot_kubernetes_ssh_slurm_go_on_to_none(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, cloud: str
) -> None:
    monkeypatch.setenv(ENV_SKYPILOT, skypilot(cloud, "my-context"))
    found = explain_place()
    assert found.place == Place.unknown()
    assert [s.source for s in found.steps] == ["env", "skypilot", "metadata", "none"]
    assert "not usable" in found.steps[1].why
    assert not caplog.records  # a usable "no": not worth a warning


@pytest.mark.parametrize("cloud", ["Kubernetes", "SSH", "Slurm"])
def test_skypilot_kubernetes_ssh_slurm_go_on_to_metadata(
    monkeypatch: pytest.MonkeyPatch, isolated: Path, cloud: str
) -> None:
    write_dmi(isolated, **GCP_DMI)
    with GcpMetadata("projects/42/zones/europe-west4-b") as gcp:
        monkeypatch.setenv(ENV_GCP_URL, gcp.url)
        monkeypatch.setenv(ENV_SKYPILOT, skypilot(cloud, "gke_proj_europe-west4_cluster"))
        assert detect_place() == Place("gcp", "europe-west4", "metadata")


@pytest.mark.parametrize(
    "info",
    [
        "{not json",
        "[1, 2]",
        '"AWS"',
        skypilot("AWS", None),
        skypilot("AWS", ""),
        json.dumps({"cluster_name": "c", "cloud": "GCP", "zone": None}),
        skypilot(None, "us-east-1"),
    ],
    ids=["malformed", "list", "string", "null-region", "empty-region", "no-region", "no-cloud"],
)
def test_skypilot_unusable_value_warns_once_and_goes_on(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, info: str
) -> None:
    monkeypatch.setenv(ENV_SKYPILOT, info)
    caplog.set_level(logging.WARNING, logger="o41.client.place")
    first = detect()
    second = detect()  # uncached: the warning still comes once per process
    assert first.place == second.place == Place.unknown()
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert ENV_SKYPILOT in warnings[0].getMessage()


def test_skypilot_malformed_goes_on_to_env_less_metadata(
    monkeypatch: pytest.MonkeyPatch, isolated: Path
) -> None:
    write_dmi(isolated, **AZURE_DMI)
    with AzureImds("eastus2") as azure:
        monkeypatch.setenv(ENV_AZURE_URL, azure.url)
        monkeypatch.setenv(ENV_SKYPILOT, "{oops")
        assert detect_place() == Place("azure", "eastus2", "metadata")


# --- DMI ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("files", "cloud"),
    [
        ({"sys_vendor": "Amazon EC2"}, "aws"),
        ({"board_vendor": "Amazon EC2"}, "aws"),
        ({"board_asset_tag": "i-0123456789abcdef0"}, "aws"),
        ({"bios_vendor": "Amazon EC2"}, "aws"),
        ({"sys_vendor": "Xen", "bios_vendor": "Xen", "bios_version": "4.11.amazon"}, "aws"),
        ({"product_name": "Google Compute Engine", "sys_vendor": "Google"}, "gcp"),
        ({"product_name": "Google Compute Engine"}, "gcp"),
        ({"sys_vendor": "Google"}, "gcp"),
        (AZURE_DMI, "azure"),
        ({"chassis_asset_tag": AZURE_CHASSIS_TAG}, "azure"),
        # Hyper-V on premises: Microsoft's vendor strings without Azure's tag are not Azure.
        ({"sys_vendor": "Microsoft Corporation", "product_name": "Virtual Machine"}, None),
        (
            {
                "sys_vendor": "Microsoft Corporation",
                "product_name": "Virtual Machine",
                "chassis_asset_tag": "1234-5678",
            },
            None,
        ),
        ({"sys_vendor": "QEMU", "product_name": "Standard PC (Q35 + ICH9, 2009)"}, None),
        ({"sys_vendor": "Dell Inc.", "board_asset_tag": "ii-not-an-instance"}, None),
        ({}, None),
    ],
)
def test_dmi_rules(isolated: Path, files: dict[str, str], cloud: str | None) -> None:
    write_dmi(isolated, **files)
    assert cloud_from_dmi(read_dmi(isolated))[0] == cloud


@pytest.mark.parametrize(
    "files",
    [
        {"sys_vendor": "Microsoft Corporation", "product_name": "Virtual Machine"},
        {"sys_vendor": "QEMU"},
        {},
    ],
    ids=["hyper-v-on-premises", "qemu", "empty"],
)
def test_dmi_naming_no_cloud_asks_no_metadata_service(
    monkeypatch: pytest.MonkeyPatch, isolated: Path, files: dict[str, str]
) -> None:
    write_dmi(isolated, **files)
    with AwsImds() as aws, GcpMetadata() as gcp, AzureImds() as azure:
        monkeypatch.setenv(ENV_AWS_URL, aws.url)
        monkeypatch.setenv(ENV_GCP_URL, gcp.url)
        monkeypatch.setenv(ENV_AZURE_URL, azure.url)
        found = explain_place()
        assert found.place == Place.unknown()
        assert aws.count == gcp.count == azure.count == 0
    assert found.steps[-1].source == "none"
    assert "no metadata service asked" in found.steps[2].why


def test_dmi_missing_directory_and_unreadable_files_are_absent(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    assert read_dmi(tmp_path / "nowhere") == {}
    dmi = write_dmi(tmp_path / "odd", board_vendor="Amazon EC2")
    (dmi / "sys_vendor").mkdir()  # reading it fails like a root-only file would
    assert read_dmi(dmi) == {"board_vendor": "Amazon EC2"}
    monkeypatch.setenv("O41_ARTIFACTS_DMI_DIR", str(tmp_path / "nowhere"))
    assert detect_place() == Place.unknown()


def test_dmi_files_outside_the_list_are_not_read(isolated: Path) -> None:
    write_dmi(isolated, product_uuid="ec2abcde-0000", product_serial="ec2-serial")
    assert read_dmi(isolated) == {}


# --- metadata services ----------------------------------------------------------------


def test_aws_imdsv2_token_then_region(monkeypatch: pytest.MonkeyPatch, isolated: Path) -> None:
    write_dmi(isolated, **AWS_DMI)
    with AwsImds("ap-northeast-1") as imds:
        monkeypatch.setenv(ENV_AWS_URL, imds.url)
        assert detect_place() == Place("aws", "ap-northeast-1", "metadata")
    put, get = imds.requests
    assert (put.method, put.path) == ("PUT", "/latest/api/token")
    assert put.headers["X-aws-ec2-metadata-token-ttl-seconds"] == "21600"
    assert (get.method, get.path) == ("GET", "/latest/meta-data/placement/region")
    assert get.headers["X-aws-ec2-metadata-token"] in imds.tokens


@pytest.mark.parametrize(
    ("zone", "region"),
    [
        ("projects/123456789/zones/us-central1-a", "us-central1"),
        ("us-central1-a", "us-central1"),
        ("projects/1/zones/europe-west4-b", "europe-west4"),
        ("asia-northeast1-c", "asia-northeast1"),
    ],
)
def test_gcp_region_is_cut_from_the_zone(
    monkeypatch: pytest.MonkeyPatch, isolated: Path, zone: str, region: str
) -> None:
    write_dmi(isolated, **GCP_DMI)
    with GcpMetadata(zone) as gcp:
        monkeypatch.setenv(ENV_GCP_URL, gcp.url + "/")  # a trailing slash is fine
        assert detect_place() == Place("gcp", region, "metadata")
    (seen,) = gcp.requests
    assert seen.path == "/computeMetadata/v1/instance/zone"
    assert seen.headers["Metadata-Flavor"] == "Google"


def test_azure_location(monkeypatch: pytest.MonkeyPatch, isolated: Path) -> None:
    write_dmi(isolated, **AZURE_DMI)
    with AzureImds("westeurope") as azure:
        monkeypatch.setenv(ENV_AZURE_URL, azure.url)
        assert detect_place() == Place("azure", "westeurope", "metadata")
    (seen,) = azure.requests
    assert seen.path == "/metadata/instance/compute/location?api-version=2021-02-01&format=text"
    assert seen.headers["Metadata"] == "true"


def test_only_the_named_clouds_service_is_asked(
    monkeypatch: pytest.MonkeyPatch, isolated: Path
) -> None:
    write_dmi(isolated, **GCP_DMI)
    with AwsImds() as aws, GcpMetadata() as gcp, AzureImds() as azure:
        monkeypatch.setenv(ENV_AWS_URL, aws.url)
        monkeypatch.setenv(ENV_GCP_URL, gcp.url)
        monkeypatch.setenv(ENV_AZURE_URL, azure.url)
        assert detect_place() == Place("gcp", "us-central1", "metadata")
        assert (aws.count, gcp.count, azure.count) == (0, 1, 0)


@pytest.mark.parametrize(
    ("dmi", "fake", "var"),
    [
        (AWS_DMI, AwsImds, ENV_AWS_URL),
        (GCP_DMI, GcpMetadata, ENV_GCP_URL),
        (AZURE_DMI, AzureImds, ENV_AZURE_URL),
    ],
    ids=["aws", "gcp", "azure"],
)
@pytest.mark.parametrize("status", [403, 404, 500, 503])
def test_a_refusing_service_gives_the_cloud_without_region(
    monkeypatch: pytest.MonkeyPatch,
    isolated: Path,
    dmi: dict[str, str],
    fake: type[AwsImds | GcpMetadata | AzureImds],
    var: str,
    status: int,
) -> None:
    write_dmi(isolated, **dmi)
    with fake(refuse_with=status) as service:
        monkeypatch.setenv(var, service.url)
        found = explain_place()
    cloud = {ENV_AWS_URL: "aws", ENV_GCP_URL: "gcp", ENV_AZURE_URL: "azure"}[var]
    assert found.place == Place(cloud, None, "metadata")
    assert f"answered {status}" in found.steps[-1].why
    assert service.count == 1


@pytest.mark.parametrize(
    ("dmi", "cloud"), [(AWS_DMI, "aws"), (GCP_DMI, "gcp"), (AZURE_DMI, "azure")]
)
def test_nothing_listening_gives_the_cloud_without_region(
    isolated: Path, dmi: dict[str, str], cloud: str
) -> None:
    write_dmi(isolated, **dmi)  # the URLs point at a closed loopback port (``isolate``)
    started = time.monotonic()
    assert detect_place() == Place(cloud, None, "metadata")
    assert time.monotonic() - started < 3.0


@pytest.mark.parametrize(
    ("dmi", "cloud", "var"),
    [
        (AWS_DMI, "aws", ENV_AWS_URL),
        (GCP_DMI, "gcp", ENV_GCP_URL),
        (AZURE_DMI, "azure", ENV_AZURE_URL),
    ],
)
def test_a_hanging_service_ends_within_the_deadline(
    monkeypatch: pytest.MonkeyPatch, isolated: Path, dmi: dict[str, str], cloud: str, var: str
) -> None:
    """The IMDSv2 hop-limit case: the connection opens, the answer never comes."""
    write_dmi(isolated, **dmi)
    with SilentServer() as silent:
        monkeypatch.setenv(var, silent.url)
        started = time.monotonic()
        found = explain_place()
        elapsed = time.monotonic() - started
    assert found.place == Place(cloud, None, "metadata")
    assert elapsed < 3.0, f"detection took {elapsed:.2f} s"
    assert silent.accepted >= 1
    assert "no answer within 1 s" in found.steps[-1].why


def test_the_deadline_covers_the_whole_exchange_not_each_request(
    monkeypatch: pytest.MonkeyPatch, isolated: Path
) -> None:
    """Two answers of 0.7 s each fit a per-request timeout of 1 s, not a total of 1 s."""
    write_dmi(isolated, **AWS_DMI)
    with AwsImds("us-east-2", delay=0.7) as slow:
        monkeypatch.setenv(ENV_AWS_URL, slow.url)
        started = time.monotonic()
        found = explain_place()
        elapsed = time.monotonic() - started
    assert found.place == Place("aws", None, "metadata")  # per-request: us-east-2 at 1.4 s
    assert elapsed < 3.0, f"detection took {elapsed:.2f} s"


def test_a_trickling_service_is_cut_off_at_the_deadline(
    monkeypatch: pytest.MonkeyPatch, isolated: Path
) -> None:
    """Every read gets a byte in time, so only the total deadline can end the exchange."""
    write_dmi(isolated, **AWS_DMI)
    with TrickleServer(interval=0.05) as trickle:
        monkeypatch.setenv(ENV_AWS_URL, trickle.url)
        started = time.monotonic()
        found = explain_place()
        elapsed = time.monotonic() - started
    assert found.place == Place("aws", None, "metadata")
    assert elapsed < 3.0, f"detection took {elapsed:.2f} s"
    assert trickle.sent >= 5  # it was trickling, not silent


def test_gcp_answer_without_the_flavor_header_is_not_gcps(
    monkeypatch: pytest.MonkeyPatch, isolated: Path
) -> None:
    write_dmi(isolated, **GCP_DMI)
    with GcpMetadata(flavor_header=False) as impostor:
        monkeypatch.setenv(ENV_GCP_URL, impostor.url)
        found = explain_place()
    assert found.place == Place("gcp", None, "metadata")
    assert "Metadata-Flavor" in found.steps[-1].why


@pytest.mark.parametrize("answer", ["<html>login</html>", "", "us east 1"])
def test_an_answer_that_is_not_a_region_is_no_region(
    monkeypatch: pytest.MonkeyPatch, isolated: Path, answer: str
) -> None:
    write_dmi(isolated, **AZURE_DMI)
    with AzureImds(answer) as azure:
        monkeypatch.setenv(ENV_AZURE_URL, azure.url)
        assert detect_place() == Place("azure", None, "metadata")


def test_metadata_never_goes_through_an_http_proxy(
    monkeypatch: pytest.MonkeyPatch, isolated: Path
) -> None:
    write_dmi(isolated, **AWS_DMI)
    dead_proxy = closed_port_url()
    for var in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy"):
        monkeypatch.setenv(var, dead_proxy)
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.delenv("NO_PROXY", raising=False)
    with AwsImds("sa-east-1") as imds:
        monkeypatch.setenv(ENV_AWS_URL, imds.url)
        assert detect_place() == Place("aws", "sa-east-1", "metadata")
    assert all("X-Forwarded-For" not in seen.headers for seen in imds.requests)


def test_a_url_that_is_not_http_is_no_region(
    monkeypatch: pytest.MonkeyPatch, isolated: Path
) -> None:
    write_dmi(isolated, **AWS_DMI)
    monkeypatch.setenv(ENV_AWS_URL, "file:///etc/passwd")
    found = explain_place()
    assert found.place == Place("aws", None, "metadata")
    assert "not an http(s) URL" in found.steps[-1].why


# --- once per process -----------------------------------------------------------------


def test_detection_runs_once_per_process(monkeypatch: pytest.MonkeyPatch, isolated: Path) -> None:
    write_dmi(isolated, **AWS_DMI)
    with AwsImds("eu-central-1") as imds:
        monkeypatch.setenv(ENV_AWS_URL, imds.url)
        first = explain_place()
        assert imds.count == 2  # token PUT + region GET
        monkeypatch.setenv(ENV_CLOUD, "gcp")  # later changes are not seen: once per process
        monkeypatch.setenv(ENV_REGION, "us-east1")
        assert explain_place() is first
        assert detect_place() == Place("aws", "eu-central-1", "metadata")
        assert imds.count == 2
        reset()
        assert detect_place() == Place("gcp", "us-east1", "env")


def test_concurrent_first_calls_detect_once(
    monkeypatch: pytest.MonkeyPatch, isolated: Path
) -> None:
    write_dmi(isolated, **GCP_DMI)
    with GcpMetadata() as gcp:
        monkeypatch.setenv(ENV_GCP_URL, gcp.url)
        results: list[Detection] = []
        start = threading.Barrier(8)

        def call() -> None:
            start.wait(5)
            results.append(explain_place())

        threads = [threading.Thread(target=call) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        assert len(results) == 8
        assert all(r is results[0] for r in results)
        assert gcp.count == 1


def test_a_fork_during_detection_does_not_deadlock_the_child(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A worker forked while another thread holds the detection lock can still detect."""
    monkeypatch.setenv(ENV_CLOUD, "aws")
    monkeypatch.setenv(ENV_REGION, "us-east-1")
    with placemod._lock:  # as if another thread were asking the metadata service
        pid = os.fork()
        if pid == 0:  # the child: never return into pytest
            code = 1
            try:
                code = 0 if detect_place() == Place("aws", "us-east-1", "env") else 1
            finally:
                os._exit(code)
    deadline = time.monotonic() + 10
    status = 0
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        threading.Event().wait(0.01)
    else:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        pytest.fail("the forked child deadlocked on the detection lock")
    assert os.waitstatus_to_exitcode(status) == 0


def test_explanation_names_each_step_and_why(
    monkeypatch: pytest.MonkeyPatch, isolated: Path
) -> None:
    write_dmi(isolated, **AZURE_DMI)
    monkeypatch.setenv(ENV_SKYPILOT, skypilot("Kubernetes", "ctx"))
    with AzureImds("norwayeast") as azure:
        monkeypatch.setenv(ENV_AZURE_URL, azure.url)
        found = explain_place()
    assert [(s.source, s.answered) for s in found.steps] == [
        ("env", False),
        ("skypilot", False),
        ("metadata", True),
    ]
    assert "not set" in found.steps[0].why
    assert "kubernetes" in found.steps[1].why
    assert "chassis_asset_tag" in found.steps[2].why
    assert "norwayeast" in found.steps[2].why
    assert str(found.steps[0]).startswith("env: skipped: ")


def test_unknown_place_json(isolated: Path) -> None:
    assert detect_place().as_json() == {"cloud": None, "region": None, "source": "none"}
    assert placemod.explain_place().steps[-1].answered
