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
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Protocol, Self, TypeVar

import anyio
import anyio.abc

from clusterctl.protocol import ErrorCode, ProtocolError
from clusterd.config import Settings
from clusterd.nodes import ClusterInfo, NodeInfo, SSHTarget
from clusterd.tasks.spec import Resources

if TYPE_CHECKING:
    from clusterd.ssh.connections import SSHConnections
    from clusterd.user_config import UserConfig


class BlockScope(enum.StrEnum):
    """What a provisioning failure rules out for the rest of this launch."""

    # This placement only (its shape, where it is): the same place may still take another
    # shape (Kubernetes: a pod the scheduler cannot place now, while a smaller one fits).
    PLACEMENT = "placement"
    ZONE = "zone"
    REGION = "region"
    PROVIDER = "provider"
    FATAL = "fatal"  # no other placement can help (bad credentials, bad request)


def infra_label(*parts: str | None) -> str:
    """Where something is, as `provider/region/zone`, leaving out the parts not known (or
    that it does not have: an ssh pool has no zone)."""
    return "/".join(p for p in parts if p)


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

    @property
    def infra(self) -> str:
        return infra_label(self.provider, self.region, self.zone)

    def describe(self) -> str:
        return f"{self.infra} ({self.instance_type})" if self.instance_type else self.infra


@dataclasses.dataclass(frozen=True)
class ClusterRequest:
    name: str  # the user's name for it
    cloud_name: str  # the provider's name for it, unique and recorded before create
    num_nodes: int
    resources: Resources
    # When nodes stop themselves (autostop with no daemon about): tear down, not stop.
    autostop_down: bool = False
    # A secret of this create attempt, on disk before the create call (kept by a resumed
    # one): what the create marks its resources with, so that finding one of their names
    # taken it adopts only what it made itself, never what someone planted under that name.
    create_token: str = ""
    # What the cluster had before this attempt (a repair): its surviving nodes are ours.
    previous: ProviderHandle | None = None


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
        where = infra_label(self.provider, self.region)
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


