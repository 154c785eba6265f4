"""The price of one node of a cluster as placed, and where that price came from.

* aws: the catalog's on-demand price of the instance type in its region and zone (as the
  placement recorded it at launch), or its spot price, which is an estimate (spot prices
  move; the catalog holds one); disks at `aws.disk_price_per_gb_month` (the catalog has
  no disk prices).
* kubernetes: `kubernetes.pricing` applied to what each pod requests (CPUs, memory in
  GiB, GPUs of a type), and its disk_size at `pricing.disk_gb_per_month`.
* ssh: the pool's `price_per_hour` per host (ssh_node_pools.yaml).
* local: nothing.

A price that cannot be read (a broken config file) is 0 with a source that says why: a
cost report must never fail a launch or a stop.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from clusterctl.protocol import ProtocolError
from clusterd.providers.base import Placement
from clusterd.providers.ssh_pools import Pool
from clusterd.tasks.spec import ResourceRequest
from clusterd.user_config import UserConfig

HOURS_PER_MONTH = 730.0  # as the clouds bill storage: 365 * 24 / 12
AWS_DEFAULT_DISK_GB = 256  # as providers/aws/creation.py (and SkyPilot)


@dataclasses.dataclass(frozen=True)
class NodePrice:
    node_per_hour: float  # one node running
    disk_per_hour: float  # one node's disk, running or stopped
    source: str  # for reports: "catalog on-demand", "kubernetes.pricing", ...


def disk_gb(request: ResourceRequest) -> int | None:
    """The disk size the task asked for (the first option that says one), if any."""
    return next((o.disk_size_gb for o in request.options() if o.disk_size_gb), None)


class Prices:
    def __init__(self, config: Callable[[], UserConfig],
                 pools: Callable[[], dict[str, Pool]]) -> None:
        self._config = config
        self._pools = pools

    def node(self, placed: Placement | None, request: ResourceRequest) -> NodePrice:
        """One node's price where `placed` put it (None: not placed yet: nothing)."""
        if placed is None:
            return NodePrice(0.0, 0.0, "not placed")
        try:
            if placed.provider == "aws":
                return self._aws(placed, request)
            if placed.provider == "kubernetes":
                return self._kubernetes(placed, request)
            if placed.provider == "ssh":
                return self._ssh(placed)
        except ProtocolError as exc:  # the config or pools file does not read
            return NodePrice(0.0, 0.0, f"unpriced ({exc.message[:120]})")
        if placed.provider == "local":
            return NodePrice(0.0, 0.0, "local (free)")
        return NodePrice(placed.price_per_hour, 0.0, f"{placed.provider} placement")

    def _aws(self, placed: Placement, request: ResourceRequest) -> NodePrice:
        per_gb_month = self._config().aws.disk_price_per_gb_month
        disk = (disk_gb(request) or AWS_DEFAULT_DISK_GB) * per_gb_month / HOURS_PER_MONTH
        source = "catalog spot (estimate)" if placed.spot else "catalog on-demand"
        return NodePrice(placed.price_per_hour, disk, source)

    def _kubernetes(self, placed: Placement, request: ResourceRequest) -> NodePrice:
        pricing = self._config().kubernetes.pricing
        price, unpriced = pricing.pod_per_hour(placed.cpus, placed.memory_gb,
                                               placed.accelerator, placed.accelerator_count)
        source = "kubernetes.pricing" + (f" (no price for {unpriced})" if unpriced else "")
        disk = (disk_gb(request) or 0) * pricing.disk_gb_per_month / HOURS_PER_MONTH
        return NodePrice(price, disk, source)

    def _ssh(self, placed: Placement) -> NodePrice:
        pool = self._pools().get(placed.region or "")
        if pool is None:
            return NodePrice(0.0, 0.0, f"ssh pool {placed.region} (no longer defined)")
        return NodePrice(pool.price_per_hour, 0.0, f"ssh pool {pool.name} price_per_hour")
