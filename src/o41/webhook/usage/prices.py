"""The price tables the usage page estimates costs with (egress, and storage per GB-month
for its net advice), and the user's override of the egress table.

List prices change and contracts differ, so the default table is dated and names its
sources, and an operator replaces any part of it with a JSON or YAML file named by
``O41_PRICES_FILE`` (the chart's ``usage.prices`` values). See docs/usage.md.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from aiohttp import web

from o41.core.usage import PriceError, Prices, PriceTable, StoragePrices, override_prices

PRICES_ENV = "O41_PRICES_FILE"

# First paid tier of each cloud's published list price, North America / Europe, per GB
# (10^9 bytes) leaving a region: to another region of the same cloud, and to the internet
# (which is how bytes reach another cloud). Ingress is free on all three.
DEFAULT_PRICES = PriceTable(
    as_of="2026-11-29",
    currency="USD",
    clouds={
        # EC2/S3 data transfer: $0.02/GB between US regions, $0.09/GB out to the internet
        # (100 GB-10 TB/month tier).
        "aws": Prices(inter_region=0.02, internet=0.09),
        # Premium tier: $0.02/GB between regions within North America or Europe, $0.12/GB
        # internet egress (0-1 TiB/month tier).
        "gcp": Prices(inter_region=0.02, internet=0.12),
        # Bandwidth: $0.02/GB between regions within North America or Europe, $0.087/GB
        # internet egress over Microsoft's network (first 10 TB/month after 100 GB free).
        "azure": Prices(inter_region=0.02, internet=0.087),
    },
    # Any other cloud tag (an S3-compatible endpoint, nebius...) and unknown places: the
    # big clouds' typical rates, so egress is not under-reported. Override per tag.
    default=Prices(inter_region=0.02, internet=0.09),
    sources=(
        "https://aws.amazon.com/ec2/pricing/on-demand/#Data_Transfer",
        "https://aws.amazon.com/s3/pricing/ (Data Transfer)",
        "https://cloud.google.com/vpc/network-pricing",
        "https://cloud.google.com/storage/pricing#network-pricing",
        "https://azure.microsoft.com/en-us/pricing/details/bandwidth/",
    ),
)

# Standard (hot) storage class, first tier, US regions, per GB-month: what the net advice
# (o41.core.advice) nets a new location's savings against; bench/cost_replay.py prices
# its traces with the same table.
STORAGE_PRICES = StoragePrices(
    as_of="2026-11-29",
    clouds={
        "aws": 0.023,  # S3 Standard, first 50 TB/month
        "gcp": 0.020,  # Cloud Storage Standard, regional (us-central1)
        "azure": 0.018,  # Blob Storage hot, LRS (East US), first 50 TB/month
    },
    default=0.023,
    sources=(
        "https://aws.amazon.com/s3/pricing/",
        "https://cloud.google.com/storage/pricing",
        "https://azure.microsoft.com/en-us/pricing/details/storage/blobs/",
    ),
)


PRICES: web.AppKey[PriceTable] = web.AppKey("prices")  # the table the page prices with


def load_prices(path: str | os.PathLike[str] | None = None) -> PriceTable:
    """The default table, overridden by the file at ``path`` (or ``$O41_PRICES_FILE``).

    A file that cannot be read or used raises PriceError naming the file and the field:
    the service should refuse to start rather than show wrong money.
    """
    if path is None:
        path = os.environ.get(PRICES_ENV) or None
    if path is None:
        return DEFAULT_PRICES
    file = Path(path)
    try:
        text = file.read_text()
    except OSError as e:
        raise PriceError(f"cannot read the price file {str(file)!r} ({PRICES_ENV}): {e}") from e
    data: object
    if file.suffix in (".yaml", ".yml"):
        import yaml

        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise PriceError(f"the price file {str(file)!r} is not valid YAML: {e}") from e
    else:
        try:
            data = json.loads(text)
        except ValueError as e:
            raise PriceError(f"the price file {str(file)!r} is not valid JSON: {e}") from e
    try:
        return override_prices(data if data is not None else {}, DEFAULT_PRICES)
    except PriceError as e:
        raise PriceError(f"the price file {str(file)!r}: {e}") from e
