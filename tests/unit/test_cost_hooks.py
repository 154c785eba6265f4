"""The ledger's hooks in the cluster services, on the scripted provider: a launch opens a
running interval, stop turns it into a stopped one, start back, down closes everything, and
a launch that fails leaves nothing open."""

from __future__ import annotations

from pathlib import Path

import pytest

from clusterctl.protocol import ErrorCode, ProtocolError
from clusterd.cost.ledger import RUNNING, STOPPED
from clusterd.providers.base import BlockScope
from clusterd.providers.registry import ProviderRegistry
from clusterd.provision.plan import LaunchRequest
from clusterd.state.db import Database
from clusterd.tasks.spec import TaskSpec
from tests.scripted_provider import Services, build_services

pytestmark = pytest.mark.anyio


@pytest.fixture
async def bed(db: Database, tmp_path: Path) -> Services:
    return await build_services(db, tmp_path)


async def rows(db: Database) -> list[tuple[str, int, bool]]:
    found = await db.fetchall("SELECT kind, nodes, ended_at FROM cost_intervals ORDER BY id")
    return [(r["kind"], r["nodes"], r["ended_at"] is None) for r in found]


async def test_launch_stop_start_down(bed: Services, db: Database) -> None:
    request = bed.request()
    await bed.clusters.launch(request, LaunchRequest("c", TaskSpec(num_nodes=2)))
    # Its price was said before anything was made: 2 nodes at $1/h in r1-a.
    assert "creating nodes on scripted/r1/r1-a (s.node), $2/h for the cluster" in [
        data.get("message") for name, data in request._events if name == "progress"]
    assert await rows(db) == [(RUNNING, 2, True)]
    [running] = bed.clusters.ledger.open_intervals("c")
    assert running.node_price_per_hour > 0 and running.instance_type == "s.node"
    await bed.clusters.stop(bed.request("stop"), "c")
    assert await rows(db) == [(RUNNING, 2, False), (STOPPED, 2, True)]
    await bed.clusters.start(bed.request("start"), "c")
    assert await rows(db) == [(RUNNING, 2, False), (STOPPED, 2, False), (RUNNING, 2, True)]
    await bed.clusters.launch(bed.request(), LaunchRequest("c", TaskSpec(num_nodes=2)))
    assert len(await rows(db)) == 3  # a reuse opens nothing
    await bed.clusters.down(bed.request("down"), "c", purge=False)
    assert [open_ for _, _, open_ in await rows(db)] == [False, False, False]
    assert await bed.clusters.ledger.spenders() == []


async def test_a_failed_launch_leaves_nothing_open(bed: Services, db: Database) -> None:
    bed.provider.fail(None, BlockScope.ZONE)
    with pytest.raises(ProtocolError):
        await bed.clusters.launch(bed.request(), LaunchRequest("c", TaskSpec()))
    assert await rows(db) == []
    # Nodes made, then the runtime fails: the interval opened with the nodes closes with them.
    bed.provider.heal()
    bed.runtime.fail_up = ProtocolError(ErrorCode.INTERNAL, "no Ray")
    with pytest.raises(ProtocolError):
        await bed.clusters.launch(bed.request(), LaunchRequest("c", TaskSpec()))
    assert await rows(db) == [(RUNNING, 1, False)]


async def test_refresh_counts_lost_nodes_and_closes_when_all_are_gone(
        bed: Services, db: Database, tmp_path: Path) -> None:
    from clusterd.runtime.agent_access import AgentAccess
    from clusterd.runtime.agent_client import AgentConnections
    from clusterd.services.refresh import RefreshService
    from clusterd.ssh.connections import SSHConnections
    from clusterd.ssh.host_keys import HostKeyStore
    from clusterd.ssh.tunnels import TunnelManager

    access = AgentAccess(AgentConnections(), TunnelManager(
        SSHConnections(HostKeyStore(tmp_path / "kh")), tmp_path / "t"))
    refresh = RefreshService(bed.store, bed.locks, ProviderRegistry([bed.provider]),
                             None, access, bed.clusters, None,  # type: ignore[arg-type]
                             interval_s=30.0)
    await bed.clusters.launch(bed.request(), LaunchRequest("c", TaskSpec(num_nodes=2)))
    record = bed.store.get("c")
    assert record is not None
    bed.provider.lose(record.cloud_name, 1)  # a spot node preempted
    await refresh.cycle(force=True)
    assert await rows(db) == [(RUNNING, 2, False), (RUNNING, 1, True)]
    bed.provider.lose(record.cloud_name, 0)
    await refresh.cycle(force=True)
    assert bed.store.get("c") is None
    assert [open_ for _, _, open_ in await rows(db)] == [False, False]
