"""`loadtest`: an in-memory provider for benchmarks and scale tests. NOT for users.

It is registered only when CLUSTERD_TEST_PROVIDERS names it. Its clusters have no nodes to
reach and no agent: every query answers "running" from memory after a pause that stands for
one provider API call (for all clusters at once, as a real provider's list call would).
"""

from __future__ import annotations

from typing import Any, ClassVar

import anyio

from clusterd.nodes import ClusterInfo, NodeInfo, NodeStatus
from clusterd.providers.base import (
    ClusterRequest,
    Placement,
    ProviderContext,
    ProviderDefaults,
    ProvisionError,
)

API_CALL_S = 0.05


class LoadTestProvider(ProviderDefaults):
    name: ClassVar[str] = "loadtest"
    skypilot_cloud: ClassVar[str] = "loadtest"
    can_stop: ClassVar[bool] = True
    agentless: ClassVar[bool] = True

    def __init__(self) -> None:
        self.calls = 0

    @classmethod
    def build(cls, context: ProviderContext) -> LoadTestProvider:
        return cls()

    def _nodes(self, cloud_name: str, handle: dict[str, Any]) -> list[NodeInfo]:
        count = int(handle.get("nodes", 1))
        status = NodeStatus.STOPPED if handle.get("stopped") else NodeStatus.RUNNING
        return [NodeInfo(f"{cloud_name}-{i}", f"10.255.0.{i + 1}", status, cpus=4)
                for i in range(count)]

    async def placements(self, request: ClusterRequest) -> list[Placement]:
        return [Placement("loadtest", "mem", None, "m.test", cpus=4, memory_gb=16)]

    async def create(self, request: ClusterRequest, placement: Placement) -> dict[str, Any]:
        return {"nodes": request.num_nodes}


    async def query(self, cloud_name: str, handle: dict[str, Any]) -> list[NodeInfo]:
        result = (await self.query_many([(cloud_name, handle)]))[cloud_name]
        assert not isinstance(result, ProvisionError)
        return result

    async def query_many(
        self, clusters: list[tuple[str, dict[str, Any]]]
    ) -> dict[str, list[NodeInfo] | ProvisionError]:
        self.calls += 1
        await anyio.sleep(API_CALL_S)
        return {name: self._nodes(name, handle) for name, handle in clusters}

    async def cluster_info(self, cloud_name: str, handle: dict[str, Any]) -> ClusterInfo:
        return ClusterInfo(tuple(self._nodes(cloud_name, handle)))

    async def stop(self, cloud_name: str, handle: dict[str, Any]) -> None:
        handle["stopped"] = True

    async def start(self, cloud_name: str, handle: dict[str, Any]) -> dict[str, Any]:
        return {**handle, "stopped": False}

    async def terminate(self, cloud_name: str, handle: dict[str, Any]) -> None:
        return None

    async def enabled(self) -> bool:
        return True

    async def check(self) -> dict[str, Any]:
        return {"ok": True, "detail": "in-memory test provider (benchmarks only)"}
