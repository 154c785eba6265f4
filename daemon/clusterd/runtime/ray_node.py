"""Ray on one node of a cluster, through the node helper: where the cluster's runtime lives
there, which ports each Ray takes, and Ray's start and stop.

Each call here is one node-helper call (a Python start on the node) or two; the order in
which a cluster's nodes are started and stopped is decided by the callers
(runtime/start.py, runtime/manager.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
from collections.abc import Callable

from clusterd import log
from clusterd.concurrency import on_each
from clusterd.node_shared.node_commands import (
    FreePortsRequest,
    StartRayRequest,
    StatusRequest,
    StopRequest,
)
from clusterd.nodes import ClusterInfo, NodeInfo
from clusterd.runtime import gpu_driver, node_helper
from clusterd.runtime.runner import CommandRunner

logger = log.get("clusterd.runtime")

# Ports that clash between Ray instances sharing a host unless each gets its own. The head
# needs them all; a worker only the ones its raylet and dashboard agent open.
HEAD_PORTS = (
    "gcs_port",
    "node_manager_port",
    "object_manager_port",
    "dashboard_port",
    "dashboard_agent_listen_port",
    "dashboard_agent_grpc_port",
    "metrics_export_port",
    "runtime_env_agent_port",
    "autoscaler_metric_port",
    "dashboard_metric_port",
)
WORKER_PORTS = (
    "node_manager_port",
    "object_manager_port",
    "dashboard_agent_listen_port",
    "dashboard_agent_grpc_port",
    "metrics_export_port",
    "runtime_env_agent_port",
)
# Passed to Ray as environment, not flags.
NOT_RAY_FLAGS = ("gcs_port", "autoscaler_metric_port", "dashboard_metric_port")


@dataclasses.dataclass(frozen=True)
class NodeLayout:
    """Where this cluster's runtime lives on one node."""

    base: str

    @property
    def run_dir(self) -> str:
        return f"{self.base}/run"

    @property
    def agent_state(self) -> str:
        return f"{self.base}/agent"

    @property
    def token_path(self) -> str:
        return f"{self.base}/ray_token"


def ray_temp_key(cloud_name: str) -> str:
    """Names the cluster's Ray temp dir on a node (the helper keeps that path short)."""
    return hashlib.sha256(cloud_name.encode()).hexdigest()[:10]


def ray_env(layout: NodeLayout, ports: dict[str, int], node: NodeInfo) -> dict[str, str]:
    """The environment Ray (and the agent, Ray's driver on the head) runs with on `node`."""
    env = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": layout.token_path}
    if "autoscaler_metric_port" in ports:
        env["AUTOSCALER_METRIC_PORT"] = str(ports["autoscaler_metric_port"])
        env["DASHBOARD_METRIC_PORT"] = str(ports["dashboard_metric_port"])
    if node.internal_ip == "127.0.0.1":
        # Otherwise Ray swaps 127.0.0.1 for this machine's outward address, and a local
        # cluster would talk to itself through a non-loopback interface.
        env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    return env


class RayNodes:
    """Ray's start and stop on the nodes the runner factory reaches."""

    def __init__(self, runner_for: Callable[[NodeInfo], CommandRunner],
                 object_store_bytes: int, start_timeout_s: float) -> None:
        self._runner_for = runner_for
        self._object_store_bytes = object_store_bytes
        self._start_timeout_s = start_timeout_s

    async def free_ports(self, node: NodeInfo, names: tuple[str, ...]) -> dict[str, int]:
        """As many ports free on `node` as `names`, by name."""
        found = await node_helper.call(self._runner_for(node),
                                       FreePortsRequest(count=len(names)))
        return dict(zip(names, found.ports, strict=True))

    async def start(
        self,
        cloud_name: str,
        node: NodeInfo,
        ports: dict[str, int],
        token: str,
        address: str,
        head: bool,
        members: set[str] | None = None,
    ) -> None:
        """Start Ray on node unless it runs there already (and, when members is known, the
        head counts it: a node's Ray the head has given up on is stopped and started anew)."""
        runner = self._runner_for(node)
        layout = NodeLayout(node.runtime_dir)
        if node.gpus > 0 and node.check_gpu_driver:
            await gpu_driver.check(runner, node)
        if members is not None and node.internal_ip not in members:
            status = await node_helper.call(runner, StatusRequest(dir=layout.run_dir))
            if status.ray.alive:
                logger.info("restarting a worker's Ray the head no longer counts",
                            node=node.node_id, ip=node.internal_ip)
                await self.stop(node, ["ray"])
        # One helper call (each is a Python start on the node): a Ray running there already
        # is kept, else the directory is marked ours (`down` may remove it whole), the token
        # written and Ray started.
        request = StartRayRequest(
            mark=layout.base,
            token_path=layout.token_path,
            token=token,
            dir=layout.run_dir,
            temp_key=ray_temp_key(cloud_name),
            head=head,
            node_ip=node.internal_ip,
            num_cpus=node.cpus,
            num_gpus=node.gpus,
            object_store_bytes=self._object_store_bytes,
            ports={
                **{k: v for k, v in ports.items() if k not in NOT_RAY_FLAGS},
                # Workers take any free ports: clusters sharing a host then never collide.
                "min_worker_port": 0,
                "max_worker_port": 0,
            },
            env=ray_env(layout, ports, node),
            timeout=self._start_timeout_s,
            gcs_port=ports["gcs_port"] if head else None,
            head_address="" if head else address,
        )
        await node_helper.call(runner, request, timeout_s=self._start_timeout_s + 30)

    async def stop_cluster(self, info: ClusterInfo) -> None:
        """Stop the agent (which cancels its jobs), then Ray on the workers, then on the head:
        a worker whose head is already gone hangs in its own shutdown."""
        await self.stop(info.head, ["agent"])
        await on_each(info.nodes[1:], lambda node: self.stop(node, ["ray"]))
        await self.stop(info.head, ["ray"])

    async def stop(self, node: NodeInfo, parts: list[str]) -> None:
        """Stop `parts` ("ray", "agent") of the runtime on `node`."""
        # Never installed (a launch cut short): nothing of ours runs there.
        with contextlib.suppress(node_helper.RuntimeMissing):
            await node_helper.call(
                self._runner_for(node),
                StopRequest(dir=NodeLayout(node.runtime_dir).run_dir, parts=parts),
                timeout_s=90,
            )
