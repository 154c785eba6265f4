"""What the daemon keeps of a cluster beyond its record's plain columns, as typed data: where a
launch is creating it, the provider's handle, what the runtime started, and its agent tunnel.

Stored as one JSON object in the record's `handle` column. The JSON is made and read here and
in state/clusters.py only (`to_json`/`from_json`); everywhere else these are dataclasses, so
mypy checks every use. Reading is forgiving as the format has always been: a key an older
clusterd did not write takes its default, a key this one does not know is ignored.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from clusterd.nodes import SSHTarget
from clusterd.providers.base import Placement, ProviderHandle
from clusterd.ssh.tunnels import TunnelState
from clusterd.state.resources import load_placement, placement_json


@dataclasses.dataclass(frozen=True)
class RuntimeHandle:
    """What the runtime started on a cluster's nodes (Ray on its ports, the agent) and how to
    reach the agent: on this machine by its socket (`agent_endpoint`), or through a tunnel to
    the head (`head_ssh`, `agent_socket`)."""

    ports: dict[str, int] = dataclasses.field(default_factory=dict)  # the head's Ray ports
    # Each worker's Ray ports, by its node id.
    worker_ports: dict[str, dict[str, int]] = dataclasses.field(default_factory=dict)
    ray_address: str | None = None  # the head's GCS, host:port
    agent_listen: str | None = None  # where the agent was told to listen (unix:PATH)
    # None: an agent started by an older clusterd, which had no token (never used).
    agent_token: str | None = None
    agent_endpoint: str | None = None  # the head is this machine: the agent's own socket
    head_ssh: SSHTarget | None = None  # the head is remote: reached by SSH...
    agent_socket: str | None = None  # ...to the agent's socket there, once it started

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"ports": self.ports, "worker_ports": self.worker_ports,
                                "ray_address": self.ray_address,
                                "agent_listen": self.agent_listen,
                                "agent_token": self.agent_token}
        if self.agent_endpoint is not None:
            data["agent_endpoint"] = self.agent_endpoint
        if self.head_ssh is not None:
            data["head_ssh"] = self.head_ssh.to_json()
        if self.agent_socket is not None:
            data["agent_socket"] = self.agent_socket
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RuntimeHandle:
        head = data.get("head_ssh")
        return cls(
            ports=dict(data.get("ports") or {}),
            worker_ports={k: dict(v) for k, v in (data.get("worker_ports") or {}).items()},
            ray_address=data.get("ray_address"),
            agent_listen=data.get("agent_listen"),
            agent_token=data.get("agent_token"),
            agent_endpoint=data.get("agent_endpoint"),
            head_ssh=SSHTarget.from_json(head) if head else None,
            agent_socket=data.get("agent_socket"),
        )


@dataclasses.dataclass(frozen=True)
class ClusterHandle:
    """Everything the daemon knows of where a cluster is and what runs there, beyond its
    record's columns. Replaced whole, never changed in place (records are shared)."""

    # Where a launch attempt is creating the nodes, written before the provider's create
    # call: until the runtime first starts, it is where anything of the cluster can exist.
    intent: Placement | None = None
    # The intent's create token (ClusterRequest.create_token), written with it: a launch
    # resumed at the intent hands it to the create again, which then knows its own nodes.
    create_token: str | None = None
    # The provider's handle, from its create call (None: it has not answered one yet), of
    # the type that provider registered for its handles.
    provider: ProviderHandle | None = None
    runtime: RuntimeHandle | None = None  # once the runtime's start began
    tunnel: TunnelState | None = None  # the agent tunnel, as last described

    def to_json(self) -> dict[str, Any] | None:
        """The column's JSON object (None, a NULL column, when there is nothing to keep)."""
        data: dict[str, Any] = {}
        if self.intent is not None:
            data["intent"] = placement_json(self.intent)
        if self.create_token is not None:
            data["create_token"] = self.create_token
        if self.provider is not None:
            data["provider"] = self.provider.to_json()
        if self.runtime is not None:
            data["runtime"] = self.runtime.to_json()
        if self.tunnel is not None:
            data["tunnel"] = self.tunnel.to_json()
        return data or None

    @classmethod
    def from_json(cls, data: dict[str, Any] | None, provider: str) -> ClusterHandle:
        """The handle of a record of `provider`'s (whose handle type reads its part)."""
        data = data or {}
        intent, runtime, tunnel = data.get("intent"), data.get("runtime"), data.get("tunnel")
        recorded = data.get("provider")
        return cls(
            intent=load_placement(intent),
            create_token=data.get("create_token"),
            provider=ProviderHandle.decode(provider, recorded) if recorded else None,
            runtime=RuntimeHandle.from_json(runtime) if runtime else None,
            tunnel=TunnelState.from_json(tunnel) if tunnel else None,
        )
