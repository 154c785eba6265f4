"""What an UP cluster's nodes are doing: their recent CPU, memory and GPU use, as its agent
sampled it (op `node_usage`). The agent keeps the last hour; the daemon keeps nothing."""

from __future__ import annotations

from typing import Any

from clusterctl.protocol import ProtocolError
from clusterd.runtime.agent_access import AgentAccess
from clusterd.runtime.agent_types import NodeUsage
from clusterd.services.common import head_unreachable, require_cluster, require_head
from clusterd.state.clusters import ClusterStore


class UsageService:
    def __init__(self, store: ClusterStore, access: AgentAccess) -> None:
        self._store = store
        self._access = access

    async def node_usage(self, name: str, since: float) -> dict[str, Any]:
        record = require_head(require_cluster(self._store, name))
        try:
            agent = await self._access.client(record)
            interval_s, nodes = await agent.node_usage(since)
        except ProtocolError as exc:
            raise head_unreachable(record, exc) from None
        return {"cluster": name, "interval_s": interval_s,
                "nodes": [usage_wire(node) for node in nodes]}


def usage_wire(node: NodeUsage) -> dict[str, Any]:
    """A node's samples as the protocol sends them: one list per series (a few hundred
    samples as maps would repeat each key hundreds of times)."""
    samples = node.samples
    gpu_count = max((len(s.gpus) for s in samples), default=0)
    return {
        "node_id": node.node_id, "ip": node.ip, "head": node.head,
        "ts": [s.ts for s in samples],
        "cpu_percent": [s.cpu_percent for s in samples],
        "memory_used_bytes": [s.memory_used_bytes for s in samples],
        "memory_total_bytes": [s.memory_total_bytes for s in samples],
        "gpus": [{
            "util_percent": [s.gpus[i].util_percent if i < len(s.gpus) else None
                             for s in samples],
            "memory_used_bytes": [s.gpus[i].memory_used_bytes if i < len(s.gpus) else None
                                  for s in samples],
            "memory_total_bytes": [s.gpus[i].memory_total_bytes if i < len(s.gpus) else None
                                   for s in samples],
        } for i in range(gpu_count)],
    }
