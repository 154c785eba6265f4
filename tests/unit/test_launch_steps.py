"""Each step of a launch, executed by the cluster services on the scripted provider and
runtime (tests/scripted_provider.py): new with failover, reuse, start, resume, wait, repair,
recreate, a launch waiting on another, and the cleanup of a failed one."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import anyio
import pytest

from clusterctl.protocol import ClusterStatus, ErrorCode, ProtocolError
from clusterd.nodes import NodeStatus
from clusterd.providers.base import BlockScope, Placement
from clusterd.provision.plan import LaunchRequest
from clusterd.requests import RunningRequest
from clusterd.state.clusters import ClusterRecord
from clusterd.state.db import Database
from clusterd.state.handles import ClusterHandle
from clusterd.tasks.spec import Autostop, ResourceRequest, TaskSpec
from tests.scripted_provider import Instance, ScriptedHandle, Services, build_services

pytestmark = pytest.mark.anyio


@pytest.fixture
async def bed(db: Database, tmp_path: Path) -> Services:
    return await build_services(db, tmp_path)


def launch(name: str = "c", nodes: int = 1, **fields: object) -> LaunchRequest:
    return LaunchRequest(name, TaskSpec(num_nodes=nodes), **fields)  # type: ignore[arg-type]


def said(request: RunningRequest) -> list[str]:
    return [str(data.get("message")) for name, data in request._events if name == "progress"]


async def until(condition: Callable[[], object], timeout_s: float = 10) -> None:
    """Wait for `condition` (the services' work runs partly in the database's thread, so
    "every task blocked" does not say they got there)."""
    with anyio.fail_after(timeout_s):
        while not condition():
            await anyio.sleep(0.002)


def creates(bed: Services) -> list[str | None]:
    return [zone for call, _, zone in bed.provider.calls if call == "create"]


async def up(bed: Services, name: str = "c", nodes: int = 1) -> ClusterRecord:
    await bed.clusters.launch(bed.request(), launch(name, nodes))
    record = bed.store.get(name)
    assert record is not None and record.status == ClusterStatus.UP
    return record


async def test_new_fails_over_to_the_next_zone_and_keeps_only_what_landed(
        bed: Services) -> None:
    bed.provider.fail("r1-a", BlockScope.ZONE)
    record = await up(bed, nodes=2)
    assert creates(bed) == ["r1-a", "r1-b"]
    assert record.launched_resources and record.launched_resources.zone == "r1-b"
    assert [i.zone for i in bed.provider.instances.values()] == ["r1-b"]
    assert [(name, len(nodes)) for name, nodes, _, _ in bed.runtime.ups] == [("c", 2)]
    assert record.ever_up and record.owner is None


async def test_a_region_wide_failure_skips_the_rest_of_the_region(bed: Services) -> None:
    bed.provider.fail("r1-a", BlockScope.REGION)
    await up(bed)
    assert creates(bed) == ["r1-a", "r2-a"]


async def test_no_capacity_anywhere_fails_and_leaves_no_record_nor_instance(
        bed: Services) -> None:
    bed.provider.fail(None, BlockScope.ZONE)
    with pytest.raises(ProtocolError) as caught:
        await bed.clusters.launch(bed.request(), launch())
    assert caught.value.code == ErrorCode.RESOURCES_UNAVAILABLE
    assert creates(bed) == ["r1-a", "r1-b", "r2-a"]
    assert bed.store.get("c") is None and bed.provider.instances == {}


async def test_retry_until_up_tries_every_zone_again_after_a_gap(bed: Services) -> None:
    bed.provider.fail(None, BlockScope.ZONE)
    async with anyio.create_task_group() as group:
        group.start_soon(bed.clusters.launch, bed.request(), launch(retry_until_up=True))
        await until(lambda: len(creates(bed)) >= 3)
        bed.provider.heal()
    assert creates(bed)[:4] == ["r1-a", "r1-b", "r2-a", "r1-a"]
    record = bed.store.get("c")
    assert record is not None and record.status == ClusterStatus.UP


async def test_a_runtime_that_fails_to_start_takes_the_new_nodes_and_record_along(
        bed: Services) -> None:
    bed.runtime.fail_up = ProtocolError(ErrorCode.INTERNAL, "ray did not start")
    with pytest.raises(ProtocolError, match="ray did not start"):
        await bed.clusters.launch(bed.request(), launch())
    assert bed.provider.instances == {} and bed.store.get("c") is None
    assert [call for call, _, _ in bed.provider.calls].count("terminate") == 1


async def test_a_healthy_up_cluster_is_reused(bed: Services) -> None:
    await up(bed)
    request = bed.request()
    await bed.clusters.launch(request, launch())
    assert len(bed.runtime.ups) == 1 and creates(bed) == ["r1-a"]
    assert "cluster c is UP; reusing it" in said(request)


@pytest.mark.parametrize(("health", "fresh", "saying"), [
    ("unhealthy", False, "repairing the runtime of c"),
    ("other version", True, "upgrading the runtime of c to this version"),
])
async def test_an_unhealthy_runtime_is_started_again_on_the_same_nodes(
        bed: Services, health: str, fresh: bool, saying: str) -> None:
    await up(bed)
    bed.runtime.health_of["c"] = health  # type: ignore[assignment]
    request = bed.request()
    await bed.clusters.launch(request, launch())
    assert [f for _, _, f, _ in bed.runtime.ups] == [False, fresh]
    assert saying in said(request) and creates(bed) == ["r1-a"]


async def test_a_stopped_cluster_is_started_where_it_lives(bed: Services) -> None:
    await up(bed)
    await bed.clusters.stop(bed.request("stop"), "c")
    stopped = bed.store.get("c")
    assert stopped is not None and stopped.status == ClusterStatus.STOPPED
    assert len(bed.runtime.stops) == 1
    await bed.clusters.start(bed.request("start"), "c")
    record = bed.store.get("c")
    assert record is not None and record.status == ClusterStatus.UP
    assert [c for c, _, _ in bed.provider.calls if c in ("stop", "start")] == ["stop", "start"]
    assert len(bed.runtime.ups) == 2 and creates(bed) == ["r1-a"]


async def test_a_stopped_cluster_without_capacity_where_it_lives_is_not_moved(
        bed: Services) -> None:
    await up(bed)
    await bed.clusters.stop(bed.request("stop"), "c")
    bed.provider.fail("r1-a", BlockScope.ZONE)
    with pytest.raises(ProtocolError, match="cannot come back where it lives"):
        await bed.clusters.launch(bed.request(), launch())
    assert creates(bed) == ["r1-a"]


async def test_a_lost_node_is_made_again_in_place_and_the_survivors_keep_their_runtime(
        bed: Services) -> None:
    before = await up(bed, nodes=2)
    bed.provider.lose(before.cloud_name, 1)
    request = bed.request()
    await bed.clusters.launch(request, launch(nodes=2))
    assert creates(bed) == ["r1-a", "r1-a"]
    # The second start knows what still runs on the survivor (the runtime recorded before).
    assert bed.runtime.ups[1][3] == before.handle.runtime
    assert bed.provider.instances[before.cloud_name].nodes == [NodeStatus.RUNNING] * 2
    assert any("lost nodes; making them again in scripted/r1/r1-a" in m for m in said(request))


async def test_a_recreate_without_capacity_keeps_the_cluster_as_it_was(bed: Services) -> None:
    before = await up(bed, nodes=2)
    bed.provider.lose(before.cloud_name, 1)
    bed.provider.fail("r1-a", BlockScope.ZONE)
    with pytest.raises(ProtocolError, match="cannot come back where it lives"):
        await bed.clusters.launch(bed.request(), launch(nodes=2))
    after = bed.store.get("c")
    # Its handle is back, so the next launch repairs it again (not resume a launch).
    assert after is not None and after.handle.provider == before.handle.provider
    assert creates(bed) == ["r1-a", "r1-a"]  # never elsewhere


async def interrupted(bed: Services, handle: ClusterHandle) -> None:
    """A record as a daemon killed mid-launch left it."""
    now = time.time()
    record = ClusterRecord("c", "scripted", "c-0a1b2c", ClusterStatus.INIT, 1, ResourceRequest(),
                           "h", now, now, handle=handle)
    await bed.store.insert(record, "test", None)


PLACE = Placement("scripted", "r1", "r1-b", "s.node", 4, 16, price_per_hour=1.1)


async def test_a_launch_killed_before_its_create_answered_resumes_there_with_its_token(
        bed: Services) -> None:
    # The create had made the nodes when the daemon died; the answer was lost.
    bed.provider.instances["c-0a1b2c"] = Instance("r1-b", "tok", [NodeStatus.RUNNING])
    await interrupted(bed, ClusterHandle(intent=PLACE, create_token="tok"))
    request = bed.request()
    await bed.clusters.launch(request, launch())
    assert creates(bed) == ["r1-b"] and list(bed.provider.instances) == ["c-0a1b2c"]
    assert "resuming the interrupted launch of c" in said(request)
    record = bed.store.get("c")
    assert record is not None and record.status == ClusterStatus.UP


async def test_a_launch_killed_after_its_create_waits_for_the_nodes_then_starts_them(
        bed: Services) -> None:
    bed.provider.instances["c-0a1b2c"] = Instance("r1-b", "tok", [NodeStatus.RUNNING])
    await interrupted(bed, ClusterHandle(intent=PLACE, create_token="tok",
                                         provider=ScriptedHandle("r1-b")))
    request = bed.request()
    await bed.clusters.launch(request, launch())
    assert [c for c, _, _ in bed.provider.calls][:1] == ["wait"] and creates(bed) == []
    assert "waiting for the nodes of c to run" in said(request)
    assert len(bed.runtime.ups) == 1


async def test_a_launch_waits_for_another_of_the_same_cluster_then_reuses_it(
        bed: Services) -> None:
    gate = bed.provider.gate("create")
    first, second = bed.request(), bed.request()
    async with anyio.create_task_group() as group:
        group.start_soon(bed.clusters.launch, first, launch())
        await until(lambda: creates(bed))
        group.start_soon(bed.clusters.launch, second, launch())
        await until(lambda: second.last_blocked)
        assert second.last_blocked is not None and f"request {first.id}" in second.last_blocked
        gate.set()
    assert creates(bed) == ["r1-a"] and len(bed.runtime.ups) == 1
    assert "cluster c is UP; reusing it" in said(second)


async def test_down_removes_nodes_runtime_and_record(bed: Services) -> None:
    record = await up(bed)
    await bed.clusters.down(bed.request("down"), "c", purge=False)
    assert bed.store.get("c") is None and bed.provider.instances == {}
    assert bed.runtime.stops and "c" in bed.runtime.closed
    assert ("terminate", record.cloud_name, "r1-a") in bed.provider.calls


async def test_down_calls_off_a_launch_in_progress_which_removes_what_it_made(
        bed: Services) -> None:
    gate = bed.provider.gate("wait")
    async with anyio.create_task_group() as group:

        async def launching() -> None:
            with pytest.raises(ProtocolError, match="called off by request"):
                await bed.clusters.launch(bed.request(), launch())

        group.start_soon(launching)
        await until(lambda: bed.provider.instances)  # made, waiting for its nodes
        await bed.clusters.down(bed.request("down"), "c", purge=False, call_off=True)
        gate.set()
    assert bed.store.get("c") is None and bed.provider.instances == {}


async def test_a_launch_sets_its_autostop_in_the_record_and_the_agent(bed: Services) -> None:
    await bed.clusters.launch(bed.request(), launch(autostop=Autostop(5, down=True)))
    record = bed.store.get("c")
    assert record is not None and record.autostop_minutes == 5 and record.autostop_down
    assert bed.runtime.autostops == [("c", Autostop(5, down=True))]


async def test_nodes_not_up_in_time_fail_over_and_each_attempt_is_removed(
        db: Database, tmp_path: Path) -> None:
    bed = await build_services(db, tmp_path, wait_timeout_s=0.05)
    bed.provider.delay("wait", 30)
    with pytest.raises(ProtocolError) as caught:
        await bed.clusters.launch(bed.request(), launch())
    assert caught.value.code == ErrorCode.RESOURCES_UNAVAILABLE
    assert "not up within" in caught.value.message
    calls = [(call, zone) for call, _, zone in bed.provider.calls]
    # Each attempt removes what it made; then the failed launch sweeps its last intent.
    assert calls == [(call, zone) for zone in ("r1-a", "r1-b", "r2-a")
                     for call in ("create", "wait", "terminate")] + [("terminate", "r2-a")]
    assert bed.provider.instances == {} and bed.store.get("c") is None
