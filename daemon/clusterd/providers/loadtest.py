"""`loadtest`: an in-memory provider for benchmarks and scale tests. NOT for users.

It is registered only when CLUSTERD_TEST_PROVIDERS names it. Its clusters have no nodes to
reach and no agent: every query answers "running" from memory after a pause that stands for
one provider API call (for all clusters at once, as a real provider's list call would).

For the failover benchmark it offers CLUSTERD_LOADTEST_ZONES zones (default 1), and with
CLUSTERD_LOADTEST_STOCKOUT=1 every zone is out of capacity: a launch walks through all of
them and fails, having made nothing, so the engine's decisions are what is measured.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import anyio

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

API_CALL_S = 0.05


@dataclasses.dataclass(frozen=True)
class LoadTestHandle(ProviderHandle, provider="loadtest"):
    nodes: int = 1
    stopped: bool | None = None  # as `start` last left it (None: never started again)

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"nodes": self.nodes}
        if self.stopped is not None:
            data["stopped"] = self.stopped
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LoadTestHandle:
        stopped = data.get("stopped")
        return cls(int(data.get("nodes", 1)), None if stopped is None else bool(stopped))


class LoadTestProvider(ProviderDefaults[LoadTestHandle]):
    name: ClassVar[str] = "loadtest"
    skypilot_cloud: ClassVar[str] = "loadtest"
    can_stop: ClassVar[bool] = True
    agentless: ClassVar[bool] = True

    def __init__(self, zones: int = 1, stockout: bool = False) -> None:
        self.calls = 0
        self._zones = [f"mem-{i:05d}" for i in range(max(1, zones))]
        self._stockout = stockout
        # Clusters stopped since they were last started: in memory only, as the nodes are.
        self._stopped: set[str] = set()

    @classmethod
    def build(cls, context: ProviderContext) -> LoadTestProvider:
        return cls(context.settings.loadtest_zones, context.settings.loadtest_stockout)

    def _nodes(self, cloud_name: str, handle: LoadTestHandle) -> list[NodeInfo]:
        count = handle.nodes
        stopped = handle.stopped or cloud_name in self._stopped
        status = NodeStatus.STOPPED if stopped else NodeStatus.RUNNING
        return [NodeInfo(f"{cloud_name}-{i}", f"10.255.0.{i + 1}", status, cpus=4)
                for i in range(count)]

    async def placements(self, request: ClusterRequest) -> list[Placement]:
        if len(self._zones) == 1:
            return [Placement("loadtest", "mem", None, "m.test", cpus=4, memory_gb=16)]
        return [Placement("loadtest", "mem", zone, "m.test", cpus=4, memory_gb=16)
                for zone in self._zones]

    async def create(self, request: ClusterRequest, placement: Placement) -> LoadTestHandle:
        if self._stockout:
            raise ProvisionError(f"no capacity in {placement.zone} (load test)",
                                 BlockScope.ZONE)
        return LoadTestHandle(request.num_nodes)

    def handle_for_intent(self, cloud_name: str, intent: Placement | None) -> LoadTestHandle:
        return LoadTestHandle()


    async def query(self, cloud_name: str, handle: LoadTestHandle) -> list[NodeInfo]:
        result = (await self.query_many([(cloud_name, handle)]))[cloud_name]
        assert not isinstance(result, ProvisionError)
        return result

    async def query_many(
        self, clusters: list[tuple[str, LoadTestHandle]]
    ) -> dict[str, list[NodeInfo] | ProvisionError]:
        self.calls += 1
        await anyio.sleep(API_CALL_S)
        return {name: self._nodes(name, handle) for name, handle in clusters}

    async def cluster_info(self, cloud_name: str, handle: LoadTestHandle) -> ClusterInfo:
        return ClusterInfo(tuple(self._nodes(cloud_name, handle)))

    async def stop(self, cloud_name: str, handle: LoadTestHandle) -> None:
        self._stopped.add(cloud_name)

    async def start(self, cloud_name: str, handle: LoadTestHandle) -> LoadTestHandle:
        self._stopped.discard(cloud_name)
        return dataclasses.replace(handle, stopped=False)

    async def terminate(self, cloud_name: str, handle: LoadTestHandle) -> None:
        return None

    async def enabled(self) -> bool:
        return True

    async def check(self) -> dict[str, Any]:
        return {"ok": True, "detail": "in-memory test provider (benchmarks only)"}


# mypy checks here that the class is a provider of its own handles, whole.
_PROVIDER: type[ProviderOf[LoadTestHandle]] = LoadTestProvider
