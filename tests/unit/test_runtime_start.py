"""The phases of a runtime's start (runtime/start.py) against scripted nodes: what the head
decides, what is checkpointed before which start, and which starts overlap. The nodes read
the node helper's typed requests and answer with its typed replies (node_shared/node_commands)
in memory; the agent's part (`ready`) is the real-peer tests'."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio
import pytest

from clusterctl.protocol import ErrorCode, ProtocolError
from clusterd.commands import CommandResult
from clusterd.node_shared.node_commands import (
    TYPED_REQUESTS,
    FreePortsReply,
    Message,
    ProcessState,
    ReadTokenReply,
    Request,
    StartAgentReply,
    StartRayReply,
    StatusReply,
    StopReply,
)
from clusterd.nodes import ClusterInfo, NodeInfo, NodeStatus
from clusterd.runtime.ray_node import HEAD_PORTS, RayNodes
from clusterd.runtime.start import RuntimeStart, StartSettings
from clusterd.state.handles import RuntimeHandle

# Long enough for a loaded machine; only reached when a start that should overlap another
# waits for it instead (then the test fails rather than hangs).
OVERLAP_WAIT_S = 10.0
REQUEST_TYPES = {request.command: request for request in TYPED_REQUESTS}


@dataclasses.dataclass(frozen=True)
class Checkpointed:
    """A checkpoint in the nodes' log: the workers whose ports it holds."""

    workers: list[str]


class Nodes:
    """Every node's helper, scripted: what runs on the head, and a log of each call (and
    each checkpoint) in the order they happened."""

    def __init__(self, head_ray_alive: bool = False, head_ray_address: str | None = None,
                 head_agent_alive: bool = False) -> None:
        self.log: list[tuple[str, str, Request[Any] | Checkpointed]] = []
        self.head_ray_alive = head_ray_alive
        self.head_ray_address = head_ray_address
        self.head_agent_alive = head_agent_alive
        self.next_port = 20000
        # A call (node, command) that must not finish before others (node, command) began.
        self.waits: dict[tuple[str, str], list[tuple[str, str]]] = {}
        self._began: dict[tuple[str, str], anyio.Event] = {}

    def began(self, node: str, command: str) -> anyio.Event:
        return self._began.setdefault((node, command), anyio.Event())

    async def answer(self, node: str, command: str, params: dict[str, Any]) -> Message:
        # Read as the node helper reads it: a field it needs and is not sent fails here.
        request = REQUEST_TYPES[command].from_dict(params)
        self.log.append((node, command, request))
        self.began(node, command).set()
        with anyio.fail_after(OVERLAP_WAIT_S):
            for other in self.waits.get((node, command), []):
                await self.began(*other).wait()
        if command == "status":
            head = node == "head"
            return StatusReply(
                ray=ProcessState(alive=self.head_ray_alive and head, pid=None,
                                 address=self.head_ray_address if head else None),
                agent=ProcessState(alive=self.head_agent_alive and head, pid=None))
        if command == "free-ports":
            count = params["count"]
            self.next_port += count
            return FreePortsReply(ports=list(range(self.next_port - count, self.next_port)))
        if command == "read-token":
            return ReadTokenReply(token="the-running-token")
        if command == "start-agent":
            return StartAgentReply(started=True, pid=2, socket="/run/agent.sock")
        if command == "start-ray":
            return StartRayReply(started=True, pid=1)
        assert command == "stop", command
        return StopReply()

    def calls(self, command: str) -> list[tuple[str, Any]]:
        """Each call of `command`: its node and its typed request."""
        return [(node, request) for node, what, request in self.log if what == command]


class ScriptedRunner:
    node_name: str
    python = "python3"

    def __init__(self, nodes: Nodes, node_name: str) -> None:
        self._nodes = nodes
        self.node_name = node_name

    async def run(self, argv: Sequence[str], *, input: bytes | Path | None = None,
                  timeout_s: float = 120) -> CommandResult:
        assert list(argv[1:3]) == ["-m", "clusterd.agent.node"] and isinstance(input, bytes)
        reply = await self._nodes.answer(self.node_name, argv[3], json.loads(input))
        return CommandResult(0, json.dumps(reply.to_dict()).encode(), b"")


class NoAgent:
    """An agent link that never answers: a running head's members are then not known."""

    async def endpoint(self, cluster: str, cloud_name: str,
                       runtime: RuntimeHandle | None) -> str:
        raise ProtocolError(ErrorCode.AGENT_UNREACHABLE, "no agent here")

    async def close(self, cluster: str) -> None:
        return None


def cluster(workers: int) -> ClusterInfo:
    names = ["head", *(f"w{i}" for i in range(1, workers + 1))]
    return ClusterInfo(tuple(NodeInfo(name, f"10.0.0.{i + 1}", NodeStatus.RUNNING, cpus=1)
                             for i, name in enumerate(names)))


def start_nodes(nodes: Nodes, info: ClusterInfo, previous: RuntimeHandle | None = None,
                ) -> tuple[RuntimeStart, list[RuntimeHandle], list[str]]:
    """The start's phases up to (not including) the agent's readiness; the start, every
    checkpoint, and every progress line."""
    checkpoints: list[RuntimeHandle] = []
    said: list[str] = []

    def runner_for(node: NodeInfo) -> ScriptedRunner:
        return ScriptedRunner(nodes, node.node_id)

    async def checkpoint(handle: RuntimeHandle) -> None:
        checkpoints.append(handle)
        nodes.log.append(("daemon", "checkpoint", Checkpointed(sorted(handle.worker_ports))))

    async def progress(message: str, phase: str) -> None:
        said.append(message)

    async def main() -> RuntimeStart:
        settings = StartSettings(runner_for, NoAgent(), None, RayNodes(runner_for, 1 << 20, 30),
                                 Path("/run/agents"), 30.0, 300.0, 1000)  # type: ignore[arg-type]
        start = RuntimeStart(settings, "c", "c-1234", info, previous, progress, fresh=False,
                             checkpoint=checkpoint)
        await start.prepare()
        await start.start_nodes()
        return start

    return anyio.run(main), checkpoints, said


