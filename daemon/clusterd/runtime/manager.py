"""A cluster's runtime on its nodes: Ray (head, then workers) and the agent on the head.

`up` is idempotent and doubles as repair: what is already running is kept, what died is
started again, and the cluster is ready only once the agent answers and sees every node.
"""

from __future__ import annotations

import dataclasses
import hashlib
import secrets
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio

from clusterctl.protocol import ErrorCode, ProtocolError
from clusterd import log
from clusterd.concurrency import first_error
from clusterd.providers.base import ClusterInfo, NodeInfo
from clusterd.runtime import node_helper
from clusterd.runtime.agent_client import AgentClient
from clusterd.runtime.runner import CommandRunner

logger = log.get("clusterd.runtime")

Progress = Callable[[str, str], Awaitable[None]]
RunnerFactory = Callable[[NodeInfo], CommandRunner]

# Ray's ports that clash between clusters on one host unless each cluster gets its own.
RAY_PORT_NAMES = (
    "gcs_port",
    "node_manager_port",
    "object_manager_port",
    "ray_client_server_port",
    "dashboard_port",
    "dashboard_agent_listen_port",
    "dashboard_agent_grpc_port",
    "metrics_export_port",
    "runtime_env_agent_port",
    "autoscaler_metric_port",
    "dashboard_metric_port",
    "agent_port",
)
WORKER_PORT_NAMES = tuple(n for n in RAY_PORT_NAMES if n not in (
    "gcs_port", "ray_client_server_port", "dashboard_port", "autoscaler_metric_port",
    "dashboard_metric_port", "agent_port",
))


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


