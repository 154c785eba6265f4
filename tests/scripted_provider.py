"""A scripted in-memory provider and runtime, and the cluster services built on them.

`ScriptedProvider` is a whole Provider (checked by mypy against ProviderOf) whose clusters are
rows in memory: a test tells it to fail a zone with a scope (`fail`), to take a while
(`delay`), to lose a node (`lose`), and reads back what exists (`instances`) and what was
asked of it (`calls`). `ScriptedRuntime` is the services' Runtime without Ray: it notes each
start and answers the health a test scripts. `build_services` puts them together with a real
store, locks, provisioner and ClusterService, so a launch, a failover, a repair or a teardown
runs in milliseconds.
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import anyio

from clusterd.cost.ledger import Ledger
from clusterd.cost.prices import Prices
from clusterd.locks import ClusterLocks
from clusterd.nodes import ClusterInfo, NodeInfo, NodeStatus
from clusterd.providers.base import (
    BlockScope,
    ClusterRequest,
    Placement,
    ProviderContext,
    ProviderDefaults,
    ProviderHandle,
    ProviderOf,
    ProvisionError,
)
from clusterd.providers.registry import ProviderRegistry
from clusterd.provision.launcher import Provisioner
from clusterd.provision.plan import Health
from clusterd.requests import RunningRequest
from clusterd.runtime.agent_access import AgentAccess
from clusterd.runtime.agent_client import AgentConnections
from clusterd.services.clusters import ClusterService
from clusterd.services.jobs import JobService
from clusterd.services.node_runtime import Checkpoint, Progress
from clusterd.ssh.config_files import SSHConfigWriter
from clusterd.ssh.connections import SSHConnections
from clusterd.ssh.host_keys import HostKeyStore
from clusterd.ssh.tunnels import TunnelManager, TunnelState
from clusterd.state.clusters import ClusterRecord, ClusterStore
from clusterd.state.db import Database
from clusterd.state.handles import RuntimeHandle
from clusterd.state.requests import RequestRecord
from clusterd.tasks.file_sync import CopyGuard
from clusterd.tasks.spec import Autostop
from clusterd.user_config import UserConfig

# The zones it offers, cheapest first: (region, zone, price per node and hour).
ZONES = (("r1", "r1-a", 1.0), ("r1", "r1-b", 1.1), ("r2", "r2-a", 1.5))


@dataclasses.dataclass(frozen=True)
class ScriptedHandle(ProviderHandle, provider="scripted"):
    zone: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"zone": self.zone}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ScriptedHandle:
        return cls(data.get("zone"))


@dataclasses.dataclass
class Instance:
    zone: str
    token: str
    nodes: list[NodeStatus]
    # Each node's last start and stop by the provider's clock (ScriptedProvider.clock).
    launched: list[float | None] = dataclasses.field(default_factory=list)
    stopped: list[float | None] = dataclasses.field(default_factory=list)


class ScriptedProvider(ProviderDefaults[ScriptedHandle]):
    name: ClassVar[str] = "scripted"
    skypilot_cloud: ClassVar[str] = "scripted"
    can_stop: ClassVar[bool] = True
    keeps_node_times: ClassVar[bool] = True  # its `clock`, when a test sets one

    def __init__(self) -> None:
        self.instances: dict[str, Instance] = {}  # by cloud name: what exists now
        self.calls: list[tuple[str, str, str | None]] = []  # (call, cloud name, zone)
        self._failures: dict[str | None, ProvisionError] = {}  # by zone (None: every zone)
        self._delays: dict[str, float] = {}  # by call name
        self._gates: dict[str, anyio.Event] = {}  # by call name
        # The provider's own clock (None: it keeps none): create, start, stop and lose date
        # the nodes they change by it (NodeInfo.launched_at / stopped_at); start leaves the
        # launch times as they were when `start_keeps_launch_time`.
        self.clock: float | None = None
        self.start_keeps_launch_time = False

    # -- what a test tells it -------------------------------------------------------------

    def fail(self, zone: str | None, scope: BlockScope, message: str = "no capacity") -> None:
        """Every create in `zone` (None: anywhere) fails with `scope` until `heal`."""
        self._failures[zone] = ProvisionError(f"{message} in {zone or 'any zone'}", scope)

    def heal(self) -> None:
        self._failures.clear()

    def delay(self, call: str, seconds: float) -> None:
        """Each `call` (create, wait, start, terminate...) takes `seconds` from now on."""
        self._delays[call] = seconds

    def gate(self, call: str) -> anyio.Event:
        """Each `call` waits (after it is noted) until the test sets the event returned."""
        self._gates[call] = anyio.Event()
        return self._gates[call]

    def lose(self, cloud_name: str, node: int) -> None:
        """Node `node` of the cluster is gone for good (a spot node preempted)."""
        instance = self.instances[cloud_name]
        instance.nodes[node] = NodeStatus.TERMINATED
        instance.stopped[node] = self.clock

    # -- the Provider ---------------------------------------------------------------------

    @classmethod
    def build(cls, context: ProviderContext) -> ScriptedProvider:
        return cls()

    async def _call(self, call: str, cloud_name: str, zone: str | None) -> None:
        self.calls.append((call, cloud_name, zone))
        if self._delays.get(call):
            await anyio.sleep(self._delays[call])
        if call in self._gates:
            await self._gates[call].wait()

    async def placements(self, request: ClusterRequest) -> list[Placement]:
        return [Placement("scripted", region, zone, "s.node", cpus=4, memory_gb=16,
                          price_per_hour=price)
                for region, zone, price in ZONES
                if request.resources.infra.region in (None, region)
                and request.resources.infra.zone in (None, zone)]

    async def create(self, request: ClusterRequest, placement: Placement) -> ScriptedHandle:
        assert placement.zone is not None
        await self._call("create", request.cloud_name, placement.zone)
        failure = self._failures.get(placement.zone) or self._failures.get(None)
        if failure is not None:
            raise failure
        existing = self.instances.get(request.cloud_name)
        if existing is not None and existing.token == request.create_token:
            return ScriptedHandle(existing.zone)  # idempotent by its token
        if existing is not None and request.previous is not None:
            # A repair: the surviving nodes stay; the lost ones are made again.
            existing.nodes = [NodeStatus.RUNNING] * request.num_nodes
            return ScriptedHandle(existing.zone)
        assert existing is None, f"{request.cloud_name} exists already"
        self.instances[request.cloud_name] = Instance(
            placement.zone, request.create_token, [NodeStatus.RUNNING] * request.num_nodes,
            [self.clock] * request.num_nodes, [None] * request.num_nodes)
        return ScriptedHandle(placement.zone)

    def handle_for_intent(self, cloud_name: str, intent: Placement | None) -> ScriptedHandle:
        return ScriptedHandle(intent.zone if intent else None)

    async def wait(self, cloud_name: str, handle: ScriptedHandle,
                   timeout_s: float) -> ScriptedHandle:
        await self._call("wait", cloud_name, handle.zone)
        return handle

    def _nodes(self, cloud_name: str) -> list[NodeInfo]:
        instance = self.instances.get(cloud_name)
        if instance is None:
            return []
        return [NodeInfo(f"{cloud_name}-{i}", f"10.0.0.{i + 1}", status, cpus=4,
                         launched_at=launched, stopped_at=stopped)
                for i, (status, launched, stopped) in enumerate(itertools.zip_longest(
                    instance.nodes, instance.launched, instance.stopped))]

    async def query(self, cloud_name: str, handle: ScriptedHandle) -> list[NodeInfo]:
        await self._call("query", cloud_name, handle.zone)
        return self._nodes(cloud_name)

    async def query_many(self, clusters: list[tuple[str, ScriptedHandle]]
                         ) -> dict[str, list[NodeInfo] | ProvisionError]:
        return {name: await self.query(name, handle) for name, handle in clusters}

    async def cluster_info(self, cloud_name: str, handle: ScriptedHandle) -> ClusterInfo:
        nodes = [n for n in self._nodes(cloud_name) if n.status != NodeStatus.TERMINATED]
        if not nodes:
            raise ProvisionError(f"{cloud_name} has no nodes", BlockScope.FATAL)
        return ClusterInfo(tuple(nodes))

    async def stop(self, cloud_name: str, handle: ScriptedHandle) -> None:
        await self._call("stop", cloud_name, handle.zone)
        instance = self.instances[cloud_name]
        instance.nodes = [NodeStatus.STOPPED] * len(instance.nodes)
        instance.stopped = [self.clock] * len(instance.nodes)

    async def start(self, cloud_name: str, handle: ScriptedHandle) -> ScriptedHandle:
        await self._call("start", cloud_name, handle.zone)
        failure = self._failures.get(handle.zone) or self._failures.get(None)
        if failure is not None:
            raise failure
        instance = self.instances[cloud_name]
        instance.nodes = [NodeStatus.RUNNING] * len(instance.nodes)
        instance.stopped = [None] * len(instance.nodes)
        if not self.start_keeps_launch_time:
            instance.launched = [self.clock] * len(instance.nodes)
        return handle

    async def terminate(self, cloud_name: str, handle: ScriptedHandle) -> None:
        await self._call("terminate", cloud_name, handle.zone)
        self.instances.pop(cloud_name, None)

    async def enabled(self) -> bool:
        return True

    async def check(self) -> dict[str, Any]:
        return {"ok": True, "detail": "scripted (tests)"}


_PROVIDER: type[ProviderOf[ScriptedHandle]] = ScriptedProvider


class ScriptedRuntime:
    """The services' Runtime with no Ray: notes each start and stop; health as scripted."""

    def __init__(self) -> None:
        self.health_of: dict[str, Health] = {}  # by cluster name; "healthy" otherwise
        self.ups: list[tuple[str, tuple[str, ...], bool, RuntimeHandle | None]] = []
        self.stops: list[tuple[str, ...]] = []
        self.autostops: list[tuple[str, Autostop | None]] = []
        self.closed: list[str] = []
        self.fail_up: Exception | None = None  # raised by the next `up`

    async def up(self, record: ClusterRecord, info: ClusterInfo,
                 previous: RuntimeHandle | None, progress: Progress, *, fresh: bool,
                 checkpoint: Checkpoint) -> RuntimeHandle:
        """(name, node ids, fresh, previous) noted; the handle checkpointed first."""
        handle = RuntimeHandle(ports={"gcs": 6380}, agent_endpoint=f"unix:/{record.name}")
        await checkpoint(handle)
        self.ups.append((record.name, tuple(n.node_id for n in info.nodes), fresh, previous))
        if self.fail_up is not None:
            error, self.fail_up = self.fail_up, None
            raise error
        return handle

    async def stop(self, info: ClusterInfo) -> None:
        self.stops.append(tuple(n.node_id for n in info.nodes))

    async def remove_files(self, cloud_name: str, info: ClusterInfo) -> None:
        return None

    async def health(self, record: ClusterRecord) -> Health:
        return self.health_of.get(record.name, "healthy")

    async def set_autostop(self, record: ClusterRecord, setting: Autostop | None) -> None:
        self.autostops.append((record.name, setting))

    async def close(self, cluster: str, grace_s: float | None = None) -> None:
        self.closed.append(cluster)

    def tunnel(self, cluster: str) -> TunnelState | None:
        return None


