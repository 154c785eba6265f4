"""resources.max_hourly_cost on the scripted provider (zones at $1.0, $1.1 and $1.5 per node
and hour): failover never picks a place above the cap, a launch that fits nowhere under it
is refused naming the cheapest place that exists, and a launch says the cluster's $/h
before it creates anything."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from clusterctl.protocol import ClusterStatus, ErrorCode, ProtocolError
from clusterd.providers.base import BlockScope
from clusterd.provision.plan import LaunchRequest
from clusterd.state.db import Database
from clusterd.tasks.spec import Infra, Resources, TaskSpec
from tests.scripted_provider import Services, build_services

pytestmark = pytest.mark.anyio


@pytest.fixture
async def bed(db: Database, tmp_path: Path) -> Services:
    return await build_services(db, tmp_path)


def capped(cap: float, *alternatives: Resources, nodes: int = 1) -> LaunchRequest:
    options = alternatives or (Resources(infra=Infra("scripted")),)
    options = tuple(dataclasses.replace(r, max_hourly_cost=cap) for r in options)
    return LaunchRequest("c", TaskSpec(num_nodes=nodes, resources=options[0],
                                       resource_choices=options if len(options) > 1 else ()))


def progress(bed: Services, request: object) -> list[str]:
    return [str(d.get("message")) for n, d in request._events  # type: ignore[attr-defined]
            if n == "progress"]


async def test_failover_never_picks_above_the_cap(bed: Services) -> None:
    bed.provider.fail("r1-a", BlockScope.ZONE)
    bed.provider.fail("r1-b", BlockScope.ZONE)
    with pytest.raises(ProtocolError) as caught:
        await bed.clusters.launch(bed.request(), capped(1.2))
    # r2-a ($1.5) was never tried: it costs more than the cap.
    assert [z for call, _, z in bed.provider.calls if call == "create"] == ["r1-a", "r1-b"]
    assert caught.value.code == ErrorCode.RESOURCES_UNAVAILABLE


async def test_a_launch_under_no_place_names_the_cheapest_that_exists(bed: Services) -> None:
    with pytest.raises(ProtocolError) as caught:
        await bed.clusters.launch(bed.request(), capped(0.5))
    message = caught.value.message
    assert "every place costs more than $0.5 per node and hour" in message
    assert "the cheapest is scripted/r1/r1-a (s.node) at $1 per node and hour" in message
    assert bed.store.get("c") is None or bed.store.get("c").status != ClusterStatus.UP


async def test_over_several_alternatives_the_cheapest_of_all_is_named(bed: Services) -> None:
    # Two alternatives, each refused for its price: one error names the cheapest overall.
    far = Resources(infra=Infra("scripted", "r2"), cpus=2)
    near = Resources(infra=Infra("scripted", "r1", "r1-b"), cpus=4)
    with pytest.raises(ProtocolError) as caught:
        await bed.clusters.launch(bed.request(), capped(0.9, far, near))
    assert "the cheapest is scripted/r1/r1-b (s.node) at $1.1" in caught.value.message
    assert caught.value.hint.startswith("raise resources.max_hourly_cost")


async def test_launch_says_the_clusters_hourly_price_before_creating(bed: Services) -> None:
    request = bed.request()
    await bed.clusters.launch(request, capped(1.2, nodes=3))
    lines = progress(bed, request)
    assert "creating nodes on scripted/r1/r1-a (s.node), $3/h for the cluster" in lines
