"""How the daemon reaches a cluster's agent: directly on a local Unix socket, or through an SSH
tunnel to the agent's Unix socket on the head. Everything else asks here for a client and
never cares which.

A runtime recorded by a clusterd from before agents had a token (and, on remote heads, a
private Unix socket instead of a loopback port) is reported as AGENT_VERSION_MISMATCH: a
re-launch replaces it (see ClusterService._runtime_health)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from clusterctl.protocol import ErrorCode, ProtocolError
from clusterd.nodes import SSHTarget
from clusterd.runtime.agent_client import AgentClient, AgentConnections
from clusterd.ssh.tunnels import TunnelManager
from clusterd.state.clusters import ClusterRecord

TunnelListener = Callable[[str, dict[str, Any] | None], Awaitable[None]]


def head_target(runtime: dict[str, Any]) -> SSHTarget | None:
    head = runtime.get("head_ssh")
    return SSHTarget.from_handle(head) if head else None


class AgentAccess:
    def __init__(self, agents: AgentConnections, tunnels: TunnelManager,
                 on_tunnel: TunnelListener | None = None) -> None:
        self._agents = agents
        self.tunnels = tunnels
        self._on_tunnel = on_tunnel

    async def endpoint(self, cluster: str, cloud_name: str, runtime: dict[str, Any]) -> str:
        if not runtime.get("agent_token"):
            if not runtime:
                raise ProtocolError(
                    ErrorCode.AGENT_UNREACHABLE, f"cluster {cluster} has no agent recorded",
                    f"re-launch it: clusterctl launch -c {cluster}",
                )
            raise ProtocolError(
                ErrorCode.AGENT_VERSION_MISMATCH,
                f"the agent of cluster {cluster} was started by an older clusterd (one with "
                "no token and, on remote heads, a TCP port); this daemon will not use it",
                f"re-launch to upgrade it: clusterctl launch -c {cluster}",
            )
        target = head_target(runtime)
        if target is None:
            endpoint = runtime.get("agent_endpoint")
            if not endpoint:
                raise ProtocolError(
                    ErrorCode.AGENT_UNREACHABLE, f"cluster {cluster} has no agent recorded",
                    f"re-launch it: clusterctl launch -c {cluster}",
                )
            return str(endpoint)
        remote = runtime.get("agent_socket")
        if not remote:
            raise ProtocolError(
                ErrorCode.AGENT_UNREACHABLE,
                f"cluster {cluster} has no agent socket recorded (its start was interrupted)",
                f"re-launch it: clusterctl launch -c {cluster}",
            )
        before = self.tunnels.describe(cluster)
        endpoint = await self.tunnels.ensure(cluster, cloud_name, target, str(remote))
        after = self.tunnels.describe(cluster)
        if self._on_tunnel is not None and (before or {}).get("opened_at") != (after or {}).get(
                "opened_at"):
            await self._on_tunnel(cluster, after)
        return endpoint

    async def client(self, record: ClusterRecord) -> AgentClient:
        runtime = (record.handle or {}).get("runtime") or {}
        endpoint = await self.endpoint(record.name, record.cloud_name, runtime)
        return await self._agents.get(record.name, endpoint, str(runtime["agent_token"]))

    async def close(self, cluster: str, grace_s: float | None = None) -> None:
        """Close the agent client, then the tunnel under it."""
        await self._agents.close(cluster, grace_s)
        if self.tunnels.describe(cluster) is not None:
            await self.tunnels.close(cluster)
            if self._on_tunnel is not None:
                await self._on_tunnel(cluster, None)

    async def reset(self, cluster: str) -> None:
        """After a failure: drop the client (the tunnel is checked again on next use)."""
        await self._agents.close(cluster)

    async def close_all(self) -> None:
        await self._agents.close_all()
        await self.tunnels.close_all()
