"""The agent against a real two-node Ray cluster (two raylets, on 127.0.0.2 and 127.0.0.3),
driven over gRPC exactly as the daemon drives it."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import anyio
import grpc
import psutil
import pytest

from clusterctl._version import __version__
from clusterctl.protocol import ErrorCode, JobStatus, ProtocolError
from clusterd.agent.v1 import agent_pb2 as pb
from clusterd.agent.v1 import agent_pb2_grpc as pb_grpc
from clusterd.node_shared.auth import (
    AUTH_METADATA,
    MAX_NONCES_OUTSTANDING,
    MAX_NONCES_PER_CALL,
    daemon_credential,
    new_nonce,
    new_token,
)
from clusterd.node_shared.wire import AGENT_PROTOCOL
from clusterd.runtime.agent_client import AgentClient, AgentConnections, job_spec_to_pb
from tests.integration.agent_bed import (
    AgentCluster,
    helper,
    run_to_end,
    spec,
    wait_file,
    wait_status,
)
from tests.support import pid_alive, wait_for

pytestmark = [pytest.mark.ray, pytest.mark.anyio]


def ray_processes(run_dir: Path) -> list[str]:
    """The command lines of a node's `ray start` and everything it started."""
    record = json.loads((run_dir / "ray.pid").read_text())
    started = psutil.Process(int(record["pid"]))
    commands = []
    for process in [started, *started.children(recursive=True)]:
        command = command_of(process)
        # A child forked but not yet exec'd (a raylet starting a worker) still shows its
        # parent's command line: it is not a process of its own kind.
        try:
            parent = process.parent()
        except psutil.NoSuchProcess:
            parent = None
        if command and (parent is None or command != command_of(parent)):
            commands.append(command)
    return commands


def test_each_node_runs_only_the_ray_processes_we_use(agent_cluster: AgentCluster) -> None:
    # No Ray Client server (nothing speaks it), no autoscaler monitor (the daemon adds the
    # nodes), no log monitor (the agent's driver takes no worker output), no dashboard (off,
    # yet Ray started it to serve usage stats): each is a Python process that costs CPU at
    # every start and memory for the cluster's life. And one prestarted worker per node, not
    # one per CPU.
    head = ray_processes(agent_cluster.head_run)
    worker = ray_processes(agent_cluster.root / "worker" / "run")
    for processes, node_kind in ((head, "head"), (worker, "worker")):
        (raylet,) = [p for p in processes if "raylet/raylet" in p]
        assert "--num_prestart_python_workers=1 " in raylet, (node_kind, raylet)
        unwanted = [p for p in processes if "ray.util.client.server" in p
                    or "log_monitor.py" in p or "autoscaler/_private/monitor.py" in p
                    or "dashboard/dashboard.py" in p]
        assert unwanted == [], (node_kind, unwanted)
    assert any("gcs_server" in p for p in head), head


def command_of(process: psutil.Process) -> str:
    """Its command line; "" if it ended since it was listed (Ray's short-lived helpers)."""
    try:
        return " ".join(process.cmdline())
    except psutil.NoSuchProcess:
        return ""


def test_each_raylet_retries_its_connects_often(agent_cluster: AgentCluster) -> None:
    # A raylet connects to its own object store at once; when the store's thread has not
    # listened yet (a busy machine), Ray's default waits a whole second before it tries again.
    # Every raylet (and what it starts) gets ray_start's retry settings: 50 ms apart, with the
    # same 10 s in all.
    for run_dir in (agent_cluster.head_run, agent_cluster.root / "worker" / "run"):
        record = json.loads((run_dir / "ray.pid").read_text())
        started = psutil.Process(int(record["pid"]))
        found = [p for p in started.children(recursive=True) if "raylet/raylet" in command_of(p)]
        # A raylet starting a worker forks: until the child execs, it has the raylet's command
        # line too (a busy machine widens that moment). The raylet is the one whose parent
        # is not a raylet.
        (raylet,) = [p for p in found if p.ppid() not in {f.pid for f in found}]
        environ = raylet.environ()
        assert environ.get("RAY_raylet_client_connect_timeout_milliseconds") == "50", run_dir
        assert environ.get("RAY_raylet_client_num_connect_attempts") == "200", run_dir


