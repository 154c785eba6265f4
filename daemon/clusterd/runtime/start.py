"""One start of a cluster's runtime, as phases: Ray on each node and the agent on the head,
started all at once (a worker's helper waits for the head's port to open, the agent's Ray
connect for the head's Ray to take drivers: each start's Python and imports overlap the
others').

The phases, and who runs them:

    prepare            before any node: stop an old runtime (`fresh`), check the wheelhouse
                       and which remote nodes need it (InstallRound.prepare)
    head:    install → decide → ray head ┐ (both at once)
                                → agent   ┘
    each worker: install → (wait for decide) → ray worker
    ready              after every node: the agent answers and sees every node

Each node goes on as soon as it is ready: the head installs, decides the ports and starts
Ray and the agent; a worker installs, picks its ports once the head has decided, and starts
its Ray beside the head's. What the phases share is one `StartState`; the rule beside each
of its fields says who writes it and when the others may read it.

A start is idempotent and doubles as repair: what is already running is kept, what died is
started again, and the cluster is ready only once the agent answers and sees every node.

The agent listens on a Unix socket in a 0700 directory of the head's user (`~/.clusterd/s/`,
short: socket paths end at 107 bytes) and holds the runtime's token (node_shared/auth.py), made here
and recorded with the runtime before anything starts.
"""

from __future__ import annotations

import dataclasses
import secrets
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio

from clusterctl.protocol import ErrorCode, ProtocolError
from clusterd import log
from clusterd.concurrency import first_error, on_each
from clusterd.faults import fault_point
from clusterd.node_shared.auth import new_token
from clusterd.node_shared.node_commands import (
    ReadTokenRequest,
    StartAgentReply,
    StartAgentRequest,
    StatusReply,
    StatusRequest,
    StopRequest,
)
from clusterd.nodes import ClusterInfo, NodeInfo
from clusterd.runtime import node_helper
from clusterd.runtime.agent_access import AgentAccess
from clusterd.runtime.agent_client import AgentClient
from clusterd.runtime.install import WheelhouseBuilder
from clusterd.runtime.install_round import InstallRound
from clusterd.runtime.ray_node import (
    HEAD_PORTS,
    WORKER_PORTS,
    NodeLayout,
    RayNodes,
    ray_env,
    ray_temp_key,
)
from clusterd.runtime.runner import CommandRunner
from clusterd.state.handles import RuntimeHandle

logger = log.get("clusterd.runtime")

Progress = Callable[[str, str], Awaitable[None]]
Checkpoint = Callable[[RuntimeHandle], Awaitable[None]]

# Where the agent's socket lives on a remote head (its directory is made 0700 there).
REMOTE_AGENT_SOCKET = "~/.clusterd/s/{key}.sock"
MEMBERS_TIMEOUT_S = 15.0  # asking a running agent which nodes Ray counts
# Between asks of a new agent whether every node joined: each is one small call on the
# agent link, and the launch waits on it.
NODES_POLL_S = 0.1


@dataclasses.dataclass(frozen=True)
class StartSettings:
    """What every start of a runtime is given by the daemon (one per daemon)."""

    runner_for: Callable[[NodeInfo], CommandRunner]
    access: AgentAccess
    wheelhouse: WheelhouseBuilder
    ray: RayNodes
    agent_socket_dir: Path  # where a local head's agent listens
    start_timeout_s: float  # each Ray's and the agent's start; every node joining
    agent_autostop_grace_s: float
    agent_job_retention: int


@dataclasses.dataclass(frozen=True)
class StartPlan:
    """What the head decides before any Ray starts, for every node's start."""

    handle: RuntimeHandle  # without worker_ports: StartState keeps those as workers pick them
    members: set[str] | None  # the workers the head's running Ray counts (None: not known)
    ray_token: str
    address: str  # the head's GCS
    agent_token: str


