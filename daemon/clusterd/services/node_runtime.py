"""What the cluster services need of the runtime on a cluster's nodes, as one small protocol.

The services bring a cluster's runtime up, stop it, ask whether it is healthy, tell its agent
the autostop setting and drop the connection to it; `NodeRuntime` does that with Ray and the
agent (RuntimeManager, AgentAccess). Tests give the services another implementation (one
that needs no Ray, tests/scripted_provider.py), so launch, repair and teardown are checked in
milliseconds.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol

from clusterctl.protocol import ErrorCode, ProtocolError
from clusterd.nodes import ClusterInfo
from clusterd.provision.plan import Health
from clusterd.runtime.agent_access import AgentAccess
from clusterd.runtime.agent_types import AutostopSetting, as_wait_for
from clusterd.runtime.manager import RuntimeManager
from clusterd.ssh.tunnels import TunnelState
from clusterd.state.clusters import ClusterRecord
from clusterd.state.handles import RuntimeHandle
from clusterd.tasks.spec import Autostop

Progress = Callable[[str, str], Awaitable[None]]
Checkpoint = Callable[[RuntimeHandle], Awaitable[None]]


class Runtime(Protocol):
    async def up(self, record: ClusterRecord, info: ClusterInfo,
                 previous: RuntimeHandle | None, progress: Progress, *, fresh: bool,
                 checkpoint: Checkpoint) -> RuntimeHandle:
        """The runtime up on every node of `info`; `checkpoint` gets its handle before
        anything starts (so a daemon killed mid-way knows what it may have started)."""
        ...

    async def stop(self, info: ClusterInfo) -> None:
        """Stop the runtime on the nodes of `info` (the agent cancels its jobs)."""
        ...

    async def remove_files(self, cloud_name: str, info: ClusterInfo) -> None: ...

    async def health(self, record: ClusterRecord) -> Health:
        """Whether the recorded runtime can be reused. Never raises ProtocolError."""
        ...

    async def set_autostop(self, record: ClusterRecord, setting: Autostop | None) -> None:
        """Tell the UP cluster's agent the setting (None: cancel), which it enforces."""
        ...

    async def close(self, cluster: str, grace_s: float | None = None) -> None:
        """Drop the connection to the cluster's agent (and its tunnel)."""
        ...

    def tunnel(self, cluster: str) -> TunnelState | None: ...


class NodeRuntime:
    """The runtime as it is: Ray and the agent, reached through AgentAccess."""

    def __init__(self, manager: RuntimeManager, access: AgentAccess) -> None:
        self._manager = manager
        self._access = access

    async def up(self, record: ClusterRecord, info: ClusterInfo,
                 previous: RuntimeHandle | None, progress: Progress, *, fresh: bool,
                 checkpoint: Checkpoint) -> RuntimeHandle:
        return await self._manager.up(record.name, record.cloud_name, info, previous,
                                      progress, fresh=fresh, checkpoint=checkpoint)

    async def stop(self, info: ClusterInfo) -> None:
        await self._manager.stop(info)

    async def remove_files(self, cloud_name: str, info: ClusterInfo) -> None:
        await self._manager.remove_files(cloud_name, info)

    async def health(self, record: ClusterRecord) -> Health:
        try:
            agent = await self._access.client(record)
            health = await agent.check_version()
        except ProtocolError as exc:
            await self._access.reset(record.name)
            return "other version" if exc.code == ErrorCode.AGENT_VERSION_MISMATCH else (
                "unhealthy")
        if health.ray_connected and health.ray_nodes_alive >= record.num_nodes:
            return "healthy"
        return "unhealthy"

    async def set_autostop(self, record: ClusterRecord, setting: Autostop | None) -> None:
        agent = await self._access.client(record)
        await agent.set_autostop(
            AutostopSetting(None) if setting is None else AutostopSetting(
                setting.idle_minutes, setting.down, as_wait_for(setting.wait_for)))

    async def close(self, cluster: str, grace_s: float | None = None) -> None:
        await self._access.close(cluster, grace_s)

    def tunnel(self, cluster: str) -> TunnelState | None:
        return self._access.tunnels.describe(cluster)