class ProviderHandle:
    """A provider's handle of a cluster: what its create call answers and every other call
    is given back (instance ids, the hosts it holds, ...).

    Each provider has a frozen dataclass of its own, declared with the provider's name
    (`class AWSHandle(ProviderHandle, provider="aws")`), which registers it: the state store
    reads a record's handle back into its provider's type by the record's provider name
    (`decode`) without importing any provider. Only state/ calls `to_json`/`from_json`."""

    _types: ClassVar[dict[str, type[ProviderHandle]]] = {}

    def __init_subclass__(cls, *, provider: str | None = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if provider is None:
            return
        known = ProviderHandle._types.get(provider)
        if known is not None and (known.__module__, known.__qualname__) != (
                cls.__module__, cls.__qualname__):
            raise TypeError(f"{known.__qualname__} is the {provider} provider's handle already")
        ProviderHandle._types[provider] = cls

    @staticmethod
    def decode(provider: str, data: dict[str, Any]) -> ProviderHandle:
        """A recorded handle, as the type `provider` registered; the handle of a provider
        this clusterd does not have is kept as it was read (RawHandle)."""
        cls = ProviderHandle._types.get(provider)
        return cls.from_json(data) if cls is not None else RawHandle(data)

    def to_json(self) -> dict[str, Any]:
        raise NotImplementedError

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Self:
        raise NotImplementedError

    def held_hosts(self) -> tuple[SSHTarget, ...]:
        """The machines the cluster holds by address (an ssh pool's hosts), which no other
        cluster may take, and which `status -v` lists; none where the provider makes its
        nodes."""
        return ()


@dataclasses.dataclass(frozen=True)
class RawHandle(ProviderHandle):
    """The handle of a provider this clusterd does not have (a record written by another
    build): kept as read and written back unchanged; no provider is ever given it."""

    data: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        return self.data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RawHandle:
        return cls(data)


H = TypeVar("H", bound=ProviderHandle)


# Told what of another clusterd's was found under a cluster's name and left alone: the cloud
# name, and a sentence for the user.
ForeignReport = Callable[[str, str], Awaitable[None]]


@dataclasses.dataclass(frozen=True)
class ProviderContext:
    """What the daemon gives a provider class to build its one instance with (`build`): each
    provider takes what it needs and leaves the rest."""

    state_dir: Path  # the daemon's own state; a provider keeps its files under it
    runtime_dir: Path  # the daemon's private run-time files (sockets), gone with the daemon
    config_dir: Path  # the user's configuration (ssh_node_pools.yaml lives here)
    connections: SSHConnections  # the daemon's SSH connections, one per node
    config: Callable[[], UserConfig]  # the user's config file, as it is now
    daemon_id: str  # what this daemon tags its cloud resources with
    # (cluster name, provider handle) of every recorded cluster of the provider named that
    # has a handle, oldest first.
    recorded: Callable[[str], list[tuple[str, ProviderHandle]]]
    settings: Settings  # the daemon's settings (a provider's own: catalog_dir, ...)
    on_foreign: ForeignReport | None = None
    # A line for the user of the request being served, if any (a call waiting out the cloud's
    # throttling, say): (message, phase).
    on_progress: Callable[[str, str], Awaitable[None]] | None = None
    # (cloud name, text): a step of a provider's own worth the user's eyes (a progress line
    # of the request in flight, and an event of the cluster), e.g. "waiting for the
    # autoscaler".
    on_note: ForeignReport | None = None


class ProvisionError(ProtocolError):
    def __init__(self, message: str, scope: BlockScope, hint: str = "", *,
                 throttled: bool = False) -> None:
        code = ErrorCode.RESOURCES_UNAVAILABLE if scope != BlockScope.FATAL else (
            ErrorCode.PROVIDER_ERROR)
        super().__init__(code, message, hint)
        self.scope = scope
        # The provider limited this account's request rate (after riding it out call by
        # call): no lack of capacity, and every controller meets it at once
        # (control/retry.py spreads their retries out).
        self.throttled = throttled


class AcceleratorCatalog(Protocol):
    """What `show-gpus` reads of a provider's catalog."""

    def accelerator_rows(self, name: str | None = None) -> list[dict[str, object]]:
        """One row per instance type with an accelerator (of `name` only, if given): the
        accelerator, its count, the machine, prices and regions."""
        ...

    def accelerator_names(self) -> list[str]:
        """Every accelerator the catalog knows."""
        ...


class ProviderOf(Protocol[H]):
    """One provider, whose handles are of type H. Methods are idempotent by `cloud_name`
    where the text says so, must not block the event loop, and raise only ProvisionError (or
    ProtocolError for bad input).

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
    # False for machines we do not own (ssh) and for pods: stop is refused, autostop must
    # tear down.
    can_stop: ClassVar[bool]
    # True where nodes that cannot stop are torn down by an autostop that did not say --down
    # (kubernetes, as SkyPilot); else such an autostop is refused (ssh: the user's machines).
    autostop_tears_down: ClassVar[bool] = False
    # True only for the test provider: its clusters run no agent, so their status is the
    # provider's word alone.
    agentless: ClassVar[bool] = False
    # True where a node's OS shutting down stops (or terminates) it, so the agent's own
    # autostop ends by shutting its nodes down (cloud VMs).
    stops_by_shutdown: ClassVar[bool] = False
    # True where terminating a cluster's nodes takes everything on them along (cloud VMs and
    # their disks, pods): a teardown that discards a lost cluster need not reach its nodes.
    terminate_discards_nodes: ClassVar[bool] = False
    # True where `query` dates nodes by the provider's own clock (NodeInfo.launched_at,
    # stopped_at: EC2, pods): stop and down then ask it when the nodes went, for the ledger.
    keeps_node_times: ClassVar[bool] = False

    @classmethod
    def build(cls, context: ProviderContext) -> Self:
        """The daemon's one instance of this provider (see providers/offered.py). Cheap: no
        calls to remote APIs."""
        ...

    async def placements(self, request: ClusterRequest) -> list[Placement]:
        """Feasible placements for the request, cheapest first; empty if none could work.
        Raises ProvisionError(FATAL) with the reason when the request can never fit."""
        ...

    async def create(self, request: ClusterRequest, placement: Placement) -> H:
        """Create (or find, if they exist) the cluster's nodes; returns the provider's handle,
        which the daemon stores and passes back to every other call. Idempotent."""
        ...

    def handle_for_intent(self, cloud_name: str, intent: Placement | None) -> H:
        """The handle of a cluster whose create call has not answered (a launch failed or
        was killed around it): no nodes recorded, and where the launch was creating them
        (`intent`), if known. Enough to look for (query), remove (terminate) and clean up
        after (cleanup_ports) whatever it may have made there."""
        ...

    async def wait(self, cloud_name: str, handle: H, timeout_s: float) -> H:
        """Return once every node is running and reachable, with the handle as it is now
        (addresses may only be known once the nodes run)."""
        ...

    async def query(self, cloud_name: str, handle: H) -> list[NodeInfo]:
        """The nodes that exist now, with their states; empty if the cluster is gone."""
        ...

    async def query_many(
        self, clusters: list[tuple[str, H]]
    ) -> dict[str, list[NodeInfo] | ProvisionError]:
        """`query` for many clusters at once (by cloud name), in as few calls to the
        provider as it allows; a cluster whose query failed maps to its error."""
        ...

    async def cluster_info(self, cloud_name: str, handle: H) -> ClusterInfo:
        """How to reach every node, head first."""
        ...

    async def stop(self, cloud_name: str, handle: H) -> None: ...

    async def start(self, cloud_name: str, handle: H) -> H:
        """Start stopped nodes; returns the (possibly changed) handle."""
        ...

    async def terminate(self, cloud_name: str, handle: H) -> None:
        """Remove every node and per-cluster resource. Idempotent: gone is success."""
        ...

    async def open_ports(self, cloud_name: str, handle: H,
                         ports: tuple[str, ...]) -> None: ...

    async def cleanup_ports(self, cloud_name: str, handle: H) -> None: ...

    async def apply_autostop(self, cloud_name: str, handle: H,
                             down: bool | None) -> None:
        """The cluster's autostop setting changed (None: cancelled): prepare the nodes for
        stopping themselves (`down`: terminate rather than stop). Most have nothing to do."""
        ...

    async def grant_buckets(self, cloud_name: str, handle: H,
                            buckets: tuple[str, ...]) -> bool:
        """Let the cluster's nodes use these S3 buckets by the provider's own means (an
        instance profile); True if it did, False if it has none (nodes then get the user's
        credentials, sent to that cluster only)."""
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

    async def accelerators(self) -> AcceleratorCatalog | None:
        """The catalog `show-gpus` lists this provider's accelerators from; None where it has
        none (machines that are what they are). Kubernetes reads it from the clusters' nodes
        (what each has, and what is free now). Raises ProtocolError for a catalog that
        cannot be read."""
        ...

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
                  ) -> None:
        """Work the provider keeps up for the daemon's lifetime, in the daemon's root task
        group (kubernetes: the port-forwards to its pods); `task_status.started()` once it
        serves. Most have none, and return at once."""
        ...

    async def aclose(self) -> None:
        """Release clients and connections (the daemon is stopping)."""
        ...

    async def orphans(self, known: Callable[[], set[str]]) -> list[Orphan]:
        """Clusters this daemon made here that no record names: `known` gives the cloud
        names of every record, asked after the provider was (a launch records its cluster
        before creating anything, so nothing new is taken for an orphan)."""
        ...

    async def remove_orphan(self, orphan: Orphan) -> None:
        """Remove what `orphans` reported: its nodes, then what was around them."""
        ...


# A provider as the services hold it: whichever it is, given its own handles. (A record's
# handle is read back by its provider's name, so the handle a service hands a provider is
# that provider's; the registry is where the types cannot say so.)
Provider = ProviderOf[ProviderHandle]


class ProviderDefaults(Generic[H]):
    """What a provider with no cloud resources of its own does for the optional operations:
    nothing. Providers inherit it and override what applies to them."""

    name: ClassVar[str]
    agentless: ClassVar[bool] = False
    stops_by_shutdown: ClassVar[bool] = False
    autostop_tears_down: ClassVar[bool] = False
    terminate_discards_nodes: ClassVar[bool] = False
    keeps_node_times: ClassVar[bool] = False
    honoured_fields: ClassVar[frozenset[str]] = frozenset()
    check_top_level: ClassVar[tuple[str, ...]] = ()

    async def accelerators(self) -> AcceleratorCatalog | None:
        return None

    async def wait(self, cloud_name: str, handle: H, timeout_s: float) -> H:
        return handle  # the nodes were running before we came

    async def open_ports(self, cloud_name: str, handle: H, ports: tuple[str, ...]) -> None:
        return None  # no firewall of ours in front of the nodes

    async def cleanup_ports(self, cloud_name: str, handle: H) -> None:
        return None

    async def apply_autostop(self, cloud_name: str, handle: H, down: bool | None) -> None:
        return None

    async def grant_buckets(self, cloud_name: str, handle: H,
                            buckets: tuple[str, ...]) -> bool:
        return False  # no identity of the provider's own on the nodes

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
                  ) -> None:
        task_status.started()

    async def aclose(self) -> None:
        return None

    async def orphans(self, known: Callable[[], set[str]]) -> list[Orphan]:
        return []  # nothing made here that could outlive a record

    async def remove_orphan(self, orphan: Orphan) -> None:
        raise ProtocolError(ErrorCode.UNSUPPORTED,
                            f"the {self.name} provider reports no orphans to remove")
