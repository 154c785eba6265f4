"""The provider interface: one typed Protocol, implemented once per provider module.

A provider creates, queries, stops, starts and terminates a cluster's nodes and says how to
reach them. It knows nothing of Ray, the agent or jobs (the runtime layer does that), and it
translates its library's errors into `ProvisionError` (with the `BlockScope` a failure rules
out) at one choke point of its own (aws: every EC2 call through `aws/ec2.py`, mapped by
`aws/errors.py`), so the launch and failover code only ever sees those.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, Self

from clusterctl.protocol import ErrorCode, ProtocolError
from clusterd.nodes import ClusterInfo, NodeInfo
from clusterd.tasks.spec import Resources

if TYPE_CHECKING:
    from clusterd.ssh.connections import SSHConnections
    from clusterd.user_config import UserConfig


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
    price_per_hour: float = 0.0  # per node
    spot: bool = False

    def describe(self) -> str:
        where = "/".join(p for p in (self.provider, self.region, self.zone) if p)
        return f"{where} ({self.instance_type})" if self.instance_type else where

    def resources_view(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_view(cls, view: dict[str, Any]) -> Placement:
        """A placement from its `resources_view` (keys it does not have are ignored)."""
        return cls(**{k: v for k, v in view.items() if k in _PLACEMENT_FIELDS})


_PLACEMENT_FIELDS = frozenset(f.name for f in dataclasses.fields(Placement))


@dataclasses.dataclass(frozen=True)
class ClusterRequest:
    name: str  # the user's name for it
    cloud_name: str  # the provider's name for it, unique and recorded before create
    num_nodes: int
    resources: Resources
    # When nodes stop themselves (autostop with no daemon about): tear down, not stop.
    autostop_down: bool = False


@dataclasses.dataclass(frozen=True)
class Orphan:
    """What this daemon made on a provider that no record names (a record lost with a disk,
    a state directory copied from another machine): found, reported, never removed unasked."""

    provider: str
    region: str | None
    cloud_name: str
    instances: tuple[str, ...]  # still there (not terminated)
    groups: tuple[str, ...] = ()  # per-cluster resources left behind (security groups)

    def describe(self) -> str:
        where = "/".join(p for p in (self.provider, self.region) if p)
        parts = []
        if self.instances:
            parts.append(f"{len(self.instances)} instance(s)")
        if self.groups:
            parts.append(f"{len(self.groups)} security group(s)")
        return f"{where}: {' and '.join(parts)} of {self.cloud_name}"

    def to_wire(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "instances": list(self.instances),
                "groups": list(self.groups), "remove": f"clusterctl down --orphan "
                                                      f"{self.cloud_name}"}


# Told what of another clusterd's was found under a cluster's name and left alone: the cloud
# name, and a sentence for the user.
ForeignReport = Callable[[str, str], Awaitable[None]]


@dataclasses.dataclass(frozen=True)
class ProviderContext:
    """What the daemon gives a provider class to build its one instance with (`build`): each
    provider takes what it needs and leaves the rest."""

    state_dir: Path  # the daemon's own state; a provider keeps its files under it
    config_dir: Path  # the user's configuration (ssh_node_pools.yaml lives here)
    connections: SSHConnections  # the daemon's SSH connections, one per node
    config: Callable[[], UserConfig]  # the user's config file, as it is now
    daemon_id: str  # what this daemon tags its cloud resources with
    # (cluster name, provider handle) of every recorded cluster of the provider named that
    # has a handle, oldest first.
    recorded: Callable[[str], list[tuple[str, dict[str, Any]]]]
    on_foreign: ForeignReport | None = None


class ProvisionError(ProtocolError):
    def __init__(self, message: str, scope: BlockScope, hint: str = "") -> None:
        code = ErrorCode.RESOURCES_UNAVAILABLE if scope != BlockScope.FATAL else (
            ErrorCode.PROVIDER_ERROR)
        super().__init__(code, message, hint)
        self.scope = scope


class AcceleratorCatalog(Protocol):
    """What `show-gpus` reads of a provider's catalog."""

    def accelerator_rows(self, name: str | None = None) -> list[dict[str, object]]:
        """One row per instance type with an accelerator (of `name` only, if given): the
        accelerator, its count, the machine, prices and regions."""
        ...

    def accelerator_names(self) -> list[str]:
        """Every accelerator the catalog knows."""
        ...