NODE_LOOKUP = """
import json, sys
from ray._private import services, state
from clusterd.agent import ray_start
address = sys.argv[1]
real = state.GlobalState.node_table
asked = []
def not_yet_then_real(self):
    asked.append(1)
    return [] if len(asked) <= 3 else real(self)
table = state.GlobalState()
table._initialize_global_state(services._get_gcs_client_options(address))
ids = sorted(node["NodeID"] for node in real(table))
state.GlobalState.node_table = not_yet_then_real
found = ray_start._get_node(address, ids[0])
state.GlobalState.node_table = real
up = ray_start.wait_until_registered(address, 30)
nobody = ray_start.wait_until_registered(sys.argv[2], 0.3)
hosts = {host: ray_start._registered_at(table.node_table(), host)
         for host in ("127.0.0.2", "127.0.0.3", "127.0.0.4")}
print(json.dumps({"asked": len(asked), "nodes": len(ids), "port": found["node_manager_port"],
                  "up": up, "nobody": nobody, "hosts": hosts}))
"""


def test_a_starting_node_is_looked_up_again_at_once_until_it_registers(
        agent_cluster: AgentCluster) -> None:
    """ray_start's lookup of a node just started (Ray's own asks again only a second later)
    asks the GCS until the node is there, then answers as Ray's does, on the pinned Ray; the
    agent's and a worker's wait for the head's node sees it, and says when there is no GCS
    at all."""
    env = {**os.environ, **agent_cluster.agent_params["env"]}  # type: ignore[dict-item]
    done = subprocess.run([sys.executable, "-c", NODE_LOOKUP,
                           str(agent_cluster.agent_params["ray_address"]),
                           f"127.0.0.1:{helper('free-ports', {'count': 1})['ports'][0]}"],
                          capture_output=True, text=True, timeout=120, env=env, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    reply = json.loads(done.stdout.strip().splitlines()[-1])
    assert reply["asked"] == 4 and reply["nodes"] == 2 and reply["port"] > 0
    assert reply["up"] is True and reply["nobody"] is False
    # A worker's Ray, and the agent, go once the head's own node (not any node) is there.
    assert reply["hosts"] == {"127.0.0.2": True, "127.0.0.3": True, "127.0.0.4": False}


async def test_gang_runs_on_both_nodes_with_skypilot_env(agent: AgentClient) -> None:
    job, log = await run_to_end(agent, spec(
        setup="echo setup rank=$SKYPILOT_SETUP_NODE_RANK ips=$(echo $SKYPILOT_SETUP_NODE_IPS)",
        run="echo run rank=$SKYPILOT_NODE_RANK n=$SKYPILOT_NUM_NODES "
            "ips=$(echo $SKYPILOT_NODE_IPS) gpus=$SKYPILOT_NUM_GPUS_PER_NODE "
            "task=$SKYPILOT_TASK_ID greet=$GREETING secret=$TOKEN",
        envs={"GREETING": "hi"}, secrets_={"TOKEN": "s3cr3t"},
    ))
    assert job.status == JobStatus.SUCCEEDED, job.failure_reason
    text = log.decode()
    assert "(head, rank=0) setup rank=0 ips=127.0.0.2 127.0.0.3" in text
    assert "(worker1, rank=1) setup rank=1 ips=127.0.0.2 127.0.0.3" in text
    for rank in (0, 1):
        label = "(head, rank=0)" if rank == 0 else "(worker1, rank=1)"
        assert (f"{label} run rank={rank} n=2 ips=127.0.0.2 127.0.0.3 gpus=0 "
                f"task={job.task_id} greet=hi secret=s3cr3t") in text
    assert job.task_id.endswith(f"_two_{job.job_id}") and job.task_id.startswith("sky-")
    assert list(job.exit_codes) == [0, 0]
    # Secrets reach the job but are never written to the agent's database.
    db = Path(job.log_dir).parents[1] / "jobs.db"
    assert b"s3cr3t" not in db.read_bytes()


async def test_one_node_failing_kills_the_other(agent: AgentClient,
                                                agent_cluster: AgentCluster) -> None:
    marker = agent_cluster.path("fail-fast")
    job, _ = await run_to_end(agent, spec(
        f"if [ $SKYPILOT_NODE_RANK = 1 ]; then exit 3; fi; "
        f"sleep 300 & echo $! > {marker}; wait"
    ))
    assert job.status == JobStatus.FAILED
    assert "rank 1 (127.0.0.3) exited with exit code 3" in job.failure_reason
    assert job.exit_codes[1] == 3
    if marker.exists():  # rank 0 got as far as starting its child: that child must be dead
        assert not pid_alive(int(marker.read_text()))


async def test_segmentation_fault_is_named(agent: AgentClient) -> None:
    job, _ = await run_to_end(agent, spec(
        "if [ $SKYPILOT_NODE_RANK = 0 ]; then kill -SEGV $$; fi; sleep 300"
    ))
    assert job.status == JobStatus.FAILED
    assert "rank 0" in job.failure_reason
    assert "segmentation fault (exit code 139)" in job.failure_reason
    assert job.ended_at - job.started_at < 60  # the sleeping rank was killed, not waited for


async def test_setup_failure_names_every_failed_node(agent: AgentClient) -> None:
    job, log = await run_to_end(agent, spec(setup="echo setting; exit 7", run="echo never"))
    assert job.status == JobStatus.FAILED_SETUP
    assert "rank 0 (127.0.0.2) exited with exit code 7" in job.failure_reason
    assert "rank 1 (127.0.0.3) exited with exit code 7" in job.failure_reason
    assert b"never" not in log


async def test_cancel_kills_the_process_tree_on_every_node(
    agent: AgentClient, agent_cluster: AgentCluster
) -> None:
    base = agent_cluster.path("cancel")
    reply = await agent.add_job(spec(
        f"sleep 300 & echo $! > {base}-child-$SKYPILOT_NODE_RANK; "
        f"echo $$ > {base}-shell-$SKYPILOT_NODE_RANK; wait"
    ))
    pids = [int(await wait_file(Path(f"{base}-{kind}-{rank}")))
            for kind in ("child", "shell") for rank in (0, 1)]
    assert all(pid_alive(p) for p in pids)
    assert await agent.cancel([reply.job_id], False) == [reply.job_id]
    job = await wait_status(agent, reply.job_id, {JobStatus.CANCELLED}, timeout=30)
    assert job.failure_reason == "cancelled by user"
    with anyio.fail_after(10):
        while any(pid_alive(p) for p in pids):
            await anyio.sleep(0.05)


async def test_job_waits_pending_while_cpus_are_taken_then_runs_fifo(
    agent: AgentClient, agent_cluster: AgentCluster
) -> None:
    gate = agent_cluster.path("gate")
    big = await agent.add_job(spec(f"while [ ! -e {gate} ]; do sleep 0.05; done", cpus=2))
    await wait_status(agent, big.job_id, {JobStatus.RUNNING})
    first = await agent.add_job(spec("echo first", nodes=1, cpus=1))
    second = await agent.add_job(spec("echo second", nodes=1, cpus=1))
    for job_id in (first.job_id, second.job_id):
        (job,) = await agent.jobs([job_id])
        assert job.status == JobStatus.PENDING
    gate.touch()
    done_first = await wait_status(agent, first.job_id, {JobStatus.SUCCEEDED})
    done_second = await wait_status(agent, second.job_id, {JobStatus.SUCCEEDED})
    (done_big,) = await agent.jobs([big.job_id])
    assert done_big.status == JobStatus.SUCCEEDED
    assert done_first.started_at >= done_big.ended_at
    assert done_first.started_at <= done_second.started_at


async def test_infeasible_jobs_are_refused_with_the_reason(agent: AgentClient) -> None:
    from clusterctl.protocol import ErrorCode, ProtocolError

    with pytest.raises(ProtocolError) as too_many_nodes:
        await agent.add_job(spec("true", nodes=3))
    assert too_many_nodes.value.code == ErrorCode.RESOURCES_UNAVAILABLE
    assert "3 nodes; this cluster has 2" in too_many_nodes.value.message
    with pytest.raises(ProtocolError) as too_big:
        await agent.add_job(spec("true", nodes=1, cpus=4))
    assert "4 CPU" in too_big.value.message


async def test_a_container_image_that_is_no_image_reference_is_refused(
    agent: AgentClient,
) -> None:
    """The daemon's task loader refuses it first; the agent does not count on that."""
    before = len(await agent.queue())
    job = dataclasses.replace(spec("echo never", nodes=1),
                              container_image="--cidfile=/tmp/clusterd-never")
    with pytest.raises(ProtocolError) as refused:
        await agent.add_job(job)
    assert refused.value.code == ErrorCode.INVALID_TASK
    assert "container_image: '--cidfile=/tmp/clusterd-never' is not an image reference" in (
        refused.value.message)
    assert len(await agent.queue()) == before


async def test_tail_last_lines_and_resume_by_offset(agent: AgentClient) -> None:
    job, log = await run_to_end(agent, spec("for i in $(seq 1 100); do echo line $i; done",
                                            nodes=1))
    assert log.decode().splitlines() == [f"line {i}" for i in range(1, 101)]
    tail = b""
    async for message in agent.tail(job.job_id, follow=False, tail_lines=10, offset=0):
        tail += message.data
        if message.final:
            assert message.status == JobStatus.SUCCEEDED
    assert tail.decode().splitlines() == [f"line {i}" for i in range(91, 101)]
    middle = log.index(b"line 50\n")
    rest = b""
    async for message in agent.tail(job.job_id, follow=True, tail_lines=0, offset=middle):
        rest += message.data
    assert log[:middle] + rest == log


async def test_workdir_is_where_scripts_run(agent: AgentClient,
                                            agent_cluster: AgentCluster) -> None:
    workdir = agent_cluster.path("wd")
    job, log = await run_to_end(agent, spec("pwd", nodes=1, workdir=str(workdir)))
    assert job.status == JobStatus.SUCCEEDED
    assert log.decode().strip() == str(workdir)


def placement_groups(agent_cluster: AgentCluster) -> dict[str, str]:
    """Every placement group Ray has had on the cluster, name to state, UNPLACED for one
    withdrawn before Ray placed it (a driver of its own, in a process of its own, so this
    test process keeps no Ray state)."""
    env = {**os.environ, **agent_cluster.agent_params["env"]}  # type: ignore[dict-item]
    code = ("import json, logging, ray\n"
            f"ray.init(address={agent_cluster.agent_params['ray_address']!r},"
            " _node_ip_address='127.0.0.2', logging_level=logging.ERROR, log_to_driver=False)\n"
            "table = ray.util.placement_group_table()\n"
            "print(json.dumps({g['name']: g['state'] if any(g['bundles_to_node_id'].values())"
            " else 'UNPLACED' for g in table.values()}))\n")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=120, check=True)
    groups: dict[str, str] = json.loads(done.stdout.strip().splitlines()[-1])
    return groups


