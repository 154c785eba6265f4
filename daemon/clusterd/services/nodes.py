"""A cluster's nodes, as its provider reports them now (op `nodes`)."""

from __future__ import annotations

from typing import Any

from clusterd.nodes import NodeInfo
from clusterd.providers.registry import ProviderRegistry
from clusterd.state.clusters import ClusterRecord


async def node_views(providers: ProviderRegistry, record: ClusterRecord) -> list[dict[str, Any]]:
    """One map per node, the head first: what a person looking at the cluster wants to see,
    and nothing secret (no key paths, no tokens). A cluster whose provider has not answered a
    create call yet has no nodes to show. Provider errors propagate as they are."""
    handle = record.handle.provider
    if handle is None:
        return []
    nodes = await providers.get(record.provider).query(record.cloud_name, handle)
    return [_view(node, index) for index, node in enumerate(nodes)]


def _view(node: NodeInfo, index: int) -> dict[str, Any]:
    return {
        "node_id": node.node_id,
        "role": "head" if index == 0 else "worker",
        "internal_ip": node.internal_ip,
        "external_ip": node.external_ip or None,
        "status": str(node.status),
        "ssh": str(node.ssh) if node.ssh is not None else None,
        "cpus": node.cpus,
        "gpus": node.gpus,
        "reason": node.reason,
    }
