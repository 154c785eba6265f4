"""A cluster's nodes as every layer speaks of them: how one is reached (`SSHTarget`), what
state it is in, and the head-first list a provider reports (`ClusterInfo`).

The SSH layer, the providers, the runtime and the services all import this module, and it
imports none of them: the arrows point down to it.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any


class NodeStatus(enum.StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    STOPPING = "stopping"
    STOPPED = "stopped"
    UNREACHABLE = "unreachable"  # exists, as far as we know, but does not answer
    # Gone for good (a cloud keeps terminated instances listed for a while, with the reason).
    TERMINATED = "terminated"


@dataclasses.dataclass(frozen=True)
class SSHTarget:
    host: str
    port: int
    user: str
    identity_file: str | None = None
    # Names the host's key instead of its address (a cloud instance: addresses are reused by
    # other instances, and may change when it starts again).
    host_key_alias: str | None = None
    proxy_command: str | None = None
    # Refuse a host key that is not known already (ssh_node_pools.yaml's
    # strict_host_key_checking). Not part of the host's identity: a pool may change it.
    strict_host_keys: bool = dataclasses.field(default=False, compare=False)

    def to_json(self) -> dict[str, Any]:
        """As a cluster's handle records it (see state/)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, host: dict[str, Any]) -> SSHTarget:
        """A host as a cluster's handle records it (other keys, such as cpus, are ignored)."""
        return cls(host["host"], int(host["port"]), host["user"], host.get("identity_file"),
                   host.get("host_key_alias"), host.get("proxy_command"),
                   bool(host.get("strict_host_keys", False)))

    @property
    def key_name(self) -> str:
        """What the host's pinned key is filed under."""
        return self.host_key_alias or self.host

    def __str__(self) -> str:
        return f"{self.user}@{self.host}:{self.port}"


@dataclasses.dataclass(frozen=True)
class NodeInfo:
    node_id: str
    internal_ip: str
    status: NodeStatus
    ssh: SSHTarget | None = None  # None: this machine, reached without SSH
    # Where this cluster's runtime lives on the node (pid files, agent state, Ray token).
    runtime_dir: str = "~/.clusterd/runtime"
    # Where the task's workdir is synced and its scripts run (SkyPilot's ~/sky_workdir).
    workdir: str = "~/sky_workdir"
    cpus: float = 0
    gpus: float = 0
    reason: str = ""  # the provider's word on its state (a cloud's state reason), if any
    # Its address from outside its network, where it has one apart from internal_ip (an EC2
    # instance's public IP): what `status --ip` and `--endpoints` show.
    external_ip: str = ""
    image: str = ""  # the machine image it runs, where the provider knows it (for messages)
    # A VM booted from an image that may lack the GPU driver (not a pod, whose GPUs come with
    # the device plugin's driver): the runtime checks the driver before Ray counts the GPUs.
    check_gpu_driver: bool = False
    # The provider's own clock on the node's life, in epoch seconds, where its API says
    # (None where it does not: ssh, local): when it last started running (EC2's LaunchTime,
    # which a start after a stop moves; a pod's startTime), and when it stopped or was
    # terminated (EC2's StateTransitionReason; a pod's container finishedAt). The cost
    # ledger dates a change it finds after a gap (a daemon that was down) by them.
    launched_at: float | None = None
    stopped_at: float | None = None


@dataclasses.dataclass(frozen=True)
class ClusterInfo:
    nodes: tuple[NodeInfo, ...]  # the head first
    # The agent's own autostop ends by shutting the nodes' OS down (cloud VMs, where that
    # stops or terminates the instance), not only by stopping Ray.
    shutdown_to_stop: bool = False

    @property
    def head(self) -> NodeInfo:
        return self.nodes[0]