async def test_a_job_right_after_one_of_its_shape_takes_over_its_placement_group(
    agent: AgentClient, agent_cluster: AgentCluster
) -> None:
    # A shape no other test asks for, so the first job reserves a group of its own.
    first, _ = await run_to_end(agent, spec("true", cpus=0.3))
    second, log = await run_to_end(agent, spec("echo again", cpus=0.3))
    assert second.status == JobStatus.SUCCEEDED and log.count(b"again") == 2
    groups = placement_groups(agent_cluster)
    assert f"job-{first.job_id}" in groups
    assert f"job-{second.job_id}" not in groups  # never reserved: it ran in the first's
    # Parked only for a moment: then removed, holding nothing.
    wait_for(lambda: placement_groups(agent_cluster)[f"job-{first.job_id}"] == "REMOVED", 30,
             "the parked placement group to be removed", interval=0.5)
    # A job of another shape still gets a group of its own, and runs.
    other, _ = await run_to_end(agent, spec("true", cpus=0.4))
    assert other.status == JobStatus.SUCCEEDED
    assert f"job-{other.job_id}" in placement_groups(agent_cluster)


async def test_a_job_waiting_for_room_is_handed_the_group_of_one_of_its_shape_that_ends(
    agent: AgentClient, agent_cluster: AgentCluster
) -> None:
    gate = agent_cluster.path("handover-gate")
    # Two jobs take every CPU of both nodes; four more of their shape wait their turn.
    jobs = [await agent.add_job(spec(f"while [ ! -e {gate} ]; do sleep 0.05; done", cpus=1))
            for _ in range(2)]
    for job in jobs:
        await wait_status(agent, job.job_id, {JobStatus.RUNNING})
    jobs += [await agent.add_job(spec("true", cpus=1)) for _ in range(4)]
    gate.touch()
    for job in jobs:
        await wait_status(agent, job.job_id, {JobStatus.SUCCEEDED})
    groups = placement_groups(agent_cluster)
    # Only the first two were ever placed by Ray: each later job's request was withdrawn
    # when an earlier job's group came free (else each would wait for Ray's next pass).
    placed = [job.job_id for job in jobs if groups.get(f"job-{job.job_id}") not in
              (None, "UNPLACED")]
    assert placed == [jobs[0].job_id, jobs[1].job_id], groups


