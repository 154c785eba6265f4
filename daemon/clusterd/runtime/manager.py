"""A cluster's runtime on its nodes: Ray on each and the agent on the head, started all at
once (a worker's helper waits for the head's port to open, the agent's Ray connect for the
head's Ray to take drivers: each start's Python and imports overlap the others').

`up` is idempotent and doubles as repair: what is already running is kept, what died is
started again, and the cluster is ready only once the agent answers and sees every node.
On remote nodes it first installs the runtime (once per version, in parallel).

The agent listens on a Unix socket in a 0700 directory of the head's user (`~/.clusterd/s/`,
short: socket paths end at 107 bytes) and holds the runtime's token (node_shared/auth.py), made here
and recorded with the runtime before anything starts.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import secrets
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio

from clusterctl.protocol import ErrorCode, ProtocolError
from clusterd import log
from clusterd.concurrency import first_error, on_each
from clusterd.faults import fault_point
from clusterd.node_shared.auth import new_token
from clusterd.node_shared.node_commands import (
    CleanupRequest,
    FreePortsRequest,
    ReadTokenRequest,
    StartAgentRequest,
    StartRayRequest,
    StatusReply,
    StatusRequest,
    StopRequest,
)
from clusterd.nodes import ClusterInfo, NodeInfo
from clusterd.runtime import gpu_driver, node_helper
from clusterd.runtime.agent_access import AgentAccess
from clusterd.runtime.agent_client import AgentClient
from clusterd.runtime.install import WheelhouseBuilder
from clusterd.runtime.install_round import InstallRound
from clusterd.runtime.runner import CommandRunner
from clusterd.state.handles import RuntimeHandle

logger = log.get("clusterd.runtime")

Progress = Callable[[str, str], Awaitable[None]]
RunnerFactory = Callable[[NodeInfo], CommandRunner]

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
# Where the agent's socket lives on a remote head (its directory is made 0700 there).
REMOTE_AGENT_SOCKET = "~/.clusterd/s/{key}.sock"
MEMBERS_TIMEOUT_S = 15.0  # asking a running agent which nodes Ray counts
# Between asks of a new agent whether every node joined: each is one small call on the
# agent link, and the launch waits on it.
NODES_POLL_S = 0.1


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


@dataclasses.dataclass(frozen=True)
class _StartPlan:
    """What the head decides before any Ray starts, for every node's start."""

    handle: RuntimeHandle  # without worker_ports: `up` keeps those as each worker picks them
    members: set[str] | None  # the workers the head's running Ray counts (None: not known)
    ray_token: str
    address: str  # the head's GCS
    agent_token: str