class Provider(Protocol):
    """One provider. Methods are idempotent by `cloud_name` where the text says so, must not
    block the event loop, and raise only ProvisionError (or ProtocolError for bad input).

    Everything the daemon knows of a provider it asks here: a new provider is its own package
    and one line in providers/offered.py, and no other module names it (but user_config.py,
    for a section of the config file of its own)."""

    name: ClassVar[str]
    # What SkyPilot calls it: the `cloud` of SKYPILOT_CLUSTER_INFO ("AWS", "SSH", "Local").
    skypilot_cloud: ClassVar[str]
    # The task fields that only some providers honour (tasks/fields.py, Support.SOME) that this
    # one does. Elsewhere each is refused or warned of, as its row in the table says.
    honoured_fields: ClassVar[frozenset[str]]
    # Keys of its `check` answer that the `check` reply carries at its top level instead
    # (ssh: the pools file and every pool's hosts, which clusterctl draws as a table).
    check_top_level: ClassVar[tuple[str, ...]]
    # False for machines we do not own (ssh): stop is refused, autostop must tear down.
    can_stop: ClassVar[bool]
    # True only for the test provider: its clusters run no agent, so their status is the
    # provider's word alone.
    agentless: ClassVar[bool] = False
    # True where a node's OS shutting down stops (or terminates) it, so the agent's own
    # autostop ends by shutting its nodes down (cloud VMs).
    stops_by_shutdown: ClassVar[bool] = False

    @classmethod
    def build(cls, context: ProviderContext) -> Self:
        """The daemon's one instance of this provider (see providers/offered.py). Cheap: no
        calls to remote APIs."""
        ...

    async def placements(self, request: ClusterRequest) -> list[Placement]:
        """Feasible placements for the request, cheapest first; empty if none could work.
        Raises ProvisionError(FATAL) with the reason when the request can never fit."""
        ...

    async def create(self, request: ClusterRequest, placement: Placement) -> dict[str, Any]:
        """Create (or find, if they exist) the cluster's nodes; returns the provider's handle,
        which the daemon stores and passes back to every other call. Idempotent."""
        ...

    async def wait(self, cloud_name: str, handle: dict[str, Any],
                   timeout_s: float) -> dict[str, Any]:
        """Return once every node is running and reachable, with the handle as it is now
        (addresses may only be known once the nodes run)."""
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

    async def apply_autostop(self, cloud_name: str, handle: dict[str, Any],
                             down: bool | None) -> None:
        """The cluster's autostop setting changed (None: cancelled): prepare the nodes for
        stopping themselves (`down`: terminate rather than stop). Most have nothing to do."""
        ...

    async def check(self) -> dict[str, Any]:
        """Whether this provider is usable here: `ok`, a one-line `detail`, and what else it
        can tell (hosts, identity, regions). Must answer within seconds, and fast when the
        provider is not configured at all."""
        ...

    async def enabled(self) -> bool:
        """Whether a launch that names no provider should try this one: it is configured at
        all (pools defined, credentials present). Cheap: no calls to remote APIs."""
        ...

    def accelerators(self) -> AcceleratorCatalog | None:
        """The catalog `show-gpus` lists this provider's accelerators from; None where it has
        none (machines that are what they are). Raises ProtocolError for a catalog that
        cannot be read."""
        ...

    async def aclose(self) -> None:
        """Release clients and connections (the daemon is stopping)."""
        ...

    async def orphans(self, known: Callable[[], set[str]]) -> list[Orphan]:
        """Clusters this daemon made here that no record names: `known` gives the cloud
        names of every record, asked after the provider was (a launch records its cluster
        before creating anything, so nothing new is taken for an orphan)."""
        ...


class ProviderDefaults:
    """What a provider with no cloud resources of its own does for the optional operations:
    nothing. Providers inherit it and override what applies to them."""

    agentless: ClassVar[bool] = False
    stops_by_shutdown: ClassVar[bool] = False
    honoured_fields: ClassVar[frozenset[str]] = frozenset()
    check_top_level: ClassVar[tuple[str, ...]] = ()

    def accelerators(self) -> AcceleratorCatalog | None:
        return None

    async def wait(self, cloud_name: str, handle: dict[str, Any],
                   timeout_s: float) -> dict[str, Any]:
        return handle  # the nodes were running before we came

    async def open_ports(self, cloud_name: str, handle: dict[str, Any],
                         ports: tuple[str, ...]) -> None:
        return None  # no firewall of ours in front of the nodes

    async def cleanup_ports(self, cloud_name: str, handle: dict[str, Any]) -> None:
        return None

    async def apply_autostop(self, cloud_name: str, handle: dict[str, Any],
                             down: bool | None) -> None:
        return None

    async def aclose(self) -> None:
        return None

    async def orphans(self, known: Callable[[], set[str]]) -> list[Orphan]:
        return []  # nothing made here that could outlive a record