async def test_restarted_agent_fails_running_jobs_and_kills_them(
    agent_cluster: AgentCluster,
) -> None:
    child = agent_cluster.path("orphan")
    client = AgentClient("two", agent_cluster.endpoint, agent_cluster.token)
    try:
        reply = await client.add_job(spec(f"sleep 300 & echo $! > {child}; wait", nodes=1))
        pid = int(await wait_file(child))
    finally:
        await client.close()
    agent_pid = json.loads((agent_cluster.head_run / "agent.pid").read_text())["pid"]
    os.kill(agent_pid, signal.SIGKILL)
    wait_for(lambda: not pid_alive(agent_pid), 10, "the agent to die")
    # Started again by hand, with no token given: the helper uses the one it keeps on file.
    helper("start-agent", {**agent_cluster.agent_params, "token": None})
    client = AgentClient("two", agent_cluster.endpoint, agent_cluster.token)
    try:
        job = await wait_status(client, reply.job_id, {JobStatus.FAILED_DRIVER}, timeout=30)
        assert "agent restarted" in job.failure_reason
        with anyio.fail_after(15):
            while pid_alive(pid):
                await anyio.sleep(0.05)
        # The restarted agent still runs new jobs.
        job, log = await run_to_end(client, spec("echo alive", nodes=1))
        assert job.status == JobStatus.SUCCEEDED and log == b"alive\n"
    finally:
        await client.close()