def _node_key(node: NodeInfo) -> str:
    return node.node_id


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
        self._agent_autostop_grace_s = agent_autostop_grace_s
        self._agent_job_retention = agent_job_retention
        self._runner_for = runner_for
        self._access = access
        self._wheelhouse = wheelhouse
        self._agent_socket_dir = agent_socket_dir
        self._object_store_bytes = object_store_bytes
        self._start_timeout_s = start_timeout_s

    async def up(
        self,
        cluster: str,
        cloud_name: str,
        info: ClusterInfo,
        previous: RuntimeHandle | None,
        progress: Progress,
        *,
        fresh: bool = False,
        checkpoint: Callable[[RuntimeHandle], Awaitable[None]] | None = None,
    ) -> RuntimeHandle:
        """Bring Ray and the agent up on every node; returns the runtime handle to store.
        With `fresh`, whatever runs is stopped first (a runtime of another version).
        `checkpoint` gets the handle before anything starts (and again with each worker's
        ports, before that worker starts), so a daemon killed mid-way restarts knowing the
        ports and the agent's address of what it may have started.

        Each node goes on as soon as it is ready: the head installs, decides the ports and
        starts Ray and the agent; a worker installs, picks its ports once the head has
        decided, and starts its Ray beside the head's."""
        if fresh:
            await self._stop_running(cluster, info, progress, "stopping the old runtime")
        remote = [node for node in info.nodes if node.ssh is not None]
        installs = (await InstallRound.prepare(self._runner_for, self._wheelhouse, remote,
                                               info.head, progress, force=fresh)
                    if remote else None)
        head = info.head
        head_runner = self._runner_for(head)
        head_layout = NodeLayout(head.runtime_dir)
        # What the head decides (ports, tokens, which workers its Ray still counts) before
        # any Ray starts; each worker reads it once `decided` is set.
        decided = anyio.Event()
        worker_ports: dict[str, dict[str, int]] = {}
        plans: list[_StartPlan] = []  # the one the head decides
        recorded = anyio.Lock()  # checkpoints, one at a time: the last one holds every port
        started: dict[str, Any] = {}
        began = time.monotonic()

        def done(what: str, node: NodeInfo) -> None:
            # Where a start's time goes (they overlap): in the daemon's log.
            logger.info(f"{what} started", node=node.node_id,
                        seconds=round(time.monotonic() - began, 2))

        async def record(handle: RuntimeHandle) -> None:
            if checkpoint is not None:
                async with recorded:
                    await checkpoint(dataclasses.replace(handle, worker_ports=dict(worker_ports)))

        async def decide() -> None:
            nonlocal began
            # Both at once (each is a Python start on the head): the free ports are used only
            # if the head's Ray is to start anew.
            states: list[StatusReply] = []
            fresh_ports: dict[str, int] = {}

            async def ask_status() -> None:
                states.append(await node_helper.call(head_runner,
                                                     StatusRequest(dir=head_layout.run_dir)))

            async def pick_head_ports() -> None:
                fresh_ports.update(await self._free_ports(head, HEAD_PORTS))

            async with anyio.create_task_group() as asks:
                asks.start_soon(ask_status)
                asks.start_soon(pick_head_ports)
            (state,) = states
            running_at = state.ray.address  # None: not known (an older helper)
            head_alive = (state.ray.alive and bool(previous and previous.ports)
                          and running_at in (None, previous.ray_address if previous else None))
            if not head_alive and state.ray.alive:
                # A Ray head on ports other than recorded (or none recorded): starting anew on
                # fresh ports beside it would leave it holding the head (start-ray keeps a
                # live one) and new workers dialling ports it never opened. Stop it, and its
                # workers (none of which starts before this is decided).
                await self._stop_running(
                    cluster, info, progress,
                    "stopping a Ray head whose ports are not the recorded ones")
            elif not head_alive and state.agent.alive:
                # An agent outliving its Ray head is a driver of a cluster that is gone.
                await node_helper.call(head_runner,
                                       StopRequest(dir=head_layout.run_dir, parts=["agent"]))
            if head_alive:
                assert previous is not None
                ports: dict[str, int] = dict(previous.ports)
                worker_ports.update(previous.worker_ports)
                token = None  # nodes keep the token file Ray was started with
            else:
                ports = fresh_ports
                token = secrets.token_hex(32)
            # The agent's token stays what it was (an agent still running keeps it), unless
            # the runtime is replaced.
            agent_token = previous.agent_token if previous and not fresh else None
            agent_token = agent_token or new_token()
            address = f"{head.internal_ip}:{ports['gcs_port']}"
            listen = (f"unix:{self._agent_socket_dir / f'{cloud_name}.sock'}"
                      if head.ssh is None
                      else "unix:" + REMOTE_AGENT_SOCKET.format(key=ray_temp_key(cloud_name)))
            handle = RuntimeHandle(
                ports=ports, worker_ports={}, ray_address=address, agent_listen=listen,
                agent_token=agent_token,
                # The head is this machine: its socket, directly; else over SSH, by a tunnel.
                agent_endpoint=listen if head.ssh is None else None, head_ssh=head.ssh)
            await record(handle)
            # A worker whose Ray runs but which the head's Ray no longer counts (cut off for
            # a while: the head marked it dead, and it has not heard yet) is started anew.
            members = (await self._ray_members(cluster, cloud_name, previous) if head_alive
                       else None)
            # With Ray up on the head, a worker that needs a start must get the token it
            # runs with.
            ray_token = token if token is not None else (await node_helper.call(
                head_runner, ReadTokenRequest(path=head_layout.token_path))).token
            plans.append(_StartPlan(handle, members, ray_token, address, agent_token))
            await progress(f"starting Ray on {len(info.nodes)} node(s)", "ray")
            began = time.monotonic()
            decided.set()

        async def start_head() -> None:
            plan = plans[0]
            await self._start_ray_node(cloud_name, head, plan.handle.ports, plan.ray_token,
                                       plan.address, head=True)
            done("head's Ray", head)
            await progress("starting the agent on the head node", "agent")

        async def start_agent() -> None:
            # Beside the head's Ray: the agent's own start (Python, its imports) overlaps
            # Ray's, and its connect waits for the head's Ray to take drivers.
            handle = plans[0].handle
            started.update((await node_helper.call(
                head_runner,
                StartAgentRequest(
                    dir=head_layout.run_dir,
                    listen=handle.agent_listen or "",  # set by `decide` above
                    token=plans[0].agent_token,
                    state_dir=head_layout.agent_state,
                    ray_address=plans[0].address,
                    cluster_name=cluster,
                    env=self._ray_env(head_layout, handle.ports, head),
                    timeout=self._start_timeout_s,
                    # Every node's run dir has the same form (in its user's home), so the
                    # agent can stop the whole cluster when autostop falls due with no daemon
                    # about.
                    node_run_dir=head_layout.run_dir,
                    autostop_grace=self._agent_autostop_grace_s,
                    job_retention=self._agent_job_retention,
                    shutdown_nodes=info.shutdown_to_stop,
                ),
                timeout_s=self._start_timeout_s + 30,
            )).to_dict())
            done("agent", head)

        async def head_node() -> None:
            if installs is not None and head.ssh is not None:
                await installs.node(head)
            await decide()
            async with anyio.create_task_group() as group:
                group.start_soon(start_head)
                group.start_soon(start_agent)

        async def worker_node(node: NodeInfo) -> None:
            # Each on its own: installed once the head has, while the head starts; its ports
            # picked once the head has decided, and its Ray's imports done beside the head's
            # start; its own start goes on once the head's node is registered, as its
            # Ray needs (agent/ray_start.py asks the GCS every 50 ms: no word from here).
            if installs is not None and node.ssh is not None:
                await installs.node(node)
            with anyio.fail_after(self._start_timeout_s * 4):  # the head's install and start
                await decided.wait()
            plan = plans[0]
            if _node_key(node) not in worker_ports:
                worker_ports[_node_key(node)] = await self._free_ports(node, WORKER_PORTS)
                await record(plan.handle)
            await self._start_ray_node(cloud_name, node, worker_ports[_node_key(node)],
                                       plan.ray_token, plan.address, False, plan.members)
            done("worker's Ray", node)

        with first_error():
            async with anyio.create_task_group() as group:
                group.start_soon(head_node)
                group.start_soon(on_each, info.nodes[1:], worker_node)
        handle = dataclasses.replace(plans[0].handle, worker_ports=dict(worker_ports))
        handle = dataclasses.replace(handle, agent_socket=str(started["socket"]))
        await fault_point("launch.after_agent")
        await self._access.reset(cluster)
        endpoint = await self._access.endpoint(cluster, cloud_name, handle)
        await self._wait_for_nodes(cluster, endpoint, plans[0].agent_token, len(info.nodes))
        logger.info("runtime up", nodes=len(info.nodes),
                    seconds=round(time.monotonic() - began, 2))
        return handle

    async def _ray_members(self, cluster: str, cloud_name: str,
                           previous: RuntimeHandle | None) -> set[str] | None:
        """The node addresses the head's Ray counts alive, asked of the running agent; None
        when it cannot tell (no agent, or it does not answer)."""
        if previous is None or not previous.agent_token:
            return None
        client = None
        try:
            with anyio.fail_after(MEMBERS_TIMEOUT_S):
                endpoint = await self._access.endpoint(cluster, cloud_name, previous)
                client = AgentClient(cluster, endpoint, previous.agent_token)
                health = await client.check_version()
        except (ProtocolError, TimeoutError) as exc:
            logger.info("cannot ask the head which nodes Ray counts", cluster=cluster,
                        error=str(exc))
            return None
        finally:
            if client is not None:
                await client.close()
        return set(health.ray_node_ips) if health.ray_connected else None

    async def _stop_running(self, cluster: str, info: ClusterInfo, progress: Progress,
                            why: str) -> None:
        """Stop what runs on the nodes before a fresh start, the daemon's agent link first."""
        await progress(why, "ray")
        await self._access.close(cluster)
        await self.stop(info)

    async def _free_ports(self, node: NodeInfo, names: tuple[str, ...]) -> dict[str, int]:
        found = await node_helper.call(self._runner_for(node),
                                       FreePortsRequest(count=len(names)))
        return dict(zip(names, found.ports, strict=True))

    def _ray_env(self, layout: NodeLayout, ports: dict[str, int], node: NodeInfo) -> dict[str, str]:
        env = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": layout.token_path}
        if "autoscaler_metric_port" in ports:
            env["AUTOSCALER_METRIC_PORT"] = str(ports["autoscaler_metric_port"])
            env["DASHBOARD_METRIC_PORT"] = str(ports["dashboard_metric_port"])
        if node.internal_ip == "127.0.0.1":
            # Otherwise Ray swaps 127.0.0.1 for this machine's outward address, and a local
            # cluster would talk to itself through a non-loopback interface.
            env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
        return env

    async def _start_ray_node(
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
                await self._stop_node(node, ["ray"])
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
            env=self._ray_env(layout, ports, node),
            timeout=self._start_timeout_s,
            gcs_port=ports["gcs_port"] if head else None,
            head_address="" if head else address,
        )
        await node_helper.call(runner, request, timeout_s=self._start_timeout_s + 30)

    async def _wait_for_nodes(self, cluster: str, endpoint: str, token: str,
                              expected: int) -> None:
        client = AgentClient(cluster, endpoint, token)
        seen = 0
        last: ProtocolError | None = None
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
                        last = exc
                    await anyio.sleep(NODES_POLL_S)
        except TimeoutError:
            if last is not None and not seen:
                raise last from None
            raise ProtocolError(
                ErrorCode.PROVIDER_ERROR,
                f"only {seen} of {expected} nodes joined the Ray cluster within "
                f"{self._start_timeout_s:.0f} s",
                "see the Ray logs in the runtime directory of each node",
            ) from None
        finally:
            await client.close()

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
        await self._stop_node(info.head, ["agent"])
        await on_each(info.nodes[1:], lambda node: self._stop_node(node, ["ray"]))
        await self._stop_node(info.head, ["ray"])

    async def _stop_node(self, node: NodeInfo, parts: list[str]) -> None:
        # Never installed (a launch cut short): nothing of ours runs there.
        with contextlib.suppress(node_helper.RuntimeMissing):
            await node_helper.call(
                self._runner_for(node),
                StopRequest(dir=NodeLayout(node.runtime_dir).run_dir, parts=parts),
                timeout_s=90,
            )

    async def remove_files(self, cloud_name: str, info: ClusterInfo) -> None:
        async def clean(node: NodeInfo) -> None:
            with contextlib.suppress(node_helper.RuntimeMissing):  # never installed
                await node_helper.call(
                    self._runner_for(node),
                    CleanupRequest(paths=[node.runtime_dir],
                                   ray_temp_keys=[ray_temp_key(cloud_name)]))

        await on_each(info.nodes, clean)
