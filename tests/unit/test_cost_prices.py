"""Prices of a node as placed, per provider, and their config keys."""

from __future__ import annotations

from pathlib import Path

import pytest

from clusterctl.protocol import ProtocolError
from clusterd.cost.prices import Prices
from clusterd.providers.base import Placement
from clusterd.providers.ssh_pools import Pool, load_pools
from clusterd.tasks.spec import Infra, ResourceRequest, Resources
from clusterd.user_config import ConfigError, parse

CONFIG = """
aws: {disk_price_per_gb_month: 0.1}
kubernetes:
  pricing: {cpu_per_hour: 0.05, memory_gib_per_hour: 0.01, gpu_per_hour: {T4: 0.4},
            disk_gb_per_month: 0.073}
"""


def prices(text: str = CONFIG, pools: dict[str, Pool] | None = None) -> Prices:
    config = parse(Path("c.yaml"), text)
    return Prices(lambda: config, lambda: pools or {})


def request(disk: int | None = None) -> ResourceRequest:
    return ResourceRequest(Resources(Infra("aws"), disk_size_gb=disk))


def test_aws_on_demand_and_spot_from_the_placement() -> None:
    placed = Placement("aws", "us-east-1", "us-east-1a", "m5.large", 2, 8,
                       price_per_hour=0.096)
    price = prices().node(placed, request(disk=73))
    assert (price.node_per_hour, price.source) == (0.096, "catalog on-demand")
    assert price.disk_per_hour == pytest.approx(73 * 0.1 / 730)
    spot = prices().node(Placement("aws", "us-east-1", "us-east-1a", "m5.large", 2, 8,
                                   price_per_hour=0.03, spot=True), request())
    assert spot.source == "catalog spot (estimate)"
    assert spot.disk_per_hour == pytest.approx(256 * 0.1 / 730)  # the default disk


def test_kubernetes_from_the_pods_requests() -> None:
    placed = Placement("kubernetes", "ctx", None, "4CPU--16GB--1T4", 4, 16, "T4", 1)
    price = prices().node(placed, request(disk=10))
    assert price.node_per_hour == pytest.approx(4 * 0.05 + 16 * 0.01 + 0.4)
    assert price.disk_per_hour == pytest.approx(10 * 0.073 / 730)
    unpriced_gpu = prices().node(Placement("kubernetes", "ctx", None, None, 1, 1, "H100", 2),
                                 request())
    assert unpriced_gpu.node_per_hour == pytest.approx(0.06)
    assert "no price for H100" in unpriced_gpu.source


def test_ssh_pool_price_and_local_is_free() -> None:
    pools = {"rack": Pool("rack", (), price_per_hour=1.5)}
    assert prices(pools=pools).node(Placement("ssh", "rack", None, None, 0, 0),
                                    request()).node_per_hour == 1.5
    gone = prices(pools=pools).node(Placement("ssh", "old", None, None, 0, 0), request())
    assert gone.node_per_hour == 0 and "no longer defined" in gone.source
    assert prices().node(Placement("local", None, None, None, 1, 1), request()).node_per_hour == 0


def test_a_broken_config_prices_nothing_and_says_why() -> None:
    def broken() -> object:
        raise ConfigError(Path("c.yaml"), "aws", "expected a map")

    book = Prices(broken, dict)  # type: ignore[arg-type]
    price = book.node(Placement("aws", "r", "z", "m5.large", 2, 8, price_per_hour=1.0),
                      request())
    assert price.node_per_hour == 0 and "expected a map" in price.source


@pytest.mark.parametrize("text, key", [
    ("kubernetes: {pricing: {cpu: 1}}", "kubernetes.pricing.cpu"),
    ("kubernetes: {pricing: {cpu_per_hour: -1}}", "kubernetes.pricing.cpu_per_hour"),
    ("kubernetes: {pricing: {gpu_per_hour: [1]}}", "kubernetes.pricing.gpu_per_hour"),
    ("kubernetes: {pricing: {gpu_per_hour: {T4: x}}}", "kubernetes.pricing.gpu_per_hour.T4"),
    ("aws: {disk_price_per_gb_month: true}", "aws.disk_price_per_gb_month"),
])
def test_bad_prices_in_the_config_name_their_key(text: str, key: str) -> None:
    with pytest.raises(ProtocolError, match=f": {key}: "):
        parse(Path("c.yaml"), text)


def test_pool_price_is_checked(tmp_path: Path) -> None:
    path = tmp_path / "pools.yaml"
    path.write_text("rack: {price_per_hour: 0.25, hosts: [10.0.0.1]}\n")
    assert load_pools(path)["rack"].price_per_hour == 0.25
    path.write_text("rack: {price_per_hour: cheap, hosts: [10.0.0.1]}\n")
    with pytest.raises(ProtocolError, match=r"rack\.price_per_hour"):
        load_pools(path)
