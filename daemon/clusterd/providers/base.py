"""The provider interface: one typed Protocol, implemented once per provider module.

A provider creates, queries, stops, starts and terminates a cluster's nodes and says how to
reach them. It knows nothing of Ray, the agent or jobs (the runtime layer does that), and it
translates its library's errors into `ProvisionError` in one place (`classify`), so the launch
and failover code only ever sees those.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any, ClassVar, Protocol

from clusterctl.protocol import ErrorCode, ProtocolError
from clusterd.tasks.spec import Resources


class NodeStatus(enum.StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    STOPPING = "stopping"
    STOPPED = "stopped"
    UNREACHABLE = "unreachable"  # exists, as far as we know, but does not answer


class BlockScope(enum.StrEnum):
    """What a provisioning failure rules out for the rest of this launch."""

    ZONE = "zone"
    REGION = "region"
    PROVIDER = "provider"
    FATAL = "fatal"  # no other placement can help (bad credentials, bad request)


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where a cluster could go, and what each of its nodes would have."""

    provider: str
    region: str | None
    zone: str | None
    instance_type: str | None
    cpus: float
    memory_gb: float
    accelerator: str | None = None
    accelerator_count: float = 0
    price_per_hour: float = 0.0

    def describe(self) -> str:
        where = "/".join(p for p in (self.provider, self.region, self.zone) if p)
        return f"{where} ({self.instance_type})" if self.instance_type else where

    def resources_view(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class ClusterRequest:
    name: str  # the user's name for it
    cloud_name: str  # the provider's name for it, unique and recorded before create
    num_nodes: int
    resources: Resources


@dataclasses.dataclass(frozen=True)
class SSHTarget:
    host: str
    port: int
    user: str
    identity_file: str | None = None

    @classmethod
    def from_handle(cls, host: dict[str, Any]) -> SSHTarget:
        """A host as a cluster's handle records it (other keys, such as cpus, are ignored)."""
        return cls(host["host"], int(host["port"]), host["user"], host.get("identity_file"))

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


@dataclasses.dataclass(frozen=True)
class ClusterInfo:
    nodes: tuple[NodeInfo, ...]  # the head first

    @property
    def head(self) -> NodeInfo:
        return self.nodes[0]


class ProvisionError(ProtocolError):
    def __init__(self, message: str, scope: BlockScope, hint: str = "") -> None:
        code = ErrorCode.RESOURCES_UNAVAILABLE if scope != BlockScope.FATAL else (
            ErrorCode.PROVIDER_ERROR)
        super().__init__(code, message, hint)
        self.scope = scope


class Provider(Protocol):
    """One provider. Methods are idempotent by `cloud_name` where the text says so, must not
    block the event loop, and raise only ProvisionError (or ProtocolError for bad input)."""

    name: ClassVar[str]
    # False for machines we do not own (ssh): stop is refused, autostop must tear down.
    can_stop: ClassVar[bool]
    # True only for the test provider: its clusters run no agent, so their status is the
    # provider's word alone.
    agentless: ClassVar[bool] = False

    async def placements(self, request: ClusterRequest) -> list[Placement]:
        """Feasible placements for the request, cheapest first; empty if none could work.
        Raises ProvisionError(FATAL) with the reason when the request can never fit."""
        ...

    async def create(self, request: ClusterRequest, placement: Placement) -> dict[str, Any]:
        """Create (or find, if they exist) the cluster's nodes; returns the provider's handle,
        which the daemon stores and passes back to every other call. Idempotent."""
        ...

    async def wait(self, cloud_name: str, handle: dict[str, Any], timeout_s: float) -> None:
        """Return once every node is running."""
        ...

    async def query(self, cloud_name: str, handle: dict[str, Any]) -> list[NodeInfo]:
        """The nodes that exist now, with their states; empty if the cluster is gone."""
        ...

    async def query_many(
        self, clusters: list[tuple[str, dict[str, Any]]]
    ) -> dict[str, list[NodeInfo] | ProvisionError]:
        """`query` for many clusters at once (by cloud name), in as few calls to the
        provider as it allows; a cluster whose query failed maps to its error."""
        ...

    async def cluster_info(self, cloud_name: str, handle: dict[str, Any]) -> ClusterInfo:
        """How to reach every node, head first."""
        ...

    async def stop(self, cloud_name: str, handle: dict[str, Any]) -> None: ...

    async def start(self, cloud_name: str, handle: dict[str, Any]) -> dict[str, Any]:
        """Start stopped nodes; returns the (possibly changed) handle."""
        ...

    async def terminate(self, cloud_name: str, handle: dict[str, Any]) -> None:
        """Remove every node and per-cluster resource. Idempotent: gone is success."""
        ...

    async def open_ports(self, cloud_name: str, handle: dict[str, Any],
                         ports: tuple[str, ...]) -> None: ...

    async def cleanup_ports(self, cloud_name: str, handle: dict[str, Any]) -> None: ...

    def classify(self, error: BaseException) -> ProvisionError:
        """Map this provider's library errors to what they rule out."""
        ...