# --------------------------------------------------------------------------------------------
# Who may call the agent


async def test_calls_without_the_daemons_credential_are_refused(
    agent: AgentClient, agent_cluster: AgentCluster
) -> None:
    before = len(await agent.queue())
    forged = daemon_credential(new_token(), new_nonce())
    channel = grpc.aio.insecure_channel(agent_cluster.endpoint)
    try:
        jobs = pb_grpc.JobsServiceStub(channel)
        never = job_spec_to_pb(spec("touch /tmp/never", nodes=1))
        for metadata in ((), ((AUTH_METADATA, forged),), ((AUTH_METADATA, "x.y.z"),)):
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await jobs.AddJob(pb.AddJobRequest(spec=never),
                                  metadata=metadata, timeout=10)
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                async for _ in jobs.TailLogs(pb.TailLogsRequest(job_id=1), metadata=metadata,
                                             timeout=10):
                    pass
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        health = pb_grpc.HealthServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await health.GetHealth(pb.GetHealthRequest(), timeout=10)
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    finally:
        await channel.close()
    assert len(await agent.queue()) == before


async def issued_credential(channel: grpc.aio.Channel, token: str) -> str:
    """A credential made as the daemon makes one: with the token, over a nonce the agent
    issued a moment ago."""
    reply = await pb_grpc.HealthServiceStub(channel).IssueNonces(
        pb.IssueNoncesRequest(count=1), timeout=10)
    (nonce,) = reply.nonces
    return daemon_credential(token, nonce)


async def queue_with(channel: grpc.aio.Channel, credential: str) -> grpc.StatusCode:
    """The status of one queue listing made with this credential."""
    try:
        await pb_grpc.JobsServiceStub(channel).GetJobQueue(
            pb.GetJobQueueRequest(), metadata=((AUTH_METADATA, credential),), timeout=10)
    except grpc.aio.AioRpcError as error:
        return error.code()
    return grpc.StatusCode.OK


async def test_a_credential_is_good_for_one_call_only(agent_cluster: AgentCluster) -> None:
    """Whoever sees a credential go by (say, in a core dump) cannot use it again."""
    async with grpc.aio.insecure_channel(agent_cluster.endpoint) as channel:
        credential = await issued_credential(channel, agent_cluster.token)
        assert await queue_with(channel, credential) == grpc.StatusCode.OK
        assert await queue_with(channel, credential) == grpc.StatusCode.UNAUTHENTICATED
        # Nor on another connection.
        async with grpc.aio.insecure_channel(agent_cluster.endpoint) as other:
            assert await queue_with(other, credential) == grpc.StatusCode.UNAUTHENTICATED


