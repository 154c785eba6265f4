"""Tunnels to agents: per cluster, a local Unix socket forwarded to the agent's Unix socket on
the head node (an SSH stream-local forward), over the daemon's SSH connection to the head.

Unix sockets at both ends, each in a 0700 directory of its user: no TCP port, here or on the
head, that another user could reach. One tunnel per cluster, however many requests ask at
once; reopened when its connection has died; closed on stop, down and daemon shutdown.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from pathlib import Path
from typing import Any

import anyio
import asyncssh

from clusterctl._private import ensure_private_dir
from clusterctl.protocol import ErrorCode, ProtocolError
from clusterd import log
from clusterd.nodes import SSHTarget
from clusterd.ssh.connections import NodeConnection, SSHConnections
from clusterd.ssh.errors import mapped

logger = log.get("clusterd.tunnels")


@dataclasses.dataclass(frozen=True)
class TunnelState:
    """A tunnel as last described: what `status -v` shows, and the cluster's record keeps."""

    socket: str  # the local end
    head: str  # the head, as user@host:port
    remote: str  # the agent's socket on the head
    alive: bool
    opened_at: float
    reopened: int  # times it was opened again after its connection died

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TunnelState:
        return cls(str(data.get("socket", "")), str(data.get("head", "")),
                   str(data.get("remote", "")), bool(data.get("alive", False)),
                   data.get("opened_at", 0.0), data.get("reopened", 0))


@dataclasses.dataclass
class Tunnel:
    cluster: str
    path: Path
    target: SSHTarget
    remote_path: str
    node: NodeConnection
    listener: asyncssh.SSHListener
    opened_at: float
    reopened: int = 0

    @property
    def alive(self) -> bool:
        return self.node.alive and self.path.exists()

    def describe(self) -> TunnelState:
        return TunnelState(str(self.path), str(self.target), self.remote_path, self.alive,
                           self.opened_at, self.reopened)


class TunnelManager:
    def __init__(self, connections: SSHConnections, socket_dir: Path) -> None:
        self._connections = connections
        self._socket_dir = socket_dir
        self._tunnels: dict[str, Tunnel] = {}
        self._locks: dict[str, anyio.Lock] = {}
        self._reopens: dict[str, int] = {}

    def path_for(self, cloud_name: str) -> Path:
        return self._socket_dir / f"{cloud_name}.sock"

    def describe(self, cluster: str) -> TunnelState | None:
        tunnel = self._tunnels.get(cluster)
        return tunnel.describe() if tunnel else None

    async def ensure(self, cluster: str, cloud_name: str, target: SSHTarget,
                     remote_path: str) -> str:
        """A live tunnel's endpoint (`unix:PATH`), opening or reopening it as needed."""
        tunnel = self._tunnels.get(cluster)
        if tunnel is not None and tunnel.alive and tunnel.remote_path == remote_path:
            return f"unix:{tunnel.path}"
        lock = self._locks.setdefault(cluster, anyio.Lock())
        async with lock:
            tunnel = self._tunnels.get(cluster)
            if tunnel is not None and tunnel.alive and tunnel.remote_path == remote_path:
                return f"unix:{tunnel.path}"
            if tunnel is not None:
                await self.close(cluster)
                self._reopens[cluster] = self._reopens.get(cluster, 0) + 1
            tunnel = await self._open(cluster, cloud_name, target, remote_path)
            self._tunnels[cluster] = tunnel
            return f"unix:{tunnel.path}"

    async def _open(self, cluster: str, cloud_name: str, target: SSHTarget,
                    remote_path: str) -> Tunnel:
        ensure_private_dir(str(self._socket_dir))
        path = self.path_for(cloud_name)
        path.unlink(missing_ok=True)
        node = await self._connections.get(target)
        def unreachable(exc: BaseException) -> ProtocolError:
            return ProtocolError(
                ErrorCode.AGENT_UNREACHABLE,
                f"cannot open a tunnel to the agent of {cluster}: {exc}",
                f"`clusterctl launch -c {cluster}` repairs the runtime",
            )

        async with mapped(unreachable, drop=lambda: self._connections.drop(target)):
            listener = await node.conn.forward_local_path(str(path), remote_path)
        os.chmod(path, 0o600)
        logger.info("tunnel opened", cluster=cluster, socket=str(path), remote=remote_path)
        return Tunnel(cluster, path, target, remote_path, node, listener, time.time(),
                      self._reopens.get(cluster, 0))

    async def close(self, cluster: str) -> None:
        """Close the cluster's tunnel; a failure to close is only worth a warning."""
        tunnel = self._tunnels.pop(cluster, None)
        lock = self._locks.get(cluster)
        if lock is not None and not lock.locked():  # not mid-reopen: forget the cluster
            del self._locks[cluster]
            self._reopens.pop(cluster, None)
        if tunnel is None:
            return
        try:
            tunnel.listener.close()
            with anyio.move_on_after(5, shield=True):
                await tunnel.listener.wait_closed()
        except Exception as exc:
            logger.warning("closing a tunnel failed", cluster=cluster, error=str(exc))
        with contextlib.suppress(OSError):
            tunnel.path.unlink(missing_ok=True)
        logger.info("tunnel closed", cluster=cluster)

    async def close_all(self) -> None:
        for cluster in list(self._tunnels):
            await self.close(cluster)
