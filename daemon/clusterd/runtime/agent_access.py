"""How the daemon reaches a cluster's agent: directly on a local Unix socket, or through an SSH
tunnel to the agent's Unix socket on the head. Everything else asks here for a client and
never cares which.

A runtime recorded by a clusterd from before agents had a token (and, on remote heads, a
private Unix socket instead of a loopback port) is reported as AGENT_VERSION_MISMATCH: a
re-launch replaces it (see services/node_runtime.py NodeRuntime.health)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from clusterctl.protocol import ErrorCode, ProtocolError
from clusterd.runtime.agent_client import AgentClient, AgentConnections
from clusterd.ssh.tunnels import TunnelManager, TunnelState
from clusterd.state.clusters import ClusterRecord
from clusterd.state.handles import RuntimeHandle

TunnelListener = Callable[[str, TunnelState | None], Awaitable[None]]


class AgentAccess:
    def __init__(self, agents: AgentConnections, tunnels: TunnelManager,
                 on_tunnel: TunnelListener | None = None) -> None:
        self._agents = agents
        self.tunnels = tunnels
        self._on_tunnel = on_tunnel

    async def endpoint(self, cluster: str, cloud_name: str,
                       runtime: RuntimeHandle | None) -> str:
        runtime, _ = _with_token(cluster, runtime)
        target = runtime.head_ssh
        if target is None:
            endpoint = runtime.agent_endpoint
            if not endpoint:
                raise ProtocolError(
                    ErrorCode.AGENT_UNREACHABLE, f"cluster {cluster} has no agent recorded",
                    f"re-launch it: clusterctl launch -c {cluster}",
                )
            return str(endpoint)
        remote = runtime.agent_socket
        if not remote:
            raise ProtocolError(
                ErrorCode.AGENT_UNREACHABLE,
                f"cluster {cluster} has no agent socket recorded (its start was interrupted)",
                f"re-launch it: clusterctl launch -c {cluster}",
            )
        before = self.tunnels.describe(cluster)
        endpoint = await self.tunnels.ensure(cluster, cloud_name, target, str(remote))
        after = self.tunnels.describe(cluster)
        if self._on_tunnel is not None and _opened_at(before) != _opened_at(after):
            await self._on_tunnel(cluster, after)
        return endpoint

    async def client(self, record: ClusterRecord) -> AgentClient:
        _, token = _with_token(record.name, record.handle.runtime)
        endpoint = await self.endpoint(record.name, record.cloud_name, record.handle.runtime)
        return await self._agents.get(record.name, endpoint, token)

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


def _with_token(cluster: str, runtime: RuntimeHandle | None) -> tuple[RuntimeHandle, str]:
    """The runtime and its agent's token, or why it cannot be used: none recorded, or one
    started by an older clusterd (no token)."""
    if runtime is None:
        raise ProtocolError(
            ErrorCode.AGENT_UNREACHABLE, f"cluster {cluster} has no agent recorded",
            f"re-launch it: clusterctl launch -c {cluster}",
        )
    if not runtime.agent_token:
        raise ProtocolError(
            ErrorCode.AGENT_VERSION_MISMATCH,
            f"the agent of cluster {cluster} was started by an older clusterd (one with "
            "no token and, on remote heads, a TCP port); this daemon will not use it",
            f"re-launch to upgrade it: clusterctl launch -c {cluster}",
        )
    return runtime, runtime.agent_token


def _opened_at(tunnel: TunnelState | None) -> float | None:
    return tunnel.opened_at if tunnel is not None else None