async def test_a_credential_over_a_nonce_the_agent_never_issued_is_refused(
    agent_cluster: AgentCluster,
) -> None:
    """Even made with the right token: a nonce the agent did not issue may be one a
    credential was captured over earlier (by an impostor at the socket, say)."""
    made_up = daemon_credential(agent_cluster.token, new_nonce())
    async with grpc.aio.insecure_channel(agent_cluster.endpoint) as channel:
        assert await queue_with(channel, made_up) == grpc.StatusCode.UNAUTHENTICATED


async def test_a_credential_over_an_expired_nonce_is_refused(agent_cluster: AgentCluster,
                                                             ) -> None:
    """A nonce is good for a short while only: here a second agent on the same Ray, told 1 s.
    The daemon's client, which keeps a few nonces at hand, goes on working across that."""
    run = agent_cluster.root / "brief" / "run"
    endpoint = f"unix:{agent_cluster.root}/s2/agent.sock"
    helper("start-agent", {**agent_cluster.agent_params, "dir": str(run), "listen": endpoint,
                      "state_dir": str(agent_cluster.root / "brief" / "agent"),
                      "nonce_ttl": 1.0})
    client = AgentClient("two", endpoint, agent_cluster.token)
    try:
        async with grpc.aio.insecure_channel(endpoint) as channel:
            stale = await issued_credential(channel, agent_cluster.token)
            await client.queue()
            await anyio.sleep(1.2)  # past the lifetime: nothing to wait for but the clock
            assert await queue_with(channel, stale) == grpc.StatusCode.UNAUTHENTICATED
            fresh = await issued_credential(channel, agent_cluster.token)
            assert await queue_with(channel, fresh) == grpc.StatusCode.OK
        await client.queue()
    finally:
        await client.close()
        helper("stop", {"dir": str(run), "parts": ["agent"]})