def test_a_new_cluster_checkpoints_each_workers_ports_before_its_ray_starts() -> None:
    nodes = Nodes()
    start, checkpoints, said = start_nodes(nodes, cluster(workers=2))

    plan = start.state.plan
    assert plan is not None and plan.members is None
    assert plan.address == f"10.0.0.1:{plan.handle.ports['gcs_port']}"
    assert sorted(plan.handle.ports) == sorted(HEAD_PORTS)
    # The head's handle is recorded before any Ray starts.
    first_start = next(i for i, (_, what, _) in enumerate(nodes.log) if what == "start-ray")
    assert [what for _, what, _ in nodes.log[:first_start]].count("checkpoint") >= 1
    # Each worker's ports are in a checkpoint before its Ray starts, and the last
    # checkpoint holds every worker's.
    for worker in ("w1", "w2"):
        started_at = nodes.log.index(next(e for e in nodes.log
                                          if e[0] == worker and e[1] == "start-ray"))
        assert any(isinstance(entry, Checkpointed) and worker in entry.workers
                   for _, _, entry in nodes.log[:started_at])
    assert sorted(checkpoints[-1].worker_ports) == ["w1", "w2"]
    assert checkpoints[-1].worker_ports == start.state.worker_ports
    # Every Ray got the token the head decided, and workers dial the head's GCS.
    tokens = {request.token for _, request in nodes.calls("start-ray")}
    assert tokens == {plan.ray_token}
    assert {request.head_address for node, request in nodes.calls("start-ray")
            if node != "head"} == {plan.address}
    assert said == ["starting Ray on 3 node(s)", "starting the agent on the head node"]
    assert start.state.agent_started is not None
    assert start.state.agent_started.socket == "/run/agent.sock"


def test_the_heads_ray_the_agent_and_the_workers_ray_start_at_once() -> None:
    nodes = Nodes()
    # Each start finishes only once the others have begun: a start that waited for
    # another one would leave this waiting (and fail).
    starts = [("head", "start-ray"), ("head", "start-agent"), ("w1", "start-ray"),
              ("w2", "start-ray")]
    nodes.waits = {start: [other for other in starts if other != start] for start in starts}
    start_nodes(nodes, cluster(workers=2))
    assert {node for node, _ in nodes.calls("start-ray")} == {"head", "w1", "w2"}


def test_a_running_head_as_recorded_is_kept_with_its_ports_and_token() -> None:
    previous = RuntimeHandle(ports={"gcs_port": 6380, "dashboard_port": 8266},
                             worker_ports={"w1": {"node_manager_port": 7001}},
                             ray_address="10.0.0.1:6380", agent_token="agent-token")
    nodes = Nodes(head_ray_alive=True, head_ray_address="10.0.0.1:6380")
    start, checkpoints, said = start_nodes(nodes, cluster(workers=2), previous)

    plan = start.state.plan
    assert plan is not None
    assert plan.handle.ports == previous.ports and plan.address == "10.0.0.1:6380"
    assert plan.ray_token == "the-running-token" and plan.agent_token == "agent-token"
    # w1 keeps its recorded ports; only w2 (and the head, for a fresh start it did not
    # need) picked any.
    assert start.state.worker_ports["w1"] == {"node_manager_port": 7001}
    # The first checkpoint (before any start) holds the ports recorded before.
    assert checkpoints[0].worker_ports == previous.worker_ports
    assert sorted(node for node, _ in nodes.calls("free-ports")) == ["head", "w2"]
    assert not nodes.calls("stop")
    assert said == ["starting Ray on 3 node(s)", "starting the agent on the head node"]


def test_a_ray_head_on_unrecorded_ports_is_stopped_before_anything_starts() -> None:
    previous = RuntimeHandle(ports={"gcs_port": 6380}, ray_address="10.0.0.1:6380",
                             agent_token="agent-token")
    nodes = Nodes(head_ray_alive=True, head_ray_address="10.0.0.1:7777")
    start, _, said = start_nodes(nodes, cluster(workers=1), previous)

    stops = [(node, request.parts) for node, request in nodes.calls("stop")]
    # The agent, then the workers' Ray, then the head's (see RayNodes.stop_cluster).
    assert stops == [("head", ["agent"]), ("w1", ["ray"]), ("head", ["ray"])]
    last_stop = max(i for i, (_, what, _) in enumerate(nodes.log) if what == "stop")
    first_start = min(i for i, (_, what, _) in enumerate(nodes.log) if what == "start-ray")
    assert last_stop < first_start
    plan = start.state.plan
    assert plan is not None and plan.handle.ports["gcs_port"] != 6380
    assert plan.ray_token != "the-running-token"
    assert said[0] == "stopping a Ray head whose ports are not the recorded ones"


@pytest.mark.parametrize("agent_alive", [True, False])
def test_an_agent_outliving_its_ray_head_is_stopped(agent_alive: bool) -> None:
    nodes = Nodes(head_ray_alive=False, head_agent_alive=agent_alive)
    start_nodes(nodes, cluster(workers=0))
    stops = [(node, request.parts) for node, request in nodes.calls("stop")]
    assert stops == ([("head", ["agent"])] if agent_alive else [])
