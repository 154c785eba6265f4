"""A cluster's runtime on its nodes, as the services see it: started (and repaired) by
`up`, whose phases are runtime/start.py's; asked what runs on the head; stopped; its files
removed. Ray on one node is runtime/ray_node.py's.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path

from clusterd.concurrency import on_each
from clusterd.node_shared.node_commands import CleanupRequest, StatusReply, StatusRequest
from clusterd.nodes import ClusterInfo, NodeInfo
from clusterd.runtime import node_helper
from clusterd.runtime.agent_access import AgentAccess
from clusterd.runtime.install import WheelhouseBuilder
from clusterd.runtime.ray_node import NodeLayout, RayNodes, ray_temp_key
from clusterd.runtime.runner import CommandRunner
from clusterd.runtime.start import Checkpoint, Progress, RuntimeStart, StartSettings
from clusterd.state.handles import RuntimeHandle

RunnerFactory = Callable[[NodeInfo], CommandRunner]


class RuntimeManager:
    def __init__(
        self,
        runner_for: RunnerFactory,
        access: AgentAccess,
        wheelhouse: WheelhouseBuilder,
        agent_socket_dir: Path,
        object_store_bytes: int,
        start_timeout_s: float,
        agent_autostop_grace_s: float = 300.0,
        agent_job_retention: int = 1000,
    ) -> None:
        self._runner_for = runner_for
        self._ray = RayNodes(runner_for, object_store_bytes, start_timeout_s)
        self._start = StartSettings(runner_for, access, wheelhouse, self._ray,
                                    agent_socket_dir, start_timeout_s, agent_autostop_grace_s,
                                    agent_job_retention)

    async def up(
        self,
        cluster: str,
        cloud_name: str,
        info: ClusterInfo,
        previous: RuntimeHandle | None,
        progress: Progress,
        *,
        fresh: bool = False,
        checkpoint: Checkpoint | None = None,
    ) -> RuntimeHandle:
        """Bring Ray and the agent up on every node; returns the runtime handle to store.
        With `fresh`, whatever runs is stopped first (a runtime of another version).
        `checkpoint` gets the handle before anything starts (and again with each worker's
        ports, before that worker starts), so a daemon killed mid-way restarts knowing the
        ports and the agent's address of what it may have started.

        Each node goes on as soon as it is ready: the head installs, decides the ports and
        starts Ray and the agent; a worker installs, picks its ports once the head has
        decided, and starts its Ray beside the head's."""
        return await RuntimeStart(self._start, cluster, cloud_name, info, previous, progress,
                                  fresh=fresh, checkpoint=checkpoint).run()

    async def head_status(self, info: ClusterInfo) -> StatusReply:
        """What runs on the head (Ray, the agent), and whether the agent stopped the
        cluster on its own (`autostopped`, with its reason)."""
        return await node_helper.call(
            self._runner_for(info.head),
            StatusRequest(dir=NodeLayout(info.head.runtime_dir).run_dir), timeout_s=30,
        )

    async def stop(self, info: ClusterInfo) -> None:
        """Stop the agent (which cancels its jobs), then Ray on the workers, then on the head:
        a worker whose head is already gone hangs in its own shutdown."""
        await self._ray.stop_cluster(info)

    async def remove_files(self, cloud_name: str, info: ClusterInfo) -> None:
        async def clean(node: NodeInfo) -> None:
            with contextlib.suppress(node_helper.RuntimeMissing):  # never installed
                await node_helper.call(
                    self._runner_for(node),
                    CleanupRequest(paths=[node.runtime_dir],
                                   ray_temp_keys=[ray_temp_key(cloud_name)]))

        await on_each(info.nodes, clean)