async def test_the_daemons_client_replaces_nonces_the_agent_dropped(
    agent: AgentClient, agent_cluster: AgentCluster,
) -> None:
    """The agent keeps a bounded number of nonces, forgetting the oldest (as a restarted agent
    forgets all): the client, refused, fetches fresh ones and makes the call once more."""
    await agent.queue()  # it now holds nonces for its next calls
    async with grpc.aio.insecure_channel(agent_cluster.endpoint) as channel:
        health = pb_grpc.HealthServiceStub(channel)
        for _ in range(MAX_NONCES_OUTSTANDING // MAX_NONCES_PER_CALL + 1):
            await health.IssueNonces(pb.IssueNoncesRequest(count=MAX_NONCES_PER_CALL),
                                     timeout=10)
    reply = await agent.add_job(spec("echo once", nodes=1))
    (job,) = await agent.jobs([reply.job_id])
    assert job.job_id == reply.job_id


async def test_a_client_with_the_wrong_token_learns_so_at_the_handshake(
    agent_cluster: AgentCluster,
) -> None:
    client = AgentClient("two", agent_cluster.endpoint, new_token())
    try:
        with pytest.raises(ProtocolError) as error:
            await client.queue()
        assert error.value.code == ErrorCode.AGENT_UNREACHABLE
        assert "cannot prove it holds the cluster's token" in error.value.message
    finally:
        await client.close()


async def test_an_impostor_at_the_socket_is_sent_nothing(agent_cluster: AgentCluster) -> None:
    """A process answering at the agent's socket path (say, a stale socket someone else
    took over) cannot prove the token: the daemon sends it no job and no secret."""
    received: list[object] = []

    class Impostor(pb_grpc.HealthServiceServicer, pb_grpc.JobsServiceServicer):  # type: ignore[misc]
        async def Handshake(self, request: pb.HandshakeRequest, context: object
                            ) -> pb.HandshakeResponse:
            received.append(request)
            return pb.HandshakeResponse(server_nonce=new_nonce(), proof=b"x" * 32,
                                        version=__version__, protocol=AGENT_PROTOCOL)

        async def AddJob(self, request: pb.AddJobRequest, context: object
                         ) -> pb.AddJobResponse:
            received.append(request)
            return pb.AddJobResponse(job_id=1)

    path = agent_cluster.root / "impostor.sock"
    server = grpc.aio.server()
    pb_grpc.add_HealthServiceServicer_to_server(Impostor(), server)
    pb_grpc.add_JobsServiceServicer_to_server(Impostor(), server)
    server.add_insecure_port(f"unix:{path}")
    await server.start()
    client = AgentClient("two", f"unix:{path}", agent_cluster.token)
    try:
        with pytest.raises(ProtocolError) as error:
            await client.add_job(spec("echo $TOKEN", nodes=1, secrets_={"TOKEN": "s3cr3t"}))
        assert error.value.code == ErrorCode.AGENT_UNREACHABLE
        assert [type(r).__name__ for r in received] == ["HandshakeRequest"]
        assert agent_cluster.token.encode() not in received[0].SerializeToString()
    finally:
        await client.close()
        await server.stop(None)


async def test_the_token_is_on_no_command_line(agent_cluster: AgentCluster) -> None:
    agent_pid = json.loads((agent_cluster.head_run / "agent.pid").read_text())["pid"]
    token = agent_cluster.token.encode()
    assert token not in Path(f"/proc/{agent_pid}/cmdline").read_bytes()
    assert token not in Path(f"/proc/{agent_pid}/environ").read_bytes()
    token_file = agent_cluster.head_run / "agent.token"
    assert token_file.read_bytes() == token
    assert token_file.stat().st_mode & 0o777 == 0o600
    socket_path = Path(agent_cluster.endpoint.removeprefix("unix:"))
    assert socket_path.stat().st_mode & 0o777 == 0o600
    assert socket_path.parent.stat().st_mode & 0o777 == 0o700


async def test_a_connection_broken_by_an_agent_restart_is_replaced(
    agent_cluster: AgentCluster,
) -> None:
    """After the agent went away for a moment, the old channel waits out gRPC's reconnect
    back-off, failing every call at once; the daemon takes a fresh one instead."""
    connections = AgentConnections()
    try:
        client = await connections.get("two", agent_cluster.endpoint, agent_cluster.token)
        agent_pid = json.loads((agent_cluster.head_run / "agent.pid").read_text())["pid"]
        os.kill(agent_pid, signal.SIGKILL)
        wait_for(lambda: not pid_alive(agent_pid), 10, "the agent to die")
        for _ in range(3):
            with pytest.raises(ProtocolError):
                await client.queue()
        helper("start-agent", {**agent_cluster.agent_params, "token": None})
        again = await connections.get("two", agent_cluster.endpoint, agent_cluster.token)
        # A fresh client, unless the old channel has got through its back-off and connected
        # again while the agent started (a slow machine): either way the call succeeds at
        # once, where a channel still in its back-off fails every call.
        assert again is not client or client.usable(agent_cluster.endpoint,
                                                    agent_cluster.token)
        with anyio.fail_after(10):
            await again.queue()
    finally:
        await connections.close_all()


async def test_a_stream_whose_channel_another_task_closes_ends_agent_unreachable(
    agent_cluster: AgentCluster, agent: AgentClient,
) -> None:
    """Closing a client (a reset after a failed health check, a client replaced) cancels
    its calls in flight, which gRPC reports with asyncio's CancelledError though nobody
    cancelled the task following the log. Let through, that would end the follower's task
    group silently, with neither a status nor an error (a managed job's driver then failed
    with KeyError 'end'); it must be AGENT_UNREACHABLE, which followers retry."""
    reply = await agent.add_job(spec("echo begun; sleep 60", nodes=1))
    follower = AgentClient("two", agent_cluster.endpoint, agent_cluster.token)
    began, outcome = anyio.Event(), []
    try:
        with anyio.fail_after(60):
            async with anyio.create_task_group() as group:
                async def follow() -> None:
                    try:
                        async for message in follower.tail(reply.job_id, follow=True,
                                                           tail_lines=0, offset=0):
                            if b"begun" in message.data:
                                began.set()
                        outcome.append("ended")
                    except ProtocolError as exc:
                        outcome.append(exc.code)

                group.start_soon(follow)
                await began.wait()
                await follower.close()
        assert outcome == [ErrorCode.AGENT_UNREACHABLE]
    finally:
        await follower.close()
        await agent.cancel([reply.job_id], False)