class RuntimeManager:
    def __init__(
        self,
        runner_for: RunnerFactory,
        agent_socket_dir: Path,
        object_store_bytes: int,
        start_timeout_s: float,
    ) -> None:
        self._runner_for = runner_for
        self._agent_socket_dir = agent_socket_dir
        self._object_store_bytes = object_store_bytes
        self._start_timeout_s = start_timeout_s

    def agent_endpoint(self, cloud_name: str, info: ClusterInfo, handle: dict[str, Any]) -> str:
        """Where the daemon reaches the agent. A local head listens on a Unix socket of the
        daemon's; a remote head's loopback port is reached through an SSH tunnel."""
        if info.head.ssh is None:
            return f"unix:{self._agent_socket_dir / f'{cloud_name}.sock'}"
        raise ProtocolError(ErrorCode.UNSUPPORTED, "clusters over SSH are not supported yet")

    async def up(
        self,
        cluster: str,
        cloud_name: str,
        info: ClusterInfo,
        previous: dict[str, Any] | None,
        progress: Progress,
    ) -> dict[str, Any]:
        """Bring Ray and the agent up on every node; returns the runtime handle to store."""
        head = info.head
        head_runner = self._runner_for(head)
        head_layout = NodeLayout(head.runtime_dir)
        state = await node_helper.call(head_runner, "status", {"dir": head_layout.run_dir})
        head_alive = bool(state["ray"]["alive"])
        if head_alive and previous and previous.get("ports"):
            ports: dict[str, int] = dict(previous["ports"])
            token = None  # nodes keep the token file Ray was started with
        else:
            found = await node_helper.call(
                head_runner, "free-ports", {"count": len(RAY_PORT_NAMES)}
            )
            ports = dict(zip(RAY_PORT_NAMES, found["ports"], strict=True))
            token = secrets.token_hex(32)
        address = f"{head.internal_ip}:{ports['gcs_port']}"
        await progress(f"starting Ray on {len(info.nodes)} node(s)", "ray")
        await self._start_ray(cloud_name, info, ports, token, address, head_alive)
        await progress("starting the agent on the head node", "agent")
        listen = self._agent_listen(cloud_name, head, ports)
        await node_helper.call(
            head_runner,
            "start-agent",
            {
                "dir": head_layout.run_dir,
                "listen": listen,
                "state_dir": head_layout.agent_state,
                "ray_address": address,
                "cluster_name": cluster,
                "env": self._ray_env(head_layout, ports, head),
                "timeout": self._start_timeout_s,
            },
            timeout_s=self._start_timeout_s + 30,
        )
        handle = {"ports": ports, "ray_address": address, "agent_listen": listen}
        endpoint = self.agent_endpoint(cloud_name, info, handle)
        await self._wait_for_nodes(cluster, endpoint, len(info.nodes))
        return {**handle, "agent_endpoint": endpoint}

    def _agent_listen(self, cloud_name: str, head: NodeInfo, ports: dict[str, int]) -> str:
        if head.ssh is None:
            return f"unix:{self._agent_socket_dir / f'{cloud_name}.sock'}"
        return f"127.0.0.1:{ports['agent_port']}"

    def _ray_env(self, layout: NodeLayout, ports: dict[str, int], node: NodeInfo) -> dict[str, str]:
        env = {
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN_PATH": layout.token_path,
            "AUTOSCALER_METRIC_PORT": str(ports["autoscaler_metric_port"]),
            "DASHBOARD_METRIC_PORT": str(ports["dashboard_metric_port"]),
        }
        if node.internal_ip == "127.0.0.1":
            # Otherwise Ray swaps 127.0.0.1 for this machine's outward address, and a local
            # cluster would talk to itself through a non-loopback interface.
            env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
        return env

    async def _start_ray(
        self,
        cloud_name: str,
        info: ClusterInfo,
        ports: dict[str, int],
        token: str | None,
        address: str,
        head_alive: bool,
    ) -> None:
        if token is None:
            # Ray is up on the head: any worker that needs a start must get its token.
            token = (await node_helper.call(
                self._runner_for(info.head), "read-token",
                {"path": NodeLayout(info.head.runtime_dir).token_path},
            ))["token"]
        await self._start_ray_node(cloud_name, info.head, ports, token, address, head=True)
        with first_error():
            async with anyio.create_task_group() as group:
                for node in info.nodes[1:]:
                    group.start_soon(self._start_ray_node, cloud_name, node, ports, token, address,
                                     False)

    async def _start_ray_node(
        self,
        cloud_name: str,
        node: NodeInfo,
        ports: dict[str, int],
        token: str,
        address: str,
        head: bool,
    ) -> None:
        runner = self._runner_for(node)
        layout = NodeLayout(node.runtime_dir)
        status = await node_helper.call(runner, "status", {"dir": layout.run_dir})
        if status["ray"]["alive"]:
            return
        await node_helper.call(runner, "write-token", {"path": layout.token_path, "token": token})
        names = RAY_PORT_NAMES if head else WORKER_PORT_NAMES
        params: dict[str, Any] = {
            "dir": layout.run_dir,
            "temp_key": ray_temp_key(cloud_name),
            "head": head,
            "node_ip": node.internal_ip,
            "num_cpus": node.cpus,
            "num_gpus": node.gpus,
            "object_store_bytes": self._object_store_bytes,
            "ports": {
                **{k: ports[k] for k in names if k not in ("gcs_port", "agent_port",
                                                          "autoscaler_metric_port",
                                                          "dashboard_metric_port")},
                # Workers take any free ports: clusters sharing a host then never collide.
                "min_worker_port": 0,
                "max_worker_port": 0,
            },
            "env": self._ray_env(layout, ports, node),
            "timeout": self._start_timeout_s,
        }
        if head:
            params["gcs_port"] = ports["gcs_port"]
        else:
            params["head_address"] = address
        await node_helper.call(runner, "start-ray", params, timeout_s=self._start_timeout_s + 30)

    async def _wait_for_nodes(self, cluster: str, endpoint: str, expected: int) -> None:
        client = AgentClient(cluster, endpoint)
        seen = 0
        try:
            with anyio.fail_after(self._start_timeout_s):
                while True:
                    try:
                        health = await client.check_version()
                        seen = health.ray_nodes_alive
                        if health.ray_connected and seen >= expected:
                            return
                    except ProtocolError as exc:
                        if exc.code == ErrorCode.AGENT_VERSION_MISMATCH:
                            raise
                    await anyio.sleep(0.25)
        except TimeoutError:
            raise ProtocolError(
                ErrorCode.PROVIDER_ERROR,
                f"only {seen} of {expected} nodes joined the Ray cluster within "
                f"{self._start_timeout_s:.0f} s",
                "see the Ray logs in the runtime directory of each node",
            ) from None
        finally:
            await client.close()

    async def stop(self, info: ClusterInfo) -> None:
        """Stop the agent (which cancels its jobs), then Ray on the workers, then on the head:
        a worker whose head is already gone hangs in its own shutdown."""
        await self._stop_node(info.head, ["agent"])
        with first_error():
            async with anyio.create_task_group() as group:
                for node in info.nodes[1:]:
                    group.start_soon(self._stop_node, node, ["ray"])
        await self._stop_node(info.head, ["ray"])

    async def _stop_node(self, node: NodeInfo, parts: list[str]) -> None:
        await node_helper.call(
            self._runner_for(node), "stop",
            {"dir": NodeLayout(node.runtime_dir).run_dir, "parts": parts},
            timeout_s=90,
        )

    async def node_states(self, info: ClusterInfo) -> list[dict[str, Any]]:
        states: list[dict[str, Any]] = [{} for _ in info.nodes]

        async def one(index: int, node: NodeInfo) -> None:
            states[index] = await node_helper.call(
                self._runner_for(node), "status", {"dir": NodeLayout(node.runtime_dir).run_dir},
                timeout_s=30,
            )

        with first_error():
            async with anyio.create_task_group() as group:
                for index, node in enumerate(info.nodes):
                    group.start_soon(one, index, node)
        return states

    async def remove_files(self, cloud_name: str, info: ClusterInfo) -> None:
        with first_error():
            async with anyio.create_task_group() as group:
                for node in info.nodes:
                    group.start_soon(
                        node_helper.call,
                        self._runner_for(node),
                        "cleanup",
                        {"paths": [node.runtime_dir], "ray_temp_keys": [ray_temp_key(cloud_name)]},
                    )
