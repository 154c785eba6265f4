"""A managed job's health checks: what each looks at (`cluster_health`), and their pace (a
poll every few seconds, cut short when something else, the job's log stream breaking, says
the cluster may be gone).

Each looks, in order, at the provider's node states, the daemon's own SSH connections to the
nodes (a partitioned node shows there within about 30 s: control/links.py), then the agent
and Ray's count of live nodes (about a minute for a partition)."""

from __future__ import annotations

import anyio

from clusterctl.protocol import ClusterStatus, ProtocolError
from clusterd.control import NodeLinks
from clusterd.nodes import NodeStatus
from clusterd.providers.registry import ProviderRegistry
from clusterd.runtime.agent_access import AgentAccess
from clusterd.services.common import provider_handle
from clusterd.state.clusters import ClusterRecord


class HealthPoll:
    """`wait()` returns after `interval_s`, or at once when `look_now()` was called since the
    previous wait returned (also while it waits). It says which: True when cut short."""

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self._nudged = anyio.Event()

    def look_now(self) -> None:
        """Ask for the next check now. Never blocks; any number of calls make one check."""
        self._nudged.set()

    async def wait(self) -> bool:
        with anyio.move_on_after(self.interval_s):
            await self._nudged.wait()
        early = self._nudged.is_set()
        self._nudged = anyio.Event()
        return early


async def cluster_health(cluster: ClusterRecord | None, providers: ProviderRegistry,
                         access: AgentAccess, links: NodeLinks | None = None
                         ) -> tuple[str | None, bool]:
    """(why the job's cluster counts as lost, or None; whether its agent answered)."""
    if cluster is None:
        return "its cluster was found gone", False
    if cluster.status not in (ClusterStatus.UP, ClusterStatus.INIT):
        return f"its cluster went {cluster.status}: {cluster.status_reason}", False
    provider = providers.get(cluster.provider)
    try:
        with anyio.fail_after(15):
            nodes = await provider.query(cluster.cloud_name, provider_handle(cluster, provider))
    except (ProtocolError, TimeoutError):
        nodes = None  # the provider's API had a moment; the agent check still counts
    if nodes is not None:
        if len(nodes) < cluster.num_nodes:
            return f"{cluster.num_nodes - len(nodes)} of its nodes are gone", False
        bad = [n for n in nodes if n.status in (NodeStatus.TERMINATED, NodeStatus.STOPPED,
                                                NodeStatus.STOPPING)]
        if bad:
            return (f"node {bad[0].node_id} is {bad[0].status}"
                    + (" (preempted?)" if cluster.launched_resources
                       and cluster.launched_resources.spot else ""), False)
        if links is not None:
            cut_off = await links.cut_off(n.ssh for n in nodes if n.ssh is not None)
            if cut_off is not None:
                return cut_off, False
    try:
        with anyio.fail_after(10):
            agent = await access.client(cluster)
            health = await agent.check_version()
    except (ProtocolError, TimeoutError):
        return None, False
    if health.ray_nodes_alive < cluster.num_nodes:
        return (f"Ray sees {health.ray_nodes_alive} of its {cluster.num_nodes} nodes "
                "(one is partitioned or dead)"), True
    return None, True