@dataclasses.dataclass
class StartState:
    """What the phases of one start share. They are tasks on one event loop (the head's and
    each worker's at once), so no field is torn; the rules are about order."""

    # Set by `decide`, once and last (after `plan` and the recorded `worker_ports`): no
    # worker reads either before it is set.
    decided: anyio.Event = dataclasses.field(default_factory=anyio.Event)
    # Written once, by `decide` (the head's task), before `decided` is set.
    plan: StartPlan | None = None
    # Each worker's Ray ports, by node id: the previous runtime's, copied by `decide` before
    # `decided` is set; after it, each worker adds its own key (and only its own) when it
    # picks its ports. Every checkpoint copies it whole, under `recording`.
    worker_ports: dict[str, dict[str, int]] = dataclasses.field(default_factory=dict)
    # Checkpoints one at a time: the last one written holds every port picked before it.
    recording: anyio.Lock = dataclasses.field(default_factory=anyio.Lock)
    # The agent's start reply (its socket): written by `start_agent`; read by `ready` only,
    # after every node's task has ended.
    agent_started: StartAgentReply | None = None
    # When the start began, and again when the Ray starts begin (`decide` resets it as it
    # says so): the daemon's log times each start from it.
    began: float = dataclasses.field(default_factory=time.monotonic)


def _node_key(node: NodeInfo) -> str:
    return node.node_id