@dataclasses.dataclass
class Services:
    store: ClusterStore
    locks: ClusterLocks
    provider: ScriptedProvider
    runtime: ScriptedRuntime
    provisioner: Provisioner
    clusters: ClusterService
    _ids: list[int] = dataclasses.field(default_factory=list)

    def request(self, op: str = "launch", cluster: str = "c") -> RunningRequest:
        self._ids.append(len(self._ids) + 1)
        return RunningRequest(RequestRecord(self._ids[-1], op, cluster, {}, "RUNNING",
                                            time.time()))


def _no_runner(node: NodeInfo) -> Any:
    raise AssertionError(f"these services reach no node ({node.node_id})")


async def build_services(db: Database, tmp: Path, *, wait_timeout_s: float = 10,
                         retry_gap_s: float = 0.01,
                         forget: Callable[..., Any] | None = None) -> Services:
    """The cluster services on `db`, with the scripted provider and runtime."""
    store = ClusterStore(db)
    await store.load()
    locks = ClusterLocks(timeout_s=60, notice_after_s=0)
    provider = ScriptedProvider()
    providers = ProviderRegistry([provider])
    runtime = ScriptedRuntime()
    # The job service is the real one: a launch with nothing to run sends nothing to nodes.
    access = AgentAccess(AgentConnections(), TunnelManager(
        SSHConnections(HostKeyStore(tmp / "known_hosts")), tmp / "tunnels"))
    jobs = JobService(store, locks, providers, access, _no_runner, CopyGuard(()))
    provisioner = Provisioner(store, providers, wait_timeout_s=wait_timeout_s,
                              retry_gap_s=retry_gap_s, retry_max_gap_s=retry_gap_s)
    clusters = ClusterService(store, locks, providers, runtime, jobs,
                              SSHConfigWriter(tmp / "ssh", tmp / "known_hosts"), provisioner,
                              forget_nodes=forget,
                              ledger=Ledger(db, Prices(lambda: UserConfig(tmp / "config.yaml"),
                                                       dict)))
    return Services(store, locks, provider, runtime, provisioner, clusters)
