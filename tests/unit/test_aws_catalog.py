"""The AWS catalog: SkyPilot's CSV format and SkyPilot's meaning of a request."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from clusterd.providers.aws.catalog import Catalog, CatalogMiss, load_catalog
from clusterd.tasks.loader import parse_resources
from clusterd.tasks.spec import Resources


def want(**fields: object) -> Resources:
    return parse_resources(fields, "task.yaml")


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return load_catalog()


def cheapest_price(catalog: Catalog, predicate: object, spot: bool = False) -> float:
    return min(p for offers in catalog.offers.values() for o in offers
               if predicate(o.spec) and (p := o.price_for(spot)) is not None)  # type: ignore[operator]


def test_the_shipped_snapshot_covers_the_families_and_regions(catalog: Catalog) -> None:
    families = {s.family for s in catalog.specs.values()}
    assert families >= {"t3", "m5", "m6i", "m7i", "c5", "c6i", "c7i", "r5", "r6i", "g4dn", "g5",
                        "g6", "g6e", "p3", "p4d", "p5", "trn1", "inf2"}
    assert len(catalog.regions()) >= 8
    p4d = catalog.specs["p4d.24xlarge"]
    assert (p4d.accelerator, p4d.accelerator_count, p4d.vcpus) == ("A100", 8, 96)
    # Real prices, on demand and spot, per zone.
    offer = next(o for o in catalog.offers["m6i.2xlarge"] if o.region == "us-east-1")
    assert offer.price == pytest.approx(0.384)
    assert offer.spot_price is not None and 0 < offer.spot_price < offer.price


def test_nothing_asked_is_an_8_vcpu_general_purpose_instance(catalog: Catalog) -> None:
    choice = catalog.choose(want())
    assert choice.spec.vcpus == 8 and choice.spec.memory_gb == 32
    assert choice.spec.family in ("m6i", "m5") and not choice.spec.accelerator


def test_cpus_exact_and_at_least(catalog: Catalog) -> None:
    exact = catalog.choose(want(cpus=4))
    assert exact.spec.vcpus == 4 and not exact.spec.accelerator
    at_least = catalog.choose(want(cpus="3+"))
    assert at_least.spec.vcpus >= 3
    four_cpu = cheapest_price(catalog, lambda s: s.vcpus == 4 and not s.accelerator
                              and s.family != "t3")
    assert exact.offers[0].price == pytest.approx(four_cpu)
    with pytest.raises(CatalogMiss):
        catalog.choose(want(cpus=3))  # no instance has exactly 3 vCPUs


def test_memory_constrains_the_choice(catalog: Catalog) -> None:
    choice = catalog.choose(want(cpus=2, memory="16+"))
    assert choice.spec.vcpus == 2 and choice.spec.memory_gb >= 16


def test_accelerators_by_name_and_count(catalog: Catalog) -> None:
    assert catalog.choose(want(accelerators="A100:8")).spec.instance_type == "p4d.24xlarge"
    assert catalog.choose(want(accelerators={"V100": 1})).spec.instance_type == "p3.2xlarge"
    assert catalog.choose(want(accelerators="a10g")).spec.instance_type == "g5.xlarge"


def test_no_fit_names_the_request_and_the_nearest_offers(catalog: Catalog) -> None:
    with pytest.raises(CatalogMiss) as miss:
        catalog.choose(want(accelerators="A100:3"))
    assert "accelerators=A100:3" in str(miss.value) and "p4d.24xlarge" in str(miss.value)
    with pytest.raises(CatalogMiss) as unknown:
        catalog.choose(want(accelerators="B200:8"))
    assert "no instance type has B200" in str(unknown.value) and "H100" in str(unknown.value)
    with pytest.raises(CatalogMiss) as typo:
        catalog.choose(want(instance_type="m6i.3xlarge"))
    assert "m6i.4xlarge" in str(typo.value)


def test_offers_are_cheapest_first_and_region_bound(catalog: Catalog) -> None:
    choice = catalog.choose(want(accelerators="T4:1", use_spot=True))
    prices = [o.spot_price for o in choice.offers]
    assert prices == sorted(prices) and None not in prices
    bound = catalog.choose(want(accelerators="T4:1", infra="aws/eu-west-1"))
    assert {o.region for o in bound.offers} == {"eu-west-1"}
    with pytest.raises(CatalogMiss) as nowhere:
        catalog.choose(want(accelerators="L40S:1", infra="aws/eu-west-1"))
    assert "not offered on demand in eu-west-1" in str(nowhere.value)
    assert "(offered in: " in str(nowhere.value) and "us-east-1" in str(nowhere.value)


def test_a_user_catalog_in_skypilots_layout_replaces_ours(tmp_path: Path) -> None:
    aws = tmp_path / "aws"
    aws.mkdir()
    (aws / "vms.csv").write_text(
        "InstanceType,AcceleratorName,AcceleratorCount,vCPUs,MemoryGiB,GpuInfo,Price,"
        "SpotPrice,Region,AvailabilityZone\n"
        'x9.big,Z100,2.0,16.0,64.0,"{\'Gpus\': [{\'Name\': \'Z100\', \'Count\': 2}]}",5.5,'
        "1.25,us-east-1,use1-az1\n"
        "x9.big,Z100,2.0,16.0,64.0,,,,us-east-1,use1-az2\n"  # no price at all: skipped
        "x9.small,,,2.0,4.0,,0.1,,eu-west-1,euw1-az1\n")
    catalog = load_catalog(tmp_path)
    assert set(catalog.specs) == {"x9.big", "x9.small"}
    choice = catalog.choose(want(accelerators="Z100:2", use_spot=True))
    assert [(o.zone_id, o.spot_price) for o in choice.offers] == [("use1-az1", 1.25)]
    row = catalog.accelerator_rows("z100")[0]
    assert (row["price"], row["spot_price"], row["regions"]) == (5.5, 1.25, ["us-east-1"])
    with pytest.raises(CatalogMiss):  # no spot price for x9.small anywhere
        catalog.choose(want(instance_type="x9.small", use_spot=True))


def test_accelerator_rows_for_show_gpus(catalog: Catalog) -> None:
    rows = catalog.accelerator_rows("A100")
    assert rows and all(r["accelerator"] == "A100" for r in rows)
    p4d = next(r for r in rows if r["instance_type"] == "p4d.24xlarge")
    assert p4d["count"] == 8 and isinstance(p4d["price"], float) and math.isfinite(p4d["price"])
    assert "us-east-1" in p4d["regions"]
    assert {r["accelerator"] for r in catalog.accelerator_rows()} >= {"A100", "H100", "T4"}