class RuntimeStart:
    """One start of one cluster's runtime (see the module docstring for its phases). Make
    one per start and `run` it once."""

    def __init__(self, settings: StartSettings, cluster: str, cloud_name: str,
                 info: ClusterInfo, previous: RuntimeHandle | None, progress: Progress, *,
                 fresh: bool, checkpoint: Checkpoint | None) -> None:
        self._s = settings
        self._cluster = cluster
        self._cloud_name = cloud_name
        self._info = info
        self._previous = previous
        self._progress = progress
        self._fresh = fresh
        self._checkpoint = checkpoint
        self._head = info.head
        self._head_runner = settings.runner_for(info.head)
        self._head_layout = NodeLayout(info.head.runtime_dir)
        self._installs: InstallRound | None = None  # set by `prepare`, for remote nodes
        self.state = StartState()

    async def run(self) -> RuntimeHandle:
        """Every phase; returns the runtime handle to store."""
        await self.prepare()
        await self.start_nodes()
        return await self.ready()

    # -- phases -------------------------------------------------------------------------

    async def prepare(self) -> None:
        """Before any node goes on: with `fresh`, whatever runs is stopped (a runtime of
        another version); the remote nodes' installs are prepared."""
        if self._fresh:
            await self._stop_running("stopping the old runtime")
        remote = [node for node in self._info.nodes if node.ssh is not None]
        if remote:
            self._installs = await InstallRound.prepare(
                self._s.runner_for, self._s.wheelhouse, remote, self._head, self._progress,
                force=self._fresh)

    async def start_nodes(self) -> None:
        """The head's phases and every worker's at once, each node going on when it can."""
        with first_error():
            async with anyio.create_task_group() as group:
                group.start_soon(self._head_node)
                group.start_soon(on_each, self._info.nodes[1:], self._worker_node)

    async def install(self, node: NodeInfo) -> None:
        """The runtime on a remote node (a worker's after the head's has arrived)."""
        if self._installs is not None and node.ssh is not None:
            await self._installs.node(node)

    async def decide(self) -> None:
        """On the head, before any Ray starts: which Ray to keep, its ports and the tokens;
        checkpointed, then `decided` is set for the workers."""
        status, fresh_ports = await self._probe_head()
        head_alive = await self._clear_stale_head(status)
        previous = self._previous
        if head_alive:
            assert previous is not None
            ports: dict[str, int] = dict(previous.ports)
            self.state.worker_ports.update(previous.worker_ports)
            token = None  # nodes keep the token file Ray was started with
        else:
            ports = fresh_ports
            token = secrets.token_hex(32)
        # The agent's token stays what it was (an agent still running keeps it), unless
        # the runtime is replaced.
        agent_token = previous.agent_token if previous and not self._fresh else None
        agent_token = agent_token or new_token()
        address = f"{self._head.internal_ip}:{ports['gcs_port']}"
        handle = self._handle(ports, address, agent_token)
        await self._record(handle)
        # A worker whose Ray runs but which the head's Ray no longer counts (cut off for
        # a while: the head marked it dead, and it has not heard yet) is started anew.
        members = await self._ray_members() if head_alive else None
        # With Ray up on the head, a worker that needs a start must get the token it
        # runs with.
        ray_token = token if token is not None else (await node_helper.call(
            self._head_runner, ReadTokenRequest(path=self._head_layout.token_path))).token
        self.state.plan = StartPlan(handle, members, ray_token, address, agent_token)
        await self._progress(f"starting Ray on {len(self._info.nodes)} node(s)", "ray")
        self.state.began = time.monotonic()
        self.state.decided.set()

    async def start_head_ray(self) -> None:
        plan = self._plan
        await self._s.ray.start(self._cloud_name, self._head, plan.handle.ports,
                                plan.ray_token, plan.address, head=True)
        self._done("head's Ray", self._head)
        await self._progress("starting the agent on the head node", "agent")

    async def start_agent(self) -> None:
        """Beside the head's Ray: the agent's own start (Python, its imports) overlaps
        Ray's, and its connect waits for the head's Ray to take drivers."""
        plan = self._plan
        handle = plan.handle
        layout = self._head_layout
        self.state.agent_started = await node_helper.call(
            self._head_runner,
            StartAgentRequest(
                dir=layout.run_dir,
                listen=handle.agent_listen or "",  # set by `decide` (`_handle`)
                token=plan.agent_token,
                state_dir=layout.agent_state,
                ray_address=plan.address,
                cluster_name=self._cluster,
                env=ray_env(layout, handle.ports, self._head),
                timeout=self._s.start_timeout_s,
                # Every node's run dir has the same form (in its user's home), so the agent
                # can stop the whole cluster when autostop falls due with no daemon about.
                node_run_dir=layout.run_dir,
                autostop_grace=self._s.agent_autostop_grace_s,
                job_retention=self._s.agent_job_retention,
                shutdown_nodes=self._info.shutdown_to_stop,
            ),
            timeout_s=self._s.start_timeout_s + 30,
        )
        self._done("agent", self._head)

    async def start_worker_ray(self, node: NodeInfo) -> None:
        """Once the head has decided: the worker's ports (picked once, and checkpointed
        before its Ray starts), then its Ray."""
        plan = self._plan
        ports = self.state.worker_ports
        if _node_key(node) not in ports:
            ports[_node_key(node)] = await self._s.ray.free_ports(node, WORKER_PORTS)
            await self._record(plan.handle)
        await self._s.ray.start(self._cloud_name, node, ports[_node_key(node)],
                                plan.ray_token, plan.address, False, plan.members)
        self._done("worker's Ray", node)

    async def ready(self) -> RuntimeHandle:
        """After every node's phases: the handle as it stands, once the agent answers and
        counts every node."""
        assert self.state.agent_started is not None
        handle = dataclasses.replace(self._plan.handle,
                                     worker_ports=dict(self.state.worker_ports))
        handle = dataclasses.replace(handle, agent_socket=self.state.agent_started.socket)
        await fault_point("launch.after_agent")
        await self._s.access.reset(self._cluster)
        endpoint = await self._s.access.endpoint(self._cluster, self._cloud_name, handle)
        await self._wait_for_nodes(endpoint, self._plan.agent_token, len(self._info.nodes))
        logger.info("runtime up", nodes=len(self._info.nodes),
                    seconds=round(time.monotonic() - self.state.began, 2))
        return handle

    # -- each node's task ---------------------------------------------------------------

    async def _head_node(self) -> None:
        await self.install(self._head)
        await self.decide()
        async with anyio.create_task_group() as group:
            group.start_soon(self.start_head_ray)
            group.start_soon(self.start_agent)

    async def _worker_node(self, node: NodeInfo) -> None:
        # Each on its own: installed once the head has, while the head starts; its ports
        # picked once the head has decided, and its Ray's imports done beside the head's
        # start; its own start goes on once the head's node is registered, as its
        # Ray needs (agent/ray_start.py asks the GCS every 50 ms: no word from here).
        await self.install(node)
        with anyio.fail_after(self._s.start_timeout_s * 4):  # the head's install and start
            await self.state.decided.wait()
        await self.start_worker_ray(node)

    # -- pieces of the phases -----------------------------------------------------------

    @property
    def _plan(self) -> StartPlan:
        plan = self.state.plan
        assert plan is not None, "read before the head decided"
        return plan

    async def _probe_head(self) -> tuple[StatusReply, dict[str, int]]:
        """What runs on the head, and ports free there, asked at once (each is a Python
        start on the head): the ports are used only if the head's Ray is to start anew."""
        statuses: list[StatusReply] = []
        fresh_ports: dict[str, int] = {}

        async def ask_status() -> None:
            statuses.append(await node_helper.call(
                self._head_runner, StatusRequest(dir=self._head_layout.run_dir)))

        async def pick_head_ports() -> None:
            fresh_ports.update(await self._s.ray.free_ports(self._head, HEAD_PORTS))

        async with anyio.create_task_group() as asks:
            asks.start_soon(ask_status)
            asks.start_soon(pick_head_ports)
        (status,) = statuses
        return status, fresh_ports

    async def _clear_stale_head(self, status: StatusReply) -> bool:
        """Whether the head's Ray runs as recorded (then it is kept); what runs otherwise
        is stopped."""
        previous = self._previous
        running_at = status.ray.address  # None: not known (an older helper)
        head_alive = (status.ray.alive and bool(previous and previous.ports)
                      and running_at in (None, previous.ray_address if previous else None))
        if not head_alive and status.ray.alive:
            # A Ray head on ports other than recorded (or none recorded): starting anew on
            # fresh ports beside it would leave it holding the head (start-ray keeps a
            # live one) and new workers dialling ports it never opened. Stop it, and its
            # workers (none of which starts before this is decided).
            await self._stop_running("stopping a Ray head whose ports are not the recorded ones")
        elif not head_alive and status.agent.alive:
            # An agent outliving its Ray head is a driver of a cluster that is gone. (Not
            # RayNodes.stop: the runtime is there, the status just said so.)
            await node_helper.call(self._head_runner,
                                   StopRequest(dir=self._head_layout.run_dir, parts=["agent"]))
        return head_alive

    def _handle(self, ports: dict[str, int], address: str, agent_token: str) -> RuntimeHandle:
        """The runtime's handle as decided (the workers' ports are added as they pick)."""
        head = self._head
        listen = (f"unix:{self._s.agent_socket_dir / f'{self._cloud_name}.sock'}"
                  if head.ssh is None
                  else "unix:" + REMOTE_AGENT_SOCKET.format(key=ray_temp_key(self._cloud_name)))
        return RuntimeHandle(
            ports=ports, worker_ports={}, ray_address=address, agent_listen=listen,
            agent_token=agent_token,
            # The head is this machine: its socket, directly; else over SSH, by a tunnel.
            agent_endpoint=listen if head.ssh is None else None, head_ssh=head.ssh)

    async def _record(self, handle: RuntimeHandle) -> None:
        if self._checkpoint is not None:
            async with self.state.recording:
                await self._checkpoint(dataclasses.replace(
                    handle, worker_ports=dict(self.state.worker_ports)))

    def _done(self, what: str, node: NodeInfo) -> None:
        # Where a start's time goes (they overlap): in the daemon's log.
        logger.info(f"{what} started", node=node.node_id,
                    seconds=round(time.monotonic() - self.state.began, 2))

    async def _stop_running(self, why: str) -> None:
        """Stop what runs on the nodes before a fresh start, the daemon's agent link first."""
        await self._progress(why, "ray")
        await self._s.access.close(self._cluster)
        await self._s.ray.stop_cluster(self._info)

    async def _ray_members(self) -> set[str] | None:
        """The node addresses the head's Ray counts alive, asked of the running agent; None
        when it cannot tell (no agent, or it does not answer)."""
        previous = self._previous
        if previous is None or not previous.agent_token:
            return None
        client = None
        try:
            with anyio.fail_after(MEMBERS_TIMEOUT_S):
                endpoint = await self._s.access.endpoint(self._cluster, self._cloud_name,
                                                         previous)
                client = AgentClient(self._cluster, endpoint, previous.agent_token)
                health = await client.check_version()
        except (ProtocolError, TimeoutError) as exc:
            logger.info("cannot ask the head which nodes Ray counts", cluster=self._cluster,
                        error=str(exc))
            return None
        finally:
            if client is not None:
                await client.close()
        return set(health.ray_node_ips) if health.ray_connected else None

    async def _wait_for_nodes(self, endpoint: str, token: str, expected: int) -> None:
        client = AgentClient(self._cluster, endpoint, token)
        seen = 0
        last: ProtocolError | None = None
        timeout_s = self._s.start_timeout_s
        try:
            with anyio.fail_after(timeout_s):
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
                f"{timeout_s:.0f} s",
                "see the Ray logs in the runtime directory of each node",
            ) from None
        finally:
            await client.close()
